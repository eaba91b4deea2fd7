//! An in-process imitation of a Kubernetes API server, kept only for the demo when no
//! control-plane assets are at hand (every test runs on a real control plane). It serves what
//! the demo's programs use, and little more.
//!
//! It listens on `127.0.0.1` (plain HTTP, any free port), writes a kubeconfig (context
//! `ttdp-test`) and serves, in JSON only:
//! - discovery (`/api`, `/apis`, per group-version lists, CRDs as soon as they are created),
//!   not aggregated discovery and no OpenAPI (`kubectl apply` needs `--validate=false`);
//! - get, list and watch with `key=value` label and field selectors (no watch bookmarks);
//!   lists are whole (`limit` is ignored, as a server may) and at the latest revision, and a
//!   watch resumes from a `resourceVersion` in the last 10,000 changes (410 Gone before);
//! - create (with `generateName`), delete with preconditions, finalizers and a pod's grace
//!   period (left to the simulated kubelet);
//! - JSON patches, JSON merge patches (with optimistic concurrency on a `resourceVersion`),
//!   and server-side apply as "create, or JSON-merge into the stored object": no managed
//!   fields, no conflicts, and a field its manager stops applying stays;
//! - the `status` subresource, and the pod `eviction` subresource checked against
//!   PodDisruptionBudgets (`maxUnavailable` over `matchLabels` only), whose status (without
//!   conditions) a built-in disruption controller keeps.
//!
//! What the demo's programs never send is refused with an error saying the imitation does not
//! support it, never answered wrongly: PUT, strategic merge patches and protobuf (415), other
//! selector operators, `dryRun`, `continue` and `sendInitialEvents`. It does not validate or
//! default objects (no CRD schemas, no CEL, no built-in defaults), render kubectl's `Table`s
//! (a plain `kubectl get` gets JSON and prints a default listing), collect garbage by owner
//! references, clean up deleted namespaces, serve `deletecollection`, `/version` or
//! `/apis/<group>`, show an Event through both `v1` and `events.k8s.io/v1` (they are stored
//! apart, and ttdp writes only the latter: `kubectl get events.events.k8s.io`), or run any
//! controller but the disruption controller (see [`crate::sim`] for the DaemonSet stand-in).
//!
//! It is test infrastructure: it keeps everything in memory, has no authentication or
//! authorization, and must never be used by production code.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ttdp_testkit::apiserver::TestApiServer;
//! let server = TestApiServer::start().await?;
//! println!("KUBECONFIG={}", server.kubeconfig_path().display());
//! server.shutdown().await;
//! # Ok(()) }
//! ```

mod catalog;
mod cluster;
mod discovery;
mod disruption;
mod eviction;
mod meta;
mod patch;
mod routes;
mod selectors;
pub(crate) mod status;
mod store;
mod watch;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::launcher::pki::plain_http_kubeconfig;

/// A running imitation API server. Dropping it stops serving (prefer
/// [`TestApiServer::shutdown`]).
#[derive(Debug)]
pub struct TestApiServer {
    /// Removed on drop.
    kubeconfig: tempfile::NamedTempFile,
    app: routes::App,
    tasks: Vec<JoinHandle<()>>,
}

impl TestApiServer {
    /// Start a server on a free port of 127.0.0.1.
    pub async fn start() -> Result<Self> {
        let bind = "cannot listen on 127.0.0.1: check that loopback networking works";
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .context(bind)?;
        let address = listener.local_addr().context(bind)?;
        let url = format!("http://{address}");
        let write = "cannot write the imitation's kubeconfig: check that TMPDIR is writable";
        let kubeconfig = plain_http_kubeconfig(&url).context(write)?;
        let stop = CancellationToken::new();
        let app = routes::App {
            cluster: cluster::Cluster::default(),
            stop: stop.clone(),
            address: address.to_string(),
        };
        let router = routes::router(app.clone());
        let serve =
            axum::serve(listener, router).with_graceful_shutdown(stop.clone().cancelled_owned());
        let server = tokio::spawn(async move {
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "test api server stopped serving");
            }
        });
        let controllers = tokio::spawn(disruption::run(app.cluster.clone(), stop));
        tracing::debug!(%url, kubeconfig = ?kubeconfig.path(), "test api server started");
        Ok(Self {
            kubeconfig,
            app,
            tasks: vec![server, controllers],
        })
    }

    /// The kubeconfig file (context `ttdp-test`, namespace `default`).
    pub fn kubeconfig_path(&self) -> &Path {
        self.kubeconfig.path()
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
