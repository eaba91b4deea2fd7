//! The admin server: `/metrics` (Prometheus text format), `/healthz` (the process is serving)
//! and `/readyz`: ready once the replica can do its work, that is the initial watches of
//! policies, nodes and agent pods have synced or, with leader election, the replica stands by
//! for the Lease (it reaches the API server and takes over when the leader goes). A standby that
//! were not Ready would stall a rolling update: the new pod would wait for a Lease the old one
//! keeps, and the old one stays until the new one is Ready.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::error::Error;
use crate::runtime::process::metrics::Metrics;

/// What the replica is doing, for `/readyz` (shared with the server).
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicU8>);

const STARTING: u8 = 0;
const STANDING_BY: u8 = 1;
const SYNCING: u8 = 2;
const SYNCED: u8 = 3;

impl Readiness {
    /// Marks the initial watches synced (ready) or the controller stopped (not ready).
    pub fn set(&self, ready: bool) {
        self.0
            .store(if ready { SYNCED } else { STARTING }, Ordering::SeqCst);
    }

    /// Marks the replica waiting for the leader Lease: ready, since it can take over.
    pub fn standing_by(&self) {
        self.0.store(STANDING_BY, Ordering::SeqCst);
    }

    /// Marks the replica leading, its watches not synced yet: still ready if it stood by, so
    /// that a hand-over does not make the Deployment unavailable for a moment.
    pub fn leading(&self) {
        let _ = (self.0).compare_exchange(STARTING, SYNCING, Ordering::SeqCst, Ordering::SeqCst);
        let _ = (self.0).compare_exchange(STANDING_BY, SYNCED, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Whether the replica is ready: synced, or standing by for the Lease.
    pub fn get(&self) -> bool {
        matches!(self.0.load(Ordering::SeqCst), STANDING_BY | SYNCED)
    }

    /// Whether the replica is standing by for the Lease (another replica leads).
    pub fn is_standing_by(&self) -> bool {
        self.0.load(Ordering::SeqCst) == STANDING_BY
    }
}

#[derive(Clone)]
struct AdminState {
    metrics: Arc<Metrics>,
    ready: Readiness,
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<AdminState>) -> (StatusCode, &'static str) {
    if s.ready.is_standing_by() {
        (StatusCode::OK, "ready: standing by for the leader lease")
    } else if s.ready.get() {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for the initial watches (or for the API server, to stand by for the leader lease)",
        )
    }
}

/// The admin routes.
pub fn router(metrics_registry: Arc<Metrics>, ready: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AdminState {
            metrics: metrics_registry,
            ready,
        })
}

/// Binds `address` and serves the admin routes until `shutdown` is cancelled. Returns the bound
/// address (useful with port 0) and the server task.
pub async fn serve(
    address: SocketAddr,
    metrics_registry: Arc<Metrics>,
    ready: Readiness,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| Error::Serve {
            address: address.to_string(),
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| Error::Serve {
        address: address.to_string(),
        source,
    })?;
    info!(address = %bound, "serving /metrics, /healthz and /readyz");
    let app = router(metrics_registry, ready);
    let task = tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(err) = result {
            tracing::error!(error = %err, "admin server stopped");
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(address: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn ready_only_after_sync_and_metrics_are_served() {
        let metrics = Metrics::shared();
        metrics.record_reconcile(std::time::Duration::from_millis(5), None);
        let ready = Readiness::default();
        let shutdown = CancellationToken::new();
        let (address, task) = serve(
            "127.0.0.1:0".parse().unwrap(),
            metrics,
            ready.clone(),
            shutdown.clone(),
        )
        .await
        .unwrap();
        assert!(get(address, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(address, "/readyz").await.starts_with("HTTP/1.1 503"));
        ready.set(true);
        assert!(get(address, "/readyz").await.starts_with("HTTP/1.1 200"));
        ready.set(false);
        assert!(get(address, "/readyz").await.starts_with("HTTP/1.1 503"));
        let body = get(address, "/metrics").await;
        assert!(
            body.contains("ttdp_reconciles_total{result=\"ok\"} 1"),
            "{body}"
        );
        shutdown.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_standby_is_ready_and_stays_ready_through_its_take_over() {
        let ready = Readiness::default();
        assert!(!ready.get(), "not ready before it reaches the API server");
        ready.standing_by();
        assert!(ready.get() && ready.is_standing_by());
        ready.leading();
        assert!(
            ready.get() && !ready.is_standing_by(),
            "ready while it syncs"
        );
        ready.set(true);
        assert!(ready.get());
    }

    #[test]
    fn a_replica_leading_from_the_start_is_ready_only_once_synced() {
        let ready = Readiness::default();
        ready.leading();
        assert!(!ready.get() && !ready.is_standing_by());
        ready.set(true);
        assert!(ready.get());
    }
}
