//! The admin server: `/metrics` (Prometheus text format), `/healthz` (the process is serving)
//! and `/readyz` (the initial watches of policies, nodes and agent pods have synced and, with
//! leader election, this replica leads).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Whether the controller is ready (shared with the server).
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the controller ready or not.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// Whether the controller is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
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
    if s.ready.get() {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for the initial watches or the leader lease",
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
}
