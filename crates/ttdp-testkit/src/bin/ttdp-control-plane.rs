//! Starts a real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
//! on loopback for a test run, prints its admin kubeconfig's path, and keeps it up until
//! SIGTERM or SIGINT. Its processes die with it, even on SIGKILL.
//!
//! `--with-node` also runs one real node (containerd, kubelet, kube-proxy; the API server then
//! listens on the host's address too) and prints containerd's socket on a second line, for
//! `ctr --address SOCKET -n k8s.io images import`. On SIGTERM or SIGINT the node's containers,
//! mounts, iptables chains, bridge and cgroups are removed; after a SIGKILL they stay.

use std::path::PathBuf;

use clap::Parser;
use nix::sys::signal::{SigSet, Signal};
use ttdp_testkit::launcher::{Assets, ControlPlane, ControlPlaneOptions, runs_dir};

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
    /// Also run one real node: containerd, the kubelet and kube-proxy (as root; needs
    /// containerd, runc, iptables, buildah and busybox-static).
    #[arg(long)]
    with_node: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let assets = Assets::locate()?;
    let runs = args.runs.unwrap_or_else(runs_dir);
    let options = ControlPlaneOptions {
        real_node: args.with_node,
        ..ControlPlaneOptions::default()
    };
    let plane = ControlPlane::start_with(&assets, &runs, &options)?;
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
    if let Some(node) = plane.real_node() {
        eprintln!(
            "real node {} up at {}",
            ttdp_testkit::launcher::node::NODE_NAME,
            node.address()
        );
        println!("{}", node.containerd_socket().display());
    }
    let signals = SigSet::from_iter([Signal::SIGTERM, Signal::SIGINT]);
    signals.thread_block()?;
    signals.wait()?;
    drop(plane);
    Ok(())
}
