//! `ttdp-demo`: the README's main command (`cargo xtask demo` builds the binaries and runs it).
//!
//! It runs simulated Tenstorrent nodes (simulated kubelets running the real `ttdp-agent` binary
//! against file-backed simulated kernels) on a real control plane: one it starts from the
//! control-plane assets, or the existing cluster of `--kubeconfig`; only when neither is at hand
//! does it fall back to the testkit's in-process imitation API server, and it says so first (see
//! `cluster_source`). It runs the real `ttdp-controller` binary against that cluster, installs
//! tt-kmd with a `TenstorrentDriverPolicy`, upgrades it, and shows the rollout live through the
//! real `kubectl tt driver` plugin. Then it prints the timings and keeps the cluster up for
//! `kubectl` until Ctrl-C.
//!
//! It refuses to start when `TTDP_TEST_KUBECONFIG` (the test suites' switch to an existing
//! cluster) is set: an existing cluster is named explicitly, with `--kubeconfig`.

mod args;
mod cluster_source;
mod ending;
mod final_state;
mod fleet;
mod hints;
mod live_view;
mod scenario;
mod timings;

use std::process::ExitCode;
use std::sync::Mutex;

use anyhow::{Context, Result};
use clap::Parser;

use ttdp_testkit::sim::cluster::REAL_CLUSTER_KUBECONFIG_ENV;

use crate::args::DemoArgs;
use crate::scenario::Ending;

fn main() -> ExitCode {
    match run(DemoArgs::parse()) {
        Ok(Ending::Success) => ExitCode::SUCCESS,
        Ok(Ending::Interrupted) => {
            eprintln!("ttdp-demo: interrupted");
            ExitCode::from(130)
        }
        Ok(Ending::Failure(problems)) => {
            let first = problems
                .first()
                .and_then(|p| p.lines().next())
                .unwrap_or("unknown problem");
            eprintln!("ttdp-demo: the demo failed: {first} (details above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("ttdp-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: DemoArgs) -> Result<Ending> {
    if std::env::var_os(REAL_CLUSTER_KUBECONFIG_ENV).is_some() {
        anyhow::bail!(
            "{REAL_CLUSTER_KUBECONFIG_ENV} is set: the demo joins an existing cluster only when asked with --kubeconfig FILE; unset it and run again"
        );
    }
    let log_dir = ttdp_programs::log_dir(args.log_dir.as_deref(), "ttdp-demo")?;
    // The demo's own logs (and the simulation's) go to a file: the terminal shows the rollout.
    let log = log_dir.join("demo.log");
    let file =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(Mutex::new(file))
        .init();
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(scenario::run(args, log_dir))
}
