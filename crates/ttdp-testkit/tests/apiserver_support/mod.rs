//! Shared fixtures for the API server tests: object builders, polling, and finding kubectl.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

/// Poll `check` every 20 ms until it returns Some, for at most `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "condition not reached within {secs}s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node named `name` with labels, Ready.
pub fn node(name: &str, labels: Value) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

/// A pod bound to `node` with labels.
pub fn pod(name: &str, node: &str, labels: Value) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox:1.36"}]}
    }))
    .unwrap()
}

/// The kubectl binary: `$TTDP_KUBECTL`, then `$HOME/.local/ttdp-tools/bin/kubectl`, then a
/// v1.35 `kubectl` on PATH. Panics with instructions when none is found: tests that need the
/// real kubectl fail rather than skip.
pub fn kubectl() -> PathBuf {
    if let Ok(p) = std::env::var("TTDP_KUBECTL") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "TTDP_KUBECTL={} does not exist; run .ci/kube-tools", p.display());
        return p;
    }
    if let Ok(home) = std::env::var("HOME") {
        let p = PathBuf::from(home).join(".local/ttdp-tools/bin/kubectl");
        if p.is_file() {
            return p;
        }
    }
    if let Ok(out) = std::process::Command::new("kubectl").args(["version", "--client"]).output()
        && String::from_utf8_lossy(&out.stdout).contains("v1.35")
    {
        return PathBuf::from("kubectl");
    }
    panic!(
        "kubectl v1.35 not found: run `bash .ci/kube-tools` (installs into $HOME/.local/ttdp-tools/bin) \
         or set TTDP_KUBECTL to a kubectl v1.35 binary"
    );
}
