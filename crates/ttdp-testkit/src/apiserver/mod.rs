//! An in-process imitation of a Kubernetes API server, kept for the demo when no control-plane
//! assets are at hand (every test runs on a real control plane).
//!
//! It listens on `127.0.0.1` (plain HTTP, any free port), writes a kubeconfig (context
//! `ttdp-test`) and serves the API subset ttdp uses with the real server's semantics: discovery
//! (including CRDs created through it), get/list/watch with selectors, resourceVersions and
//! pagination, create/update with optimistic concurrency, JSON merge / JSON / strategic merge
//! patches and server-side apply with managed fields, graceful deletion, finalizers, owner
//! reference garbage collection, the `status`, `eviction` and `binding` subresources, CRD schema
//! validation with defaults and CEL rules. Both kube-rs clients and the real `kubectl` work
//! against it.
//!
//! It is test infrastructure: it keeps everything in memory, has no authentication or
//! authorization, and must never be used by production code.
//!
//! # Fidelity
//!
//! Where behaviour is implemented it follows the real API server, including its `Status`
//! bodies and messages. Known approximations:
//! - Lists at an older revision (`resourceVersionMatch=Exact`, `continue` tokens) are rebuilt
//!   from the kept change history, so they answer 410 Expired once that history no longer
//!   reaches back (the real server keeps etcd's, compacted every 5 minutes); a list or watch
//!   at a revision the server does not have yet fails at once instead of after a wait.
//! - Server-side apply tracks ownership per leaf field with list-map/set semantics from the
//!   CRD schema or a table of the built-in fields kubectl and ttdp touch; other built-in lists
//!   are atomic. Built-in types are validated by decoding into k8s-openapi's types plus a few
//!   rules (pod spec immutability, required container fields), not full API validation.
//! - Only JSON bodies are decoded, plus protobuf for `Eviction`, `DeleteOptions`, `Namespace`,
//!   `ConfigMap` and `ServiceAccount` (what `kubectl drain` / `kubectl create` send); other
//!   protobuf bodies get 415. No OpenAPI schemas are served (`kubectl explain` fails).
//! - Controllers the real control plane runs are reduced to what tests need: garbage
//!   collection, namespace and CRD cleanup, the PodDisruptionBudget status (the disruption
//!   controller's rules, including controllers' scale for percentages), each namespace's
//!   `default` ServiceAccount and `kube-root-ca.crt` ConfigMap. Graceful pod deletion is left
//!   to the simulated kubelet. No scheduler, no DaemonSet/ReplicaSet controllers (see
//!   [`crate::sim`]). Admission does not refuse pods
//!   whose ServiceAccount does not exist yet, and new nodes get no `not-ready` taint
//!   (TaintNodesByCondition).
//! - [`TestApiServer::client`] turns kube's own retry of 429/503 off so callers see them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ttdp_testkit::apiserver::TestApiServer;
//! let server = TestApiServer::start().await?;
//! let client = server.client().await?;
//! println!("KUBECONFIG={}", server.kubeconfig_path().display());
//! # drop(client);
//! server.shutdown().await;
//! # Ok(()) }
//! ```

mod admission;
mod apply;
mod builtin_types;
mod catalog;
mod cluster;
mod discovery;
mod disruption;
mod events;
mod eviction;
mod field_set;
mod kubeconfig;
mod lifecycle;
mod list_keys;
mod managed_fields;
mod meta;
mod openapi;
mod owner_index;
mod patch;
mod protobuf;
mod routes;
mod schema_validation;
mod selectors;
mod status;
mod store;
mod table;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use cluster::ServerOptions;
pub use kubeconfig::CONTEXT as KUBECONFIG_CONTEXT;

/// Starting the server or building a client failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding 127.0.0.1 failed.
    #[error(
        "cannot listen on 127.0.0.1 for the test api server; check that loopback networking works"
    )]
    Bind(#[source] std::io::Error),
    /// Writing the kubeconfig failed.
    #[error(
        "cannot write the test api server kubeconfig into a temporary directory; check TMPDIR is writable"
    )]
    Kubeconfig(#[source] std::io::Error),
    /// The server URL did not parse (cannot happen for a bound socket address).
    #[error("test api server url {url} is not a valid uri")]
    Url {
        /// Server URL.
        url: String,
        /// The parse error.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// Building the kube client failed.
    #[error("cannot build a kube client for the test api server at {url}")]
    Client {
        /// Server URL.
        url: String,
        /// The kube error.
        #[source]
        source: kube::Error,
    },
}

/// Builder for [`TestApiServer`] with non-default [`ServerOptions`].
#[derive(Debug, Clone, Default)]
pub struct TestApiServerBuilder {
    options: ServerOptions,
}

impl TestApiServerBuilder {
    /// Start the server.
    pub async fn start(self) -> Result<TestApiServer, ServerError> {
        TestApiServer::start_with(self.options).await
    }
}

/// A running test API server. Dropping it stops serving (prefer [`TestApiServer::shutdown`]).
#[derive(Debug)]
pub struct TestApiServer {
    address: SocketAddr,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    app: routes::App,
    tasks: Vec<JoinHandle<()>>,
}

impl TestApiServer {
    /// Start a server with default options on a free port of 127.0.0.1.
    pub async fn start() -> Result<Self, ServerError> {
        Self::builder().start().await
    }

    /// A builder for non-default options.
    pub fn builder() -> TestApiServerBuilder {
        TestApiServerBuilder::default()
    }

    async fn start_with(options: ServerOptions) -> Result<Self, ServerError> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(ServerError::Bind)?;
        let address = listener.local_addr().map_err(ServerError::Bind)?;
        let dir = tempfile::Builder::new()
            .prefix("ttdp-apiserver-")
            .tempdir()
            .map_err(ServerError::Kubeconfig)?;
        let url = format!("http://{address}");
        let kubeconfig = kubeconfig::write(dir.path(), &url).map_err(ServerError::Kubeconfig)?;
        let stop = CancellationToken::new();
        let app = routes::App {
            cluster: cluster::Cluster::new(options),
            stop: stop.clone(),
            address: address.to_string(),
        };
        let router = routes::router(app.clone());
        let serve_stop = stop.clone();
        let server = tokio::spawn(async move {
            let shutdown = async move { serve_stop.cancelled().await };
            if let Err(e) = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(error = %e, "test api server stopped serving");
            }
        });
        let controllers = tokio::spawn(lifecycle::run(app.cluster.clone(), stop));
        tracing::debug!(%url, kubeconfig = %kubeconfig.display(), "test api server started");
        Ok(Self {
            address,
            dir,
            kubeconfig,
            app,
            tasks: vec![server, controllers],
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// The kubeconfig file (context `ttdp-test`, namespace `default`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The temporary directory holding the kubeconfig (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A kube client config for this server (default namespace `default`), with kube's
    /// defaults otherwise: note that kube 5 retries 429/503/504 answers itself, with exponential
    /// backoff for up to about five minutes, unless `default_retry` is turned off.
    pub fn config(&self) -> Result<kube::Config, ServerError> {
        let url = self.url();
        let uri: http::Uri = url.parse().map_err(|source| ServerError::Url {
            url: url.clone(),
            source,
        })?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        Ok(config)
    }

    /// A kube client for this server (default namespace `default`) with kube's built-in retry
    /// of 429/503/504 turned off, so a PodDisruptionBudget-blocked eviction or an injected
    /// fault reaches the caller at once (the real server sends its 429 for evictions without a
    /// `Retry-After`, and kube's default retry would hide it for minutes).
    pub async fn client(&self) -> Result<kube::Client, ServerError> {
        let mut config = self.config()?;
        config.default_retry = false;
        kube::Client::try_from(config).map_err(|source| ServerError::Client {
            url: self.url(),
            source,
        })
    }

    /// Stop serving: open watches end, the port is released.
    pub async fn shutdown(mut self) {
        self.app.stop.cancel();
        for task in self.tasks.drain(..) {
            // A task that panicked has nothing left to clean up.
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.app.stop.cancel();
    }
}
