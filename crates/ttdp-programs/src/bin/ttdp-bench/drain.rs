//! Drain: the `ttdp-drain` example program (`crates/ttdp-drain/examples/drain.rs`, the library
//! behind a kubectl-like command line) side by side with the real `kubectl drain`, on identical
//! nodes of a real control plane started for the run, in the same run: wall time and API
//! requests (counted from the API server's audit log, with nothing between the drain and the
//! server) for 10, 100 and 500 pods of mixed owners, among them a Deployment under a
//! PodDisruptionBudget whose replacements turn Ready 2 s after they start
//! ([`crate::drain_fleet`]); the pods each tool removed, compared; whether the budget ever fell
//! below its minimum while a drain ran; and the eviction retry rate while a budget blocks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use futures::StreamExt;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::process::Command;
use tokio::task::JoinHandle;
use ttdp_testkit::cluster_setup;
use ttdp_testkit::launcher::audit::AuditLog;
use ttdp_testkit::sim::cluster::client_for;

use crate::drain_fleet::{self, DrainNode};
use crate::figures::{ms, print_result};

/// How long the blocked drains run before their timeout.
const BLOCKED_FOR: Duration = Duration::from_secs(12);
/// The two drains compared, by the name the result line gives them.
const TOOLS: [&str; 2] = ["kubectl", "ttdp"];
/// The namespace of the workloads and the prefix of the nodes.
const PREFIX: &str = "bench";
/// How long the API server may take to record the requests of a drain that has ended (a watch
/// is recorded when it ends).
const AUDIT_SETTLE: Duration = Duration::from_secs(1);

/// Flags of `ttdp-bench drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The ttdp-drain example binary (`cargo build --profile benchmark -p ttdp-drain --example drain`).
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

/// Watches the budget `name` until the task is aborted, keeping the lowest
/// `currentHealthy - desiredHealthy` its status showed: below 0, the budget was violated.
fn watch_budget(client: &Client, namespace: &str, name: &str) -> (Arc<AtomicI64>, JoinHandle<()>) {
    let lowest = Arc::new(AtomicI64::new(i64::MAX));
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let seen = lowest.clone();
    let task = tokio::spawn(async move {
        let mut budgets = watcher(api, config).applied_objects().boxed();
        while let Some(budget) = budgets.next().await {
            if let Ok(Some(s)) = budget.map(|b| b.status) {
                let headroom = i64::from(s.current_healthy) - i64::from(s.desired_healthy);
                seen.fetch_min(headroom, Ordering::Relaxed);
            }
        }
    });
    (lowest, task)
}

/// Runs the suite and prints its result line.
pub async fn run(args: &DrainArgs) -> Result<()> {
    for binary in [&args.kubectl, &args.ttdp_drain] {
        if !binary.is_file() {
            bail!(
                "{} not found (kubectl: bash .ci/kube-tools; ttdp-drain: cargo build --profile benchmark -p ttdp-drain --example drain)",
                binary.display()
            );
        }
    }
    let plane = crate::control_plane(&Default::default())?;
    let client = client_for(plane.kubeconfig()).await?;
    // Its `default` ServiceAccount too: pods cannot be created before it exists.
    cluster_setup::apply_namespace(&client, PREFIX).await?;
    cluster_setup::apply_service_account(&client, PREFIX, "default").await?;
    let mut audit = plane.audit_log();
    let kubeconfig = plane.audited_kubeconfig();
    let mut sizes = Vec::new();
    for &pods in &args.pods {
        eprintln!("drain: {pods} pods per node");
        let mut row = json!({ "pods": pods });
        let (mut removed, mut walls, mut requests) = (Vec::new(), Vec::new(), Vec::new());
        for tool in TOOLS {
            let group = format!("{tool}-{pods}");
            let node = DrainNode::populate(&client, PREFIX, &group, pods).await?;
            let before = drain_fleet::roles_on(&client, &node.node).await?;
            let (floor, watch) = watch_budget(&client, &node.namespace, &node.budget);
            let run = drain(
                args,
                kubeconfig,
                &mut audit,
                tool,
                &node.node,
                &[
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    "--force",
                    "--timeout=300s",
                ],
            )
            .await?;
            watch.abort();
            let lowest = floor.load(Ordering::Relaxed);
            let after = drain_fleet::roles_on(&client, &node.node).await?;
            node.shutdown().await;
            if !run.success {
                bail!("{tool} drain of {group} failed:\n{}", run.output);
            }
            let gone: BTreeMap<String, usize> = before
                .iter()
                .map(|(role, n)| (role.clone(), n - after.get(role).copied().unwrap_or(0)))
                .filter(|(_, n)| *n > 0)
                .collect();
            eprintln!(
                "  {tool}: {:.1} s, removed {gone:?}, budget headroom never below {lowest}",
                run.wall.as_secs_f64()
            );
            row[tool] = json!({
                "wall_ms": ms(run.wall), "ok": run.success, "reads": run.reads, "writes": run.writes,
                "evictions": run.evictions, "pods_left": after.values().sum::<usize>(),
                "removed_by_owner": gone, "budget_lowest_headroom": lowest, "budget_violated": lowest < 0,
            });
            removed.push(gone);
            walls.push(ms(run.wall));
            requests.push((run.reads + run.writes) as f64);
        }
        let same = removed.windows(2).all(|w| w[0] == w[1]);
        let (wall_ratio, requests_ratio) = (ratio(&walls), ratio(&requests));
        row["same_removed_set"] = json!(same);
        row["wall_ratio_ttdp_over_kubectl"] = json!(wall_ratio);
        row["requests_ratio_ttdp_over_kubectl"] = json!(requests_ratio);
        eprintln!(
            "drain: {pods} pods: ttdp/kubectl wall {wall_ratio:.3}, requests {requests_ratio:.3}, same pods removed: {same}"
        );
        sizes.push(row);
    }
    eprintln!(
        "drain: blocked by a PodDisruptionBudget for {} s",
        BLOCKED_FOR.as_secs()
    );
    let mut blocked = json!({ "seconds": BLOCKED_FOR.as_secs() });
    for tool in TOOLS {
        let group = format!("blocked-{tool}");
        let node = drain_fleet::populate_blocked(&client, PREFIX, &group).await?;
        let timeout = format!("--timeout={}s", BLOCKED_FOR.as_secs());
        let run = drain(
            args,
            kubeconfig,
            &mut audit,
            tool,
            &node.node,
            &["--ignore-daemonsets", "--delete-emptydir-data", &timeout],
        )
        .await?;
        node.shutdown().await;
        let secs = run.wall.as_secs_f64().max(0.001);
        blocked[tool] = json!({
            "wall_ms": ms(run.wall), "gave_up": !run.success, "evictions": run.evictions,
            "evictions_per_s": run.evictions as f64 / secs,
            "requests_per_s": (run.reads + run.writes) as f64 / secs,
        });
    }
    print_result(&json!({
        "suite": "drain", "server": "real control plane",
        "sizes": sizes, "pdb_blocked": blocked,
    }));
    Ok(())
}

/// ttdp's figure over kubectl's, in the order of [`TOOLS`]; 0 when kubectl's is 0.
fn ratio(figures: &[f64]) -> f64 {
    if figures[0] == 0.0 {
        0.0
    } else {
        figures[1] / figures[0]
    }
}

/// Runs `tool` (`kubectl drain` or the ttdp-drain example) on `node` as the identity of
/// `kubeconfig`, whose requests the API server records in `audit`.
async fn drain(
    args: &DrainArgs,
    kubeconfig: &Path,
    audit: &mut AuditLog,
    tool: &str,
    node: &str,
    flags: &[&str],
) -> Result<Run> {
    let (binary, subcommand): (&Path, &[&str]) = match tool {
        "kubectl" => (&args.kubectl, &["drain"]),
        _ => (&args.ttdp_drain, &[]),
    };
    let mut command = Command::new(binary);
    command
        .args(subcommand)
        .arg(node)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(flags)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    audit.take().context("cannot read the audit log")?;
    let started = Instant::now();
    let output = tokio::time::timeout(Duration::from_secs(600), command.output())
        .await
        .with_context(|| format!("{tool} drain of {node} did not finish in 10 minutes"))?
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let wall = started.elapsed();
    tokio::time::sleep(AUDIT_SETTLE).await;
    // Only the drain runs as the audited identity; the benchmark's own clients do not.
    let requests = audit.take().context("cannot read the audit log")?;
    let writes = requests.iter().filter(|r| r.is_write()).count();
    let reads = requests.len() - writes;
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
