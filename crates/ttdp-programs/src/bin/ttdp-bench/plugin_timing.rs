//! `kubectl tt driver` on the fleet benchmark's cluster: wall time of the real plugin binary
//! (connect, read the policies, Nodes, DaemonSets and Events, render) for `status`, `nodes` and
//! `describe`, median of a few runs.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::process::Command;

use crate::figures::{ms, spread};
use crate::fleet_setup::POLICY;

/// Runs each view `runs` times; returns `{view: {median_ms, max_ms, lines}}`.
pub async fn time_plugin(binary: &Path, kubeconfig: &Path, runs: usize) -> Result<Value> {
    let mut figures = json!({});
    for view in [&["status"][..], &["nodes", POLICY], &["describe", POLICY]] {
        let mut times = Vec::new();
        let mut lines = 0;
        for _ in 0..runs.max(1) {
            let started = Instant::now();
            let output = tokio::time::timeout(
                Duration::from_secs(120),
                Command::new(binary)
                    .arg(format!("--kubeconfig={}", kubeconfig.display()))
                    .args(view)
                    .env("NO_COLOR", "1")
                    .stdin(Stdio::null())
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .with_context(|| format!("kubectl tt driver {} took over 2 minutes", view.join(" ")))?
            .with_context(|| format!("cannot run {}", binary.display()))?;
            times.push(started.elapsed());
            if !output.status.success() {
                bail!(
                    "kubectl tt driver {} failed: {}",
                    view.join(" "),
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            lines = output.stdout.iter().filter(|b| **b == b'\n').count();
        }
        let s = spread(times);
        figures[view[0]] = json!({ "median_ms": ms(s.p50), "max_ms": ms(s.max), "lines": lines });
    }
    Ok(figures)
}
