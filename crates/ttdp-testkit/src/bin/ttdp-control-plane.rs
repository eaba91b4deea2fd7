//! Starts a real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
//! on loopback for a test run, prints its admin kubeconfig's path, and keeps it up until
//! SIGTERM or SIGINT. Its processes die with it, even on SIGKILL.

use std::path::PathBuf;

use clap::Parser;
use nix::sys::signal::{SigSet, Signal};
use ttdp_testkit::launcher::{Assets, ControlPlane, runs_dir};

/// Run a real Kubernetes control plane for tests.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Also copy the admin kubeconfig to this path.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Where the run folder (logs, certificates, etcd data) goes (default:
    /// `<target>/ttdp-kube/runs`).
    #[arg(long)]
    runs: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let assets = Assets::locate()?;
    let runs = args.runs.unwrap_or_else(runs_dir);
    let plane = ControlPlane::start(&assets, &runs)?;
    if let Some(copy) = &args.kubeconfig {
        std::fs::copy(plane.kubeconfig(), copy)?;
    }
    let path = args.kubeconfig.as_deref().unwrap_or(plane.kubeconfig());
    eprintln!(
        "control plane up at {} (logs in {})",
        plane.server(),
        plane.dir().join("logs").display()
    );
    println!("{}", path.display());
    let signals = SigSet::from_iter([Signal::SIGTERM, Signal::SIGINT]);
    signals.thread_block()?;
    signals.wait()?;
    drop(plane);
    Ok(())
}
