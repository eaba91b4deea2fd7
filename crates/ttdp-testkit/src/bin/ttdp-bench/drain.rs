//! Drain: the `ttdp-drain` example program (`crates/ttdp-drain/examples/drain.rs`, the library
//! behind a kubectl-like command line) side by side with the real `kubectl drain` on identical
//! nodes of one test API server, in the same run: wall time and API requests for 10, 100 and 500
//! pods, and the eviction retry rate while a PodDisruptionBudget blocks.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use tokio::process::Command;
use ttdp_testkit::apiserver::TestApiServer;

use crate::bench_client::{bench_client, is_bench, reads_and_writes};
use crate::drain_fleet;
use crate::result_line::{self, ms};

/// How long the blocked drains run before their timeout.
const BLOCKED_FOR: Duration = Duration::from_secs(12);

/// Flags of `ttdp-bench drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The ttdp-drain example binary (`cargo build --release -p ttdp-drain --example drain`).
    #[arg(long)]
    pub ttdp_drain: PathBuf,
    /// The kubectl binary (v1.35, from `bash .ci/kube-tools`).
    #[arg(long)]
    pub kubectl: PathBuf,
    /// Pods per drained node, one run each.
    #[arg(long, value_delimiter = ',', default_value = "10,100,500")]
    pub pods: Vec<usize>,
}

/// One drain's figures.
struct Run {
    wall: Duration,
    success: bool,
    reads: usize,
    writes: usize,
    evictions: usize,
    output: String,
}

impl Run {
    fn json(&self) -> Value {
        json!({ "wall_ms": ms(self.wall), "ok": self.success, "reads": self.reads, "writes": self.writes, "evictions": self.evictions })
    }
}

#[derive(Clone, Copy)]
enum Tool {
    Kubectl,
    Ttdp,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Kubectl => "kubectl",
            Tool::Ttdp => "ttdp",
        }
    }
}

/// Runs the suite and prints its result line.
pub async fn run(args: &DrainArgs) -> Result<()> {
    for binary in [&args.kubectl, &args.ttdp_drain] {
        if !binary.is_file() {
            bail!(
                "{} not found (kubectl: bash .ci/kube-tools; ttdp-drain: cargo build --release -p ttdp-drain --example drain)",
                binary.display()
            );
        }
    }
    let server = TestApiServer::builder()
        .watch_history(100_000)
        .start()
        .await?;
    let client = bench_client(&server, "setup")?;
    let mut sizes = Vec::new();
    for &pods in &args.pods {
        eprintln!("drain: {pods} pods per node");
        let mut row = json!({ "pods": pods });
        for tool in [Tool::Kubectl, Tool::Ttdp] {
            let node = format!("{}-{pods}", tool.name());
            drain_fleet::populate(&client, &node, pods).await?;
            let run = drain(
                args,
                &server,
                tool,
                &node,
                &[
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    "--force",
                    "--timeout=300s",
                ],
            )
            .await?;
            let left = drain_fleet::pods_left(&client, &node).await?;
            if !run.success {
                bail!("{} drain of {node} failed:\n{}", tool.name(), run.output);
            }
            row[tool.name()] = run.json();
            row[tool.name()]["pods_left"] = json!(left);
        }
        row["wall_ratio_ttdp_over_kubectl"] = json!(ratio(&row, "wall_ms"));
        row["requests_ratio_ttdp_over_kubectl"] = json!(requests_ratio(&row));
        sizes.push(row);
    }
    eprintln!(
        "drain: blocked by a PodDisruptionBudget for {} s",
        BLOCKED_FOR.as_secs()
    );
    let mut blocked = json!({ "seconds": BLOCKED_FOR.as_secs() });
    for tool in [Tool::Kubectl, Tool::Ttdp] {
        let node = format!("blocked-{}", tool.name());
        drain_fleet::populate_blocked(&client, &node).await?;
        let timeout = format!("--timeout={}s", BLOCKED_FOR.as_secs());
        let run = drain(
            args,
            &server,
            tool,
            &node,
            &["--ignore-daemonsets", "--delete-emptydir-data", &timeout],
        )
        .await?;
        let secs = run.wall.as_secs_f64().max(0.001);
        blocked[tool.name()] = json!({
            "wall_ms": ms(run.wall), "gave_up": !run.success, "evictions": run.evictions,
            "evictions_per_s": run.evictions as f64 / secs,
            "requests_per_s": (run.reads + run.writes) as f64 / secs,
        });
    }
    server.shutdown().await;
    result_line::print(&json!({ "suite": "drain", "sizes": sizes, "pdb_blocked": blocked }));
    Ok(())
}

fn ratio(row: &Value, field: &str) -> f64 {
    let k = row["kubectl"][field].as_f64().unwrap_or(0.0);
    let t = row["ttdp"][field].as_f64().unwrap_or(0.0);
    if k == 0.0 { 0.0 } else { t / k }
}

fn requests_ratio(row: &Value) -> f64 {
    let total = |tool: &str| {
        row[tool]["reads"].as_f64().unwrap_or(0.0) + row[tool]["writes"].as_f64().unwrap_or(0.0)
    };
    if total("kubectl") == 0.0 {
        0.0
    } else {
        total("ttdp") / total("kubectl")
    }
}

async fn drain(
    args: &DrainArgs,
    server: &TestApiServer,
    tool: Tool,
    node: &str,
    flags: &[&str],
) -> Result<Run> {
    let binary: &Path = match tool {
        Tool::Kubectl => &args.kubectl,
        Tool::Ttdp => &args.ttdp_drain,
    };
    let mut command = Command::new(binary);
    if matches!(tool, Tool::Kubectl) {
        command.arg("drain");
    }
    command
        .arg(node)
        .arg(format!(
            "--kubeconfig={}",
            server.kubeconfig_path().display()
        ))
        .args(flags)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    server.recorder().clear();
    let started = Instant::now();
    let output = tokio::time::timeout(Duration::from_secs(600), command.output())
        .await
        .with_context(|| {
            format!(
                "{} drain of {node} did not finish in 10 minutes",
                tool.name()
            )
        })?
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let wall = started.elapsed();
    let requests = server.recorder().filter(|r| !is_bench(r));
    let (reads, writes) = reads_and_writes(&requests);
    let evictions = requests
        .iter()
        .filter(|r| r.subresource == "eviction" && r.is_write())
        .count();
    Ok(Run {
        wall,
        success: output.status.success(),
        reads,
        writes,
        evictions,
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}
