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
//! - the controller talks through the testkit's recording proxy, which counts its requests
//!   (the real server keeps no request log); the benchmark's own clients go straight to the
//!   server.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use http::HeaderValue;
use http::header::USER_AGENT;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use ttdp_testkit::fault_proxy::{FaultProxy, Recorder};
use ttdp_testkit::launcher::{Assets, ControlPlaneOptions, runs_dir};
use ttdp_testkit::programs::ControlPlaneThread;
use ttdp_testkit::sim::cluster::client_for;

use crate::bench_client::BENCH_AGENT_PREFIX;

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

/// A real control plane with the recording proxy in front of it for the controller.
pub struct FleetServer {
    plane: ControlPlaneThread,
    proxy: FaultProxy,
}

impl FleetServer {
    /// Starts a control plane tuned for the run, and the proxy.
    pub async fn start() -> Result<Self> {
        let assets = Assets::locate()
            .context("the fleet benchmark on the real control plane needs its binaries")?;
        let plane = tokio::task::spawn_blocking(move || {
            ControlPlaneThread::start(assets, runs_dir(), tuned_control_plane())
        })
        .await
        .context("the control plane's start panicked")?
        .context("cannot start the real control plane")?;
        let admin = client_for(plane.kubeconfig())
            .await
            .context("cannot build a client of the real control plane")?;
        let proxy = FaultProxy::start(admin)
            .await
            .context("cannot start the recording proxy")?;
        Ok(Self { plane, proxy })
    }

    /// A client of the benchmark itself, with User-Agent `ttdp-bench/<role>`.
    pub async fn client(&self, role: &str) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(self.plane.kubeconfig())
            .context("cannot read the control plane's kubeconfig")?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .context("cannot load the control plane's kubeconfig")?;
        let agent = HeaderValue::from_str(&format!("{BENCH_AGENT_PREFIX}{role}"))
            .with_context(|| format!("role {role:?} is not a valid header value"))?;
        config.headers.push((USER_AGENT, agent));
        Client::try_from(config).context("cannot build a client of the control plane")
    }

    /// The kubeconfig the controller runs with: the proxy's.
    pub fn controller_kubeconfig(&self) -> &Path {
        self.proxy.kubeconfig()
    }

    /// An admin kubeconfig (for the plugin).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.plane.kubeconfig().to_path_buf()
    }

    /// The controller's requests, recorded by the proxy.
    pub fn recorder(&self) -> Recorder {
        self.proxy.recorder()
    }

    /// Where the control plane's logs are.
    pub fn logs(&self) -> PathBuf {
        self.plane.run_dir().join("logs")
    }

    /// Stops everything.
    pub async fn shutdown(self) {
        let Self { plane, proxy } = self;
        drop(proxy);
        let _ = tokio::task::spawn_blocking(move || plane.stop()).await;
    }
}
