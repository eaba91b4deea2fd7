//! Building a kube client the way kubectl picks its cluster: `--kubeconfig`, else `KUBECONFIG`
//! (a list of files, merged), else `~/.kube/config`, else the in-cluster service account; with
//! `--context`, `--cluster` and `--user` choosing inside the kubeconfig.

use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cli::ConnectionArgs;
use crate::error::Error;

/// A client and where it points.
#[derive(Clone)]
pub struct Connection {
    /// The client.
    pub client: Client,
    /// The API server URL, for error messages.
    pub server: String,
    /// `-n/--namespace`, when given.
    pub namespace: Option<String>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("server", &self.server)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Whether a kubeconfig is to be used: `KUBECONFIG` is set, or `~/.kube/config` exists. (Only
/// without either does kubectl fall back to the in-cluster service account.)
fn kubeconfig_present() -> bool {
    let env_set = std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty());
    let home_config = std::env::var_os("HOME")
        .map(|h| std::path::Path::new(&h).join(".kube").join("config"))
        .is_some_and(|p| p.is_file());
    env_set || home_config
}

/// The kube config the flags and environment select.
pub async fn config(args: &ConnectionArgs) -> Result<Config, Error> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        cluster: args.cluster.clone(),
        user: args.user.clone(),
    };
    let explicit = options.context.is_some() || options.cluster.is_some() || options.user.is_some();
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| Error::KubeconfigFile {
                    path: path.clone(),
                    source,
                })?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|source| Error::KubeconfigFile {
                    path: path.clone(),
                    source,
                })?
        }
        None if explicit || kubeconfig_present() => Config::from_kubeconfig(&options)
            .await
            .map_err(|source| Error::Kubeconfig { source })?,
        None => Config::incluster().map_err(|source| Error::NoConfiguration { source })?,
    };
    if let Some(timeout) = args.request_timeout.filter(|t| !t.is_zero()) {
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
    } else if config.connect_timeout.is_none() {
        config.connect_timeout = Some(Duration::from_secs(30));
    }
    Ok(config)
}

/// Connects (lazily: the first request dials) to the cluster the flags select.
pub async fn connect(args: &ConnectionArgs) -> Result<Connection, Error> {
    let config = config(args).await?;
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|source| Error::Client {
        server: server.clone(),
        source,
    })?;
    Ok(Connection {
        client,
        server,
        namespace: args.namespace.clone(),
    })
}
