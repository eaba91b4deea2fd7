//! The server a fleet benchmark runs on: a real control plane started for the run (the default),
//! or the testkit's in-process imitation, kept beside it as a labelled column for comparison.
//!
//! On the real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler from
//! the assets the test suites use; missing assets are an error, never a fallback):
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
//!
//! On the imitation, the testkit's DaemonSet controller stand-in creates and binds the pods and
//! the server records every request itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use http::HeaderValue;
use http::header::USER_AGENT;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use ttdp_testkit::apiserver::{Recorder, TestApiServer};
use ttdp_testkit::fault_proxy::FaultProxy;
use ttdp_testkit::launcher::{Assets, ControlPlaneOptions, runs_dir};
use ttdp_testkit::programs::ControlPlaneThread;
use ttdp_testkit::sim::DaemonSetController;
use ttdp_testkit::sim::cluster::client_for;

use crate::bench_client::{BENCH_AGENT_PREFIX, bench_client};

/// Which server, on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerKind {
    /// A real control plane started for the run.
    Real,
    /// The testkit's in-process imitation API server.
    Imitation,
}

impl ServerKind {
    /// How results name it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Real => "real control plane",
            Self::Imitation => "imitation",
        }
    }
}

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

/// A running server for one fleet run.
pub enum FleetServer {
    /// A real control plane with the recording proxy in front of it for the controller.
    Real {
        /// The control plane.
        plane: ControlPlaneThread,
        /// The controller's way in.
        proxy: FaultProxy,
    },
    /// The imitation with its DaemonSet controller stand-in.
    Imitation {
        /// The server.
        server: TestApiServer,
        /// The stand-in (started with [`FleetServer::start_workload_controllers`]).
        daemonsets: Option<DaemonSetController>,
    },
}

impl FleetServer {
    /// Starts the server `kind` names.
    pub async fn start(kind: ServerKind) -> Result<Self> {
        match kind {
            ServerKind::Real => {
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
                Ok(Self::Real { plane, proxy })
            }
            ServerKind::Imitation => {
                let server = TestApiServer::builder()
                    .watch_history(200_000)
                    .start()
                    .await?;
                Ok(Self::Imitation {
                    server,
                    daemonsets: None,
                })
            }
        }
    }

    /// Whether pods need someone to complete their graceful deletion (a kubelet's job on a real
    /// server; the imitation does it itself after 200 ms).
    pub fn is_real(&self) -> bool {
        matches!(self, Self::Real { .. })
    }

    /// A client of the benchmark itself, with User-Agent `ttdp-bench/<role>`.
    pub async fn client(&self, role: &str) -> Result<Client> {
        match self {
            Self::Imitation { server, .. } => bench_client(server, role),
            Self::Real { plane, .. } => {
                let kubeconfig = Kubeconfig::read_from(plane.kubeconfig())
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
        }
    }

    /// The imitation's DaemonSet controller stand-in (the real control plane has its own).
    pub async fn start_workload_controllers(&mut self) -> Result<()> {
        if let Self::Imitation { server, daemonsets } = self {
            let client = bench_client(server, "daemonset")?;
            *daemonsets = Some(DaemonSetController::start(client, Duration::from_secs(30)));
        }
        Ok(())
    }

    /// The kubeconfig the controller runs with: the proxy's on the real server.
    pub fn controller_kubeconfig(&self) -> &Path {
        match self {
            Self::Real { proxy, .. } => proxy.kubeconfig(),
            Self::Imitation { server, .. } => server.kubeconfig_path(),
        }
    }

    /// An admin kubeconfig (for the plugin).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        match self {
            Self::Real { plane, .. } => plane.kubeconfig().to_path_buf(),
            Self::Imitation { server, .. } => server.kubeconfig_path().to_path_buf(),
        }
    }

    /// The requests recorded: the controller's (through the proxy), or everyone's (the
    /// imitation's own log; the benchmark's are told by their User-Agent).
    pub fn recorder(&self) -> Recorder {
        match self {
            Self::Real { proxy, .. } => proxy.recorder(),
            Self::Imitation { server, .. } => server.recorder().clone(),
        }
    }

    /// Where the control plane's logs are, if it has any.
    pub fn logs(&self) -> Option<PathBuf> {
        match self {
            Self::Real { plane, .. } => Some(plane.run_dir().join("logs")),
            Self::Imitation { .. } => None,
        }
    }

    /// Stops everything.
    pub async fn shutdown(self) {
        match self {
            Self::Real { plane, proxy } => {
                drop(proxy);
                let _ = tokio::task::spawn_blocking(move || plane.stop()).await;
            }
            Self::Imitation { server, daemonsets } => {
                if let Some(daemonsets) = daemonsets {
                    daemonsets.shutdown().await;
                }
                server.shutdown().await;
            }
        }
    }
}
