//! The server a fleet benchmark runs on: a real control plane started for the run (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler from the assets the test suites use;
//! missing assets are an error, never a fallback):
//! - the real DaemonSet controller creates the agent pods and the real scheduler binds them;
//! - no kubelet runs: the benchmark creates the Node objects Ready, and renews no Lease. The
//!   node lifecycle controller is tuned for the run instead, with
//!   `--node-monitor-grace-period=1h`, so that 10,000 silent nodes stay Ready for the run's
//!   length without 10,000 heartbeats (250 writes a second) on 2 CPUs;
//! - kube-controller-manager and kube-scheduler get client rate limits of 1,000 requests a
//!   second (burst 2,000) instead of 20 and 50: with the defaults the DaemonSet controller
//!   creates at most 20 pods a second and would be what a 500-node wave waits for;
//! - the controller runs as an identity of its own, whose requests the API server records in its
//!   audit log ([`ttdp_testkit::launcher::audit`]); that is how they are counted, with nothing
//!   between the controller and the server (a counting proxy, one more hop in the busy benchmark
//!   process, doubled the hand-off time at 100 nodes).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kube::Client;
use ttdp_testkit::launcher::audit::AuditedRequest;
use ttdp_testkit::launcher::{Assets, ControlPlaneOptions, runs_dir};
use ttdp_testkit::programs::ControlPlaneThread;
use ttdp_testkit::sim::cluster::client_for;

/// How results name the server.
pub const SERVER_LABEL: &str = "real control plane";

/// The flags kube-controller-manager and kube-scheduler get for a fleet run (see the module
/// docs for why).
pub fn tuned_control_plane() -> ControlPlaneOptions {
    let rate = ["--kube-api-qps=1000", "--kube-api-burst=2000"].map(String::from);
    let mut controller_manager_flags = vec!["--node-monitor-grace-period=1h".to_owned()];
    controller_manager_flags.extend(rate.clone());
    ControlPlaneOptions {
        controller_manager_flags,
        scheduler_flags: rate.to_vec(),
        ..ControlPlaneOptions::default()
    }
}

/// A real control plane for one fleet run.
pub struct FleetServer {
    plane: ControlPlaneThread,
}

impl FleetServer {
    /// Starts a control plane tuned for the run.
    pub async fn start() -> Result<Self> {
        let assets = Assets::locate()
            .context("the fleet benchmark on the real control plane needs its binaries")?;
        let plane = tokio::task::spawn_blocking(move || {
            ControlPlaneThread::start(assets, runs_dir(), tuned_control_plane())
        })
        .await
        .context("the control plane's start panicked")?
        .context("cannot start the real control plane")?;
        Ok(Self { plane })
    }

    /// An admin client of the benchmark itself.
    pub async fn client(&self) -> Result<Client> {
        client_for(self.plane.kubeconfig())
            .await
            .context("cannot build a client of the real control plane")
    }

    /// The kubeconfig the controller runs with: the audited identity's.
    pub fn controller_kubeconfig(&self) -> &Path {
        self.plane.audited_kubeconfig()
    }

    /// An admin kubeconfig (for the plugin).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.plane.kubeconfig().to_path_buf()
    }

    /// The controller's requests answered since the last call, from the API server's audit log.
    pub fn controller_requests(&self) -> Result<Vec<AuditedRequest>> {
        self.plane
            .audited_requests()
            .context("cannot read the API server's audit log")
    }

    /// Where the control plane's logs are.
    pub fn logs(&self) -> PathBuf {
        self.plane.run_dir().join("logs")
    }

    /// Stops everything.
    pub async fn shutdown(self) {
        let Self { plane } = self;
        let _ = tokio::task::spawn_blocking(move || plane.stop()).await;
    }
}
