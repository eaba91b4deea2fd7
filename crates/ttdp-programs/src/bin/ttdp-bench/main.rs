//! `ttdp-bench`: the benchmarks behind `cargo xtask bench` (issues 10 and 22), one subcommand per
//! suite.
//!
//! - `fleet`: the real `ttdp-controller` binary against simulated fleets with a cheap agent
//!   stand-in, on a real control plane started for the run, measuring memory, API requests,
//!   the hand-off from one node to the next as the nodes show it, the controller's part of it,
//!   how fresh and how large the status is, and the rollout time against its floor (with
//!   `--plugin`, also `kubectl tt driver`'s wall time on the same fleet);
//! - `status-size`: the status the controller's builder makes for a fleet too large to
//!   simulate, without a cluster;
//! - `drain`: the `ttdp-drain` example program side by side with the real `kubectl drain`, on
//!   the real control plane;
//! - `status-write`: one status write alone on an idle real control plane, the floor under the
//!   fleet's hand-off;
//! - `swap`: the module swap steps of `ttdp-kmod` on a simulated kernel.
//!
//! Each suite prints progress on stderr and its figures as one `BENCH-RESULT {json}` line on
//! stdout, which `cargo xtask bench` collects, checks against the targets and tabulates. It only
//! talks to servers it starts itself, and refuses to run when `TTDP_TEST_KUBECONFIG` is set.

mod agent_stand_in;
mod audit_times;
mod drain;
mod drain_fleet;
mod figures;
mod fleet;
mod fleet_figures;
mod fleet_setup;
mod handoff_path;
mod node_watch;
mod plugin_timing;
mod server_mix;
mod status_size;
mod status_watch;
mod status_write;
mod swap;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use ttdp_testkit::launcher::{Assets, ControlPlane, ControlPlaneOptions, runs_dir};

/// The benchmarks behind `cargo xtask bench`.
#[derive(Debug, Parser)]
#[command(name = "ttdp-bench")]
struct Cli {
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Debug, Subcommand)]
enum Suite {
    /// The controller at fleet scale.
    Fleet(fleet::FleetArgs),
    /// ttdp-drain against kubectl drain.
    Drain(drain::DrainArgs),
    /// One status write alone on an idle real control plane.
    StatusWrite(status_write::StatusWriteArgs),
    /// The status the controller builds for a fleet too large to simulate.
    StatusSize(status_size::StatusSizeArgs),
    /// Module swap steps on a simulated kernel.
    Swap(swap::SwapArgs),
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ttdp-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    if std::env::var_os(ttdp_testkit::sim::cluster::REAL_CLUSTER_KUBECONFIG_ENV).is_some() {
        anyhow::bail!(
            "TTDP_TEST_KUBECONFIG is set: the benchmarks run on servers they start themselves; unset it"
        );
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // The launcher's readiness checks poll a server that is still starting: kube's client
        // logs each refused poll as an error, which is noise here.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new("warn,kube_client::client::builder=off")
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match cli.suite {
        Suite::Fleet(args) => block_on(fleet::run(&args)),
        Suite::Drain(args) => block_on(drain::run(&args)),
        Suite::StatusWrite(args) => block_on(status_write::run(&args)),
        // Synchronous: the module code has no async runtime.
        Suite::Swap(args) => swap::run(&args),
        Suite::StatusSize(args) => status_size::run(&args),
    }
}

/// A real control plane started for a suite, with `options`; from the main thread, as
/// [`block_on`] runs the async suites: it dies with that thread (see `ttdp_programs`).
fn control_plane(options: &ControlPlaneOptions) -> Result<ControlPlane> {
    let assets = Assets::locate().context("the benchmarks need the control plane's binaries")?;
    ControlPlane::start_with(&assets, &runs_dir(), options)
        .context("cannot start the real control plane")
}

/// Runs an async suite on the main thread: the controller and the control plane it starts die
/// with that thread, a signal included (see `ttdp_programs`).
fn block_on(suite: impl Future<Output = Result<()>>) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(suite)
}
