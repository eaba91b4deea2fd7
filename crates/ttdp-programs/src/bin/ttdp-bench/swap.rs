//! Node swap on the host: the steps of `ttdp-kmod`'s [`ModuleInstaller::swap`] (probe, build,
//! unload, load, from its [`SwapReport`]) on a simulated kernel, for a cache hit with nothing
//! loaded, a cache hit replacing a loaded version, and a cache miss (a build of the simulated
//! module from a local tt-kmd repository); plus the agent's last step, labelling its Node, timed
//! against a real control plane started for it. Real-kernel load and unload times come from the
//! VM that `cargo xtask bench` boots (`crates/ttdp-kmod/examples/swap_timing.rs`), not from here.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use ttdp_api::names::labels;
use ttdp_kmod::{
    BuildOptions, InstallerConfig, KmdVersion, ModuleInstaller, SimHost, SimKernel, SimKmdRepo,
    SwapOptions, SwapReport,
};
use ttdp_testkit::sim::cluster::client_for;

use crate::figures::{ms, print_result, spread};

const RELEASE: &str = "6.8.0-sim";
const V1: &str = "2.0.0";
const V2: &str = "2.1.0";

/// Flags of `ttdp-bench swap`.
#[derive(Debug, Args)]
pub struct SwapArgs {
    /// Repetitions of each case (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
}

/// One case's figures: the medians of its runs' steps, with the label time `label` added.
fn case_json(reports: &[SwapReport], label: Duration) -> serde_json::Value {
    let median = |step: fn(&SwapReport) -> u64| {
        spread(
            reports
                .iter()
                .map(|r| Duration::from_millis(step(r)))
                .collect(),
        )
        .p50
    };
    let total = median(|r| r.total_ms);
    json!({
        "probe_ms": ms(median(|r| r.probe_ms)), "build_ms": ms(median(|r| r.build_ms)),
        "unload_ms": ms(median(|r| r.unload_ms)), "load_ms": ms(median(|r| r.load_ms)),
        "label_ms": ms(label), "swap_total_ms": ms(total), "start_to_ready_ms": ms(total + label),
    })
}

type Installer = ModuleInstaller<SimKernel>;

/// A simulated host in a temporary directory, which lives as long as the returned `TempDir`.
fn host(repo: &SimKmdRepo, work: &std::path::Path) -> Result<(tempfile::TempDir, Installer)> {
    let dir = tempfile::Builder::new()
        .prefix("ttdp-bench-swap-")
        .tempdir()
        .context("cannot create a temporary host")?;
    let sim = SimHost::create(dir.path().join("host"), RELEASE)
        .context("cannot create the simulated host")?;
    let config = InstallerConfig {
        build: BuildOptions {
            repository: repo.url(),
            jobs: 2,
            fetch_timeout: Duration::from_secs(120),
            build_timeout: Duration::from_secs(120),
            work_dir: Some(work.to_owned()),
            ..BuildOptions::default()
        },
        cache_lock_timeout: Duration::from_secs(60),
        ..InstallerConfig::default()
    };
    let installer = ModuleInstaller::new(sim.host().clone(), sim.kernel(), config)
        .context("cannot open the simulated host")?;
    Ok((dir, installer))
}

/// Runs the suite and prints its result line.
pub fn run(args: &SwapArgs) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("ttdp-bench-repo-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let repo = SimKmdRepo::create(dir.path().join("tt-kmd"), &[V1, V2])
        .context("cannot create the simulated tt-kmd repository")?;
    let (v1, v2): (KmdVersion, KmdVersion) = (V1.parse()?, V2.parse()?);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).context("cannot create the build directory")?;
    let swap = |host: &Installer, version: &KmdVersion, failure: &'static str| {
        host.swap(version, &SwapOptions::default()).context(failure)
    };
    let runs = args.runs.max(1);
    let (mut miss, mut hit_fresh, mut hit_swap) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        eprintln!("swap: run {} of {runs}", run + 1);
        let (_dir, h) = host(&repo, &work)?;
        // Cache miss, nothing loaded: fetch and build V1, load it.
        miss.push(swap(&h, &v1, "cache-miss swap failed")?);
        // Build V2 into the cache, then swap V1 -> V2: a cache hit with a swap.
        h.ensure_ko(&v2)
            .context("cannot build the second version")?;
        hit_swap.push(swap(&h, &v2, "cache-hit swap failed")?);
        // A second host sharing nothing but a pre-filled cache: hit with nothing loaded.
        let (_fresh_dir, fresh) = host(&repo, &work)?;
        fresh.ensure_ko(&v1).context("cannot fill the cache")?;
        hit_fresh.push(swap(&fresh, &v1, "cache-hit install failed")?);
    }
    let label = label_time(runs * 4)?;
    print_result(&json!({
        "suite": "swap",
        "runs": runs,
        "kernel": "simulated (ttdp_kmod::SimKernel); real-kernel load/unload: cargo xtask vm-test",
        "cache_hit_nothing_loaded": case_json(&hit_fresh, label),
        "cache_hit_swap": case_json(&hit_swap, label),
        "cache_miss_build": case_json(&miss, label),
    }));
    Ok(())
}

/// Median time of the agent's node label merge patch against a real API server.
fn label_time(samples: usize) -> Result<Duration> {
    let plane = crate::control_plane(&Default::default())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let client = client_for(plane.kubeconfig()).await?;
        let nodes: Api<Node> = Api::all(client);
        let node: Node = serde_json::from_value(
            json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": "swap-node" } }),
        )?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .context("cannot create the node")?;
        let mut times = Vec::new();
        for i in 0..samples {
            let patch =
                json!({ "metadata": { "labels": { labels::KMD_VERSION: format!("2.{i}.0") } } });
            let started = Instant::now();
            nodes
                .patch("swap-node", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .context("cannot label the node")?;
            times.push(started.elapsed());
        }
        anyhow::Ok(spread(times).p50)
    })
}
