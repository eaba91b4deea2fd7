//! A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler started on loopback from static binaries (the role envtest's assets play for
//! controller-runtime).
//!
//! - [`Assets`] finds the binaries: `TTDP_KUBE_ASSETS` (a folder holding `bin/`, or an archive),
//!   else the archive in the repository's `../shared/kube`, unpacked once under the target
//!   directory. Missing assets are an error that says what to provide; nothing falls back to the
//!   imitation server.
//! - [`ControlPlane::start`] gives every process free ports, fresh certificates and
//!   service-account keys, waits until `/readyz` is ok and the controllers run, and writes an
//!   admin kubeconfig. Logs stay in the run folder ([`ControlPlane::dir`]).
//! - Every process is started under `setpriv --pdeathsig KILL`: it dies with the thread that
//!   started it, so no process is left behind even when the test process is killed.
//! - [`test_kubeconfig`] is what end-to-end suites call: the cluster `TTDP_TEST_KUBECONFIG`
//!   names, else one control plane shared by the whole test process.
//! - With [`ControlPlaneOptions::real_node`], the API server also listens on the host's
//!   non-loopback address and one real node ([`node::RealNode`]: containerd, kubelet,
//!   kube-proxy) joins, so pods really run. Without it nothing of the node is started.

mod assets;
pub mod audit;
pub mod node;
pub(crate) mod pki;
mod process;
pub mod tokens;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use assets::{ASSETS_ENV, Assets, NODE_ASSETS_ENV, runs_dir};
use process::{default_service_account, readyz};

/// A kubeconfig naming an existing cluster to run the end-to-end suites against; nothing is
/// started then.
pub const EXISTING_CLUSTER_ENV: &str = "TTDP_TEST_KUBECONFIG";

/// Why a control plane could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The binaries are not where they were looked for.
    #[error(
        "no Kubernetes control-plane binaries: {0}. Set {ASSETS_ENV} to a folder holding \
         bin/{{etcd,kube-apiserver,kube-controller-manager,kube-scheduler}} (v1.36) or to \
         control-plane-*-linux-amd64.tar.xz, or put that archive in ../shared/kube beside the \
         repository; or set {EXISTING_CLUSTER_ENV} to the kubeconfig of a disposable cluster"
    )]
    MissingAssets(String),
    /// A file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A certificate or key could not be made.
    #[error("certificates: {0}")]
    Pki(#[from] rcgen::Error),
    /// A component exited or did not become ready in time.
    #[error("{component} {problem}; its log: {log}")]
    Component {
        /// etcd, kube-apiserver, ...
        component: &'static str,
        /// What went wrong.
        problem: String,
        /// Where its output is.
        log: PathBuf,
    },
    /// A request to the started server failed.
    #[error("{0}")]
    Kube(String),
}

impl LaunchError {
    fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> LaunchError {
        let what = what.to_string();
        move |source| LaunchError::Io { what, source }
    }
}

/// A running control plane. Dropping it stops its processes and removes its etcd data; the
/// logs stay in [`ControlPlane::dir`] for a failed run to be read.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    audited_kubeconfig: PathBuf,
    audit_log: PathBuf,
    server: String,
    processes: process::Processes,
    node: Option<node::RealNode>,
}

/// Extra flags for one control plane, for a run that needs the components tuned (the fleet
/// benchmark: a node lifecycle controller that tolerates nodes without heartbeats, client rate
/// limits that let the controllers keep up with thousands of nodes). The test suites use none.
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneOptions {
    /// Appended to kube-apiserver's flags.
    pub apiserver_flags: Vec<String>,
    /// Appended to kube-controller-manager's flags (e.g. `--node-monitor-grace-period=1h`).
    pub controller_manager_flags: Vec<String>,
    /// Appended to kube-scheduler's flags.
    pub scheduler_flags: Vec<String>,
    /// Also run one real node (see [`node`]); the API server then listens on every address and
    /// advertises the host's (`TTDP_NODE_IP`, else the default route's).
    pub real_node: bool,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler from `assets` in
    /// a fresh folder under `runs`, and returns once the API server is ready and the
    /// controller manager has created the `default` ServiceAccount (so pods can be created).
    ///
    /// Blocking; each process dies with the calling thread (see the module docs).
    pub fn start(assets: &Assets, runs: &Path) -> Result<ControlPlane, LaunchError> {
        ControlPlane::start_with(assets, runs, &ControlPlaneOptions::default())
    }

    /// [`ControlPlane::start`] with extra flags for the components.
    pub fn start_with(
        assets: &Assets,
        runs: &Path,
        options: &ControlPlaneOptions,
    ) -> Result<ControlPlane, LaunchError> {
        let dir = process::fresh_run_dir(runs)?;
        let address = if options.real_node {
            Some(node::host_address()?)
        } else {
            None
        };
        let pki = pki::Pki::write(&dir.join("pki"), &node_server_names(address))?;
        let ports = process::Ports::pick()?;
        let server = format!("https://127.0.0.1:{}", ports.apiserver);
        let kubeconfig = pki.write_kubeconfig(&dir, &server, pki::Identity::Admin)?;
        let audited_kubeconfig = pki.write_kubeconfig(&dir, &server, pki::Identity::Audited)?;
        let mut processes = process::Processes::new(dir.join("logs"), kubeconfig.clone())?;
        processes.start_etcd(assets, &dir, &ports)?;
        let audit_log = dir.join("logs").join("audit.log");
        let mut apiserver_flags = audit::apiserver_flags(&dir, &audit_log)?;
        apiserver_flags.extend(
            address
                .map(|a| node_apiserver_flags(&pki, a))
                .unwrap_or_default(),
        );
        apiserver_flags.extend_from_slice(&options.apiserver_flags);
        processes.start_apiserver(assets, &pki, &ports, &apiserver_flags)?;
        processes.wait_for("kube-apiserver", "/readyz is not ok", readyz)?;
        for identity in [pki::Identity::ControllerManager, pki::Identity::Scheduler] {
            let own = pki.write_kubeconfig(&dir, &server, identity)?;
            processes.start_controller(assets, identity, &own, &pki, &ports, options)?;
        }
        let problem = "made no default ServiceAccount";
        processes.wait_for("kube-controller-manager", problem, default_service_account)?;
        let logs = dir.join("logs");
        let node = address
            .map(|a| node::RealNode::start(&logs, &kubeconfig, a))
            .transpose()?;
        Ok(ControlPlane {
            dir,
            kubeconfig,
            audited_kubeconfig,
            audit_log,
            server,
            processes,
            node,
        })
    }

    /// The real node, when [`ControlPlaneOptions::real_node`] asked for one.
    pub fn real_node(&self) -> Option<&node::RealNode> {
        self.node.as_ref()
    }

    /// The admin (`system:masters`) kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A second `system:masters` kubeconfig whose every request the API server records in
    /// [`ControlPlane::audit_log`].
    pub fn audited_kubeconfig(&self) -> &Path {
        &self.audited_kubeconfig
    }

    /// The requests of [`ControlPlane::audited_kubeconfig`], as the API server recorded them.
    pub fn audit_log(&self) -> audit::AuditLog {
        audit::AuditLog::new(&self.audit_log)
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The run folder: `logs/`, `pki/`, the kubeconfigs and etcd's data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // The node first: its kubelet still reports to the API server while it stops.
        drop(self.node.take());
        self.processes.stop();
        let _ = std::fs::remove_dir_all(self.dir.join("etcd"));
    }
}

/// The serving certificate's extra names for a real node: the host's address (the API server
/// is advertised there) and the `kubernetes` Service's address and names (in-cluster clients).
fn node_server_names(address: Option<std::net::IpAddr>) -> Vec<String> {
    let Some(address) = address else {
        return Vec::new();
    };
    // The first address of the service range: the `kubernetes` Service's.
    let service = [
        "10.0.0.1",
        "kubernetes.default",
        "kubernetes.default.svc.cluster.local",
    ];
    let mut names = vec![address.to_string()];
    names.extend(service.map(String::from));
    names
}

/// The API server's flags for a real node: on every address, advertised on the host's (the
/// `kubernetes` Service's endpoint), reaching the kubelet by its InternalIP with a client
/// certificate (`kubectl logs`, `exec`).
fn node_apiserver_flags(pki: &pki::Pki, address: std::net::IpAddr) -> Vec<String> {
    vec![
        "--bind-address=0.0.0.0".into(),
        format!("--advertise-address={address}"),
        format!(
            "--kubelet-client-certificate={}",
            pki.path("kubelet-client.crt").display()
        ),
        format!(
            "--kubelet-client-key={}",
            pki.path("kubelet-client.key").display()
        ),
        "--kubelet-preferred-address-types=InternalIP".into(),
    ]
}

/// The kubeconfig an end-to-end test runs against: `TTDP_TEST_KUBECONFIG` when set, else the
/// control plane this test process shares, started on first use from [`Assets::locate`].
///
/// # Panics
/// When no control plane can be had: the message says what is missing and how to provide it.
/// A test must fail there rather than run against anything else.
pub fn test_kubeconfig() -> PathBuf {
    try_test_kubeconfig().unwrap_or_else(|message| panic!("{message}"))
}

/// [`test_kubeconfig`], with the reason as an error instead of a panic.
pub fn try_test_kubeconfig() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(EXISTING_CLUSTER_ENV) {
        return Ok(PathBuf::from(path));
    }
    static SHARED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    SHARED.get_or_init(start_shared).clone()
}

/// Starts the process-wide control plane on a thread that lives as long as the process, so that
/// its processes (tied to that thread) end exactly when the test process does.
fn start_shared() -> Result<PathBuf, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ttdp-control-plane".into())
        .spawn(move || {
            let started = Assets::locate()
                .and_then(|assets| ControlPlane::start(&assets, &assets::runs_dir()));
            match started {
                Ok(plane) => {
                    let _ = tx.send(Ok(plane.kubeconfig().to_path_buf()));
                    // Keeps `plane` (and the parent of its processes) alive until the process
                    // exits.
                    loop {
                        std::thread::park();
                    }
                }
                Err(error) => {
                    let _ = tx.send(Err(format!("starting the test control plane: {error}")));
                }
            }
        })
        .map_err(|e| format!("starting the control-plane thread: {e}"))?;
    rx.recv()
        .map_err(|_| "the control-plane thread ended without an answer".to_string())?
}

/// Runs `future` to completion on a runtime of its own, on a thread of its own: callers may be
/// inside another runtime, or unwinding out of one.
pub(crate) fn blocking<T: Send>(
    future: impl std::future::Future<Output = T> + Send,
) -> Result<T, LaunchError> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map(|runtime| runtime.block_on(future))
            })
            .join()
    })
    .map_err(|_| LaunchError::Kube("a task on a runtime of its own panicked".into()))?
    .map_err(LaunchError::io("starting a runtime"))
}
