//! The controller at fleet scale: `n` Tenstorrent nodes (plus `n` plain ones), the real
//! `ttdp-controller` binary and the agent stand-in, on a real control plane started for the run
//! (from the assets the test suites use; missing assets are an error, never a fallback). The
//! fleet is installed at tt-kmd `from`, settles, then rolls out to `to`.
//!
//! Three watches see the rollout from outside the controller: a node watch (when each node is
//! really cordoned, granted and released), a policy watch (what the status says, and how large
//! each write is) and the agent stand-in (when each agent is Ready). The API server's audit log
//! gives its own time for each of the controller's node writes. [`crate::fleet_figures`] turns
//! them into the figures.
//!
//! The real DaemonSet controller creates the agent pods and the real scheduler binds them. No
//! kubelet runs: the benchmark creates the Node objects Ready, and renews no Lease. The
//! controller runs as an identity of its own, whose requests the API server records in its
//! audit log ([`ttdp_testkit::launcher::audit`]); that is how they are counted, with nothing
//! between the controller and the server (a counting proxy, one more hop in the busy benchmark
//! process, doubled the hand-off time at 100 nodes).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use ttdp_programs::rollout_watch::{is_rolled_out, status_bytes};
use ttdp_programs::{ControllerProcess, Memory, log_dir};
use ttdp_testkit::cluster_setup::{create_operator_namespace, install_crd, set_policy_version};
use ttdp_testkit::launcher::audit::AuditLog;
use ttdp_testkit::launcher::{ControlPlane, ControlPlaneOptions};
use ttdp_testkit::sim::cluster::client_for;

use crate::agent_stand_in::AgentStandIn;
use crate::audit_times::{audit_log_path, log_end, read_from, server_times};
use crate::figures::print_result;
use crate::fleet_figures::{Observed, timing_figures};
use crate::fleet_setup::{self, POLICY};
use crate::handoff_path::WallClock;
use crate::node_watch::NodeWatch;
use crate::server_mix::ServerCounts;
use crate::status_watch::StatusWatch;

/// The installed version and the one rolled out.
/// Overrides the controller's log filter (`info`) in the fleet benchmark.
const CONTROLLER_LOG_ENV: &str = "TTDP_BENCH_CONTROLLER_LOG";
const FROM: &str = "2.0.0";
const TO: &str = "2.1.0";
/// How long the fleet is left alone before steady-state figures are taken.
const SETTLE: Duration = Duration::from_secs(3);
/// How long idle requests are counted at steady state.
const IDLE_WINDOW: Duration = Duration::from_secs(5);
/// How often memory and requests are sampled during the rollout.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How results name the server.
const SERVER_LABEL: &str = "real control plane";
/// Runs of each plugin view.
const PLUGIN_RUNS: usize = 3;

/// Flags of `ttdp-bench fleet`.
#[derive(Debug, Args)]
pub struct FleetArgs {
    /// The ttdp-controller binary (a release build).
    #[arg(long)]
    pub controller: PathBuf,
    /// Tenstorrent nodes (as many plain nodes are added).
    #[arg(long)]
    pub nodes: usize,
    /// The policy's maxUnavailable.
    #[arg(long, default_value_t = 1)]
    pub max_unavailable: usize,
    /// The simulated agent's work time per node, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub work_ms: u64,
    /// Give up on the install or the rollout after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_seconds: u64,
    /// The kubectl-tt-driver binary: when given, its views are timed on the rolled-out fleet.
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Where the controller's log goes (default: a temporary directory).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
}

/// Requests by verb and resource (`get nodes`, `patch pods/status`), reads (get, list,
/// discovery) apart from writes, tallied without keeping their bodies (a 5,000-node rollout
/// writes gigabytes of status otherwise).
#[derive(Debug, Default)]
struct Tally {
    reads: BTreeMap<String, usize>,
    writes: BTreeMap<String, usize>,
}

impl Tally {
    /// Counts the controller's requests answered since the last call. Watches are left out: the
    /// audit log records one when it ends.
    fn drain(&mut self, audit: &mut AuditLog) -> Result<()> {
        let requests = audit
            .take()
            .context("cannot read the API server's audit log")?;
        for r in requests.iter().filter(|r| r.verb != "watch") {
            let by_kind = if r.is_write() {
                &mut self.writes
            } else {
                &mut self.reads
            };
            let sub = if r.subresource.is_empty() { "" } else { "/" };
            *by_kind
                .entry(format!("{} {}{sub}{}", r.verb, r.resource, r.subresource))
                .or_default() += 1;
        }
        Ok(())
    }

    fn reads_and_writes(&self) -> (usize, usize) {
        (self.reads.values().sum(), self.writes.values().sum())
    }
}

/// What runs during one fleet benchmark. Fields drop in order: the control plane goes last,
/// after what talks to it.
struct Bench {
    agents: AgentStandIn,
    watch: StatusWatch,
    nodes: NodeWatch,
    controller: ControllerProcess,
    log_file: PathBuf,
    /// The controller's requests.
    audit: AuditLog,
    plane: ControlPlane,
}

/// Figures of the steady state before the rollout.
struct Steady {
    adopt: Duration,
    memory: Memory,
    idle: Tally,
    status_bytes: usize,
}

/// Runs the suite and prints its result line.
pub async fn run(args: &FleetArgs) -> Result<()> {
    let n = args.nodes;
    let timeout = Duration::from_secs(args.timeout_seconds);
    let mut bench = start(args).await?;
    let setup = client_for(bench.plane.kubeconfig()).await?;
    let mut tally = Tally::default();
    let started = Instant::now();
    fleet_setup::create_policy(&setup, FROM, args.max_unavailable.max(1)).await?;
    let installed = match wait_sampling(&mut bench, &mut tally, n, FROM, started + timeout).await {
        Ok(w) => w,
        Err(e) => return Err(give_up(args, "adopt", started, &bench, e).await),
    };
    let adopt = installed.done.duration_since(started);
    eprintln!(
        "fleet {n}: adopted at {FROM} in {:.1} s",
        adopt.as_secs_f64()
    );
    tokio::time::sleep(SETTLE).await;
    tally.drain(&mut bench.audit)?;
    let mut idle = Tally::default();
    tokio::time::sleep(IDLE_WINDOW).await;
    idle.drain(&mut bench.audit)?;
    let steady = Steady {
        adopt,
        memory: bench.controller.memory()?,
        idle,
        status_bytes: bench.watch.policy().map_or(0, |p| status_bytes(&p)),
    };
    eprintln!(
        "fleet {n}: steady state {:.1} MiB resident; rolling out {TO}",
        mib(steady.memory.rss_kib)
    );
    let mut rollout = Tally::default();
    let audit_path = audit_log_path(bench.plane.dir());
    let audit_offset = log_end(&audit_path);
    let server_before = ServerCounts::read(&setup).await?;
    let clock = WallClock::now();
    let started = clock.instant;
    set_policy_version(&setup, POLICY, TO).await?;
    let rolled = match wait_sampling(&mut bench, &mut rollout, n, TO, started + timeout).await {
        Ok(w) => w,
        Err(e) => return Err(give_up(args, "rollout", started, &bench, e).await),
    };
    rollout.drain(&mut bench.audit)?;
    let server_after = ServerCounts::read(&setup).await?;
    let audited = read_from(&audit_path, audit_offset)
        .with_context(|| format!("cannot read {}", audit_path.display()))?;
    let observed = Observed {
        nodes: n,
        slots: args.max_unavailable.max(1),
        started,
        finished: rolled.done,
        node_events: bench.nodes.events(),
        transitions: bench.watch.transitions(),
        writes: bench.watch.writes(),
        agents: bench
            .agents
            .finished()
            .into_iter()
            .filter(|a| a.worked && a.version == TO && a.at >= started)
            .collect(),
        agents_seen_ready: bench.agents.ready_seen(started),
        server: server_times(&audited),
        clock,
    };
    let mut figures = rollout_figures(args, &bench, &steady, &rolled, &rollout)?;
    merge(&mut figures, timing_figures(&observed));
    figures["server_requests_per_node"] = server_after.per_node_since(&server_before, n);
    eprintln!(
        "fleet {n}: rolled out in {:.1} s; hand-off p95 {} ms",
        figures["total_seconds"], figures["handoff_p95_ms"]
    );
    figures["plugin"] = finish(args, bench).await?;
    print_result(&figures);
    Ok(())
}

/// The flags kube-controller-manager and kube-scheduler get for a fleet run:
/// - `--node-monitor-grace-period=1h`, so that 10,000 silent nodes stay Ready for the run's
///   length without 10,000 heartbeats (250 writes a second) on 2 CPUs;
/// - client rate limits of 1,000 requests a second (burst 2,000) instead of 20 and 50: with the
///   defaults the DaemonSet controller creates at most 20 pods a second and would be what a
///   500-node wave waits for.
fn tuned_control_plane() -> ControlPlaneOptions {
    let rate = ["--kube-api-qps=1000", "--kube-api-burst=2000"].map(String::from);
    let mut controller_manager_flags = vec!["--node-monitor-grace-period=1h".to_owned()];
    controller_manager_flags.extend(rate.clone());
    ControlPlaneOptions {
        controller_manager_flags,
        scheduler_flags: rate.to_vec(),
        ..ControlPlaneOptions::default()
    }
}

/// Starts the control plane (blocking, on the main thread: see `ttdp_programs`),
/// creates the fleet, and starts the agent stand-in, the watch and the controller.
async fn start(args: &FleetArgs) -> Result<Bench> {
    let n = args.nodes;
    let log_dir = log_dir(args.log_dir.as_deref(), "ttdp-bench-fleet")?;
    eprintln!("fleet {n}: starting the {SERVER_LABEL} and {} nodes", 2 * n);
    let plane = crate::control_plane(&tuned_control_plane())?;
    eprintln!(
        "fleet {n}: control-plane logs in {}",
        plane.dir().join("logs").display()
    );
    let setup = client_for(plane.kubeconfig()).await?;
    install_crd(&setup).await?;
    create_operator_namespace(&setup, ttdp_api::names::DEFAULT_NAMESPACE).await?;
    let started = Instant::now();
    fleet_setup::create_nodes(&setup, n, n, FROM).await?;
    eprintln!(
        "fleet {n}: {} nodes created in {:.1} s",
        2 * n,
        started.elapsed().as_secs_f64()
    );
    let work = Duration::from_millis(args.work_ms);
    let agents = AgentStandIn::start(setup.clone(), work);
    let watch = StatusWatch::start(setup.clone(), POLICY);
    let nodes = NodeWatch::start(setup, POLICY, TO);
    let log_file = log_dir.join(format!("controller-{n}.log"));
    let flags = [
        format!("--namespace={}", ttdp_api::names::DEFAULT_NAMESPACE),
        "--default-image=bench.invalid/ttdp-agent:bench".to_owned(),
    ];
    // More detail on request, e.g. the rounds' timings (`info,ttdp_controller::runtime=debug`).
    let log_filter = std::env::var(CONTROLLER_LOG_ENV).unwrap_or_else(|_| "info".to_owned());
    let controller = ControllerProcess::start(
        &args.controller,
        plane.audited_kubeconfig(),
        &flags,
        &log_filter,
        &log_file,
    )?;
    Ok(Bench {
        agents,
        watch,
        nodes,
        controller,
        log_file,
        audit: plane.audit_log(),
        plane,
    })
}

/// The rollout's figures other than its timing, as the result line reports them.
fn rollout_figures(
    args: &FleetArgs,
    bench: &Bench,
    steady: &Steady,
    rolled: &Waited,
    rollout: &Tally,
) -> Result<serde_json::Value> {
    let end_memory = bench.controller.memory()?;
    let final_status = bench.watch.policy().map_or(0, |p| status_bytes(&p));
    let upgraded = args.nodes.max(1);
    let (reads, writes) = rollout.reads_and_writes();
    let (idle_reads, idle_writes) = steady.idle.reads_and_writes();
    Ok(json!({
        "suite": "fleet",
        "server": SERVER_LABEL,
        "completed": true,
        "nodes": args.nodes,
        "plain_nodes": args.nodes,
        "max_unavailable": args.max_unavailable.max(1),
        "work_ms": args.work_ms,
        "adopt_seconds": steady.adopt.as_secs_f64(),
        "rss_steady_mib": mib(steady.memory.rss_kib),
        "rss_rollout_max_mib": mib(rolled.max_rss_kib.max(end_memory.rss_kib)),
        "rss_peak_mib": mib(end_memory.hwm_kib),
        "idle_requests_per_s": (idle_reads + idle_writes) as f64 / IDLE_WINDOW.as_secs_f64(),
        "reads_per_node": reads as f64 / upgraded as f64,
        "writes_per_node": writes as f64 / upgraded as f64,
        "writes_by_kind": rollout.writes,
        "reads_by_kind": rollout.reads,
        "idle_requests_by_kind": steady.idle.writes.iter().chain(&steady.idle.reads).collect::<BTreeMap<_, _>>(),
        "status_bytes_steady": steady.status_bytes,
        "status_bytes_final": final_status,
        "controller_log": bench.log_file,
    }))
}

/// Adds the fields of `more` to `figures` (both JSON objects).
fn merge(figures: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(into), serde_json::Value::Object(from)) = (figures.as_object_mut(), more) {
        into.extend(from);
    }
}

/// Stops the controller, times the plugin on the rolled-out fleet when asked, and stops the
/// rest; returns the plugin's figures.
async fn finish(args: &FleetArgs, bench: Bench) -> Result<serde_json::Value> {
    bench.controller.stop().await;
    let Some(binary) = &args.plugin else {
        return Ok(serde_json::Value::Null);
    };
    eprintln!("fleet {}: timing kubectl tt driver", args.nodes);
    crate::plugin_timing::time_plugin(binary, bench.plane.kubeconfig(), PLUGIN_RUNS).await
}

/// Prints what was measured before the `phase` ran out of time (memory, progress), stops the
/// server and returns the error.
async fn give_up(
    args: &FleetArgs,
    phase: &str,
    since: Instant,
    bench: &Bench,
    error: anyhow::Error,
) -> anyhow::Error {
    let memory = bench.controller.memory().unwrap_or_default();
    let summary = bench
        .watch
        .policy()
        .and_then(|p| p.status)
        .and_then(|s| s.summary);
    print_result(&json!({
        "suite": "fleet",
        "server": SERVER_LABEL,
        "nodes": args.nodes,
        "plain_nodes": args.nodes,
        "max_unavailable": args.max_unavailable,
        "work_ms": args.work_ms,
        "completed": false,
        "stopped_in": phase,
        "error": format!("{error:#}"),
        "seconds_in_phase": since.elapsed().as_secs_f64(),
        "up_to_date": summary.as_ref().map(|s| s.up_to_date),
        "in_progress": summary.as_ref().map(|s| s.in_progress),
        "rss_now_mib": mib(memory.rss_kib),
        "rss_peak_mib": mib(memory.hwm_kib),
        "controller_log": bench.log_file,
    }));
    error
}

fn mib(kib: u64) -> f64 {
    (kib as f64 / 1024.0 * 10.0).round() / 10.0
}

struct Waited {
    done: Instant,
    max_rss_kib: u64,
}

/// Waits for the rollout to `version`, sampling the controller's memory and counting the
/// controller's requests every [`SAMPLE_EVERY`].
async fn wait_sampling(
    bench: &mut Bench,
    tally: &mut Tally,
    nodes: usize,
    version: &str,
    deadline: Instant,
) -> Result<Waited> {
    let mut max_rss_kib = 0;
    let mut last_report = Instant::now();
    loop {
        max_rss_kib = max_rss_kib.max(bench.controller.memory()?.rss_kib);
        tally.drain(&mut bench.audit)?;
        let policy = bench.watch.policy();
        if let Some(policy) = &policy
            && is_rolled_out(policy, version, nodes)
        {
            return Ok(Waited {
                done: Instant::now(),
                max_rss_kib,
            });
        }
        let summary = policy.and_then(|p| p.status).and_then(|s| s.summary);
        if last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            if let Some(s) = &summary {
                eprintln!(
                    "  {version}: {} of {nodes} up to date, {} in progress, {} failed",
                    s.up_to_date, s.in_progress, s.failed
                );
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "the rollout to {version} did not finish in time; last summary {summary:?}"
            );
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}
