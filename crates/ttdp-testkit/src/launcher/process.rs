//! The control plane's processes: their flags, ports, logs, readiness and end.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;

use super::assets::Assets;
use super::pki::{Identity, Pki};
use super::{ControlPlaneOptions, LaunchError, blocking};
use crate::scratch::admin_client;

/// The service range of the test cluster (no service is reachable; it only has to be valid).
const SERVICE_RANGE: &str = "10.0.0.0/24";

/// How long each component may take to become ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// How many finished runs keep their logs.
const KEPT_RUNS: usize = 3;

/// Free loopback ports for one control plane.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    pub(super) apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
}

impl Ports {
    /// Five ports the kernel had free a moment ago (held together, so they differ).
    pub(super) fn pick() -> Result<Ports, LaunchError> {
        let listeners = (0..5)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(LaunchError::io("finding a free port"))?;
        let ports = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(LaunchError::io("finding a free port"))?;
        Ok(Ports {
            etcd_client: ports[0],
            etcd_peer: ports[1],
            apiserver: ports[2],
            controller_manager: ports[3],
            scheduler: ports[4],
        })
    }
}

/// A fresh folder `<runs>/<pid>-<n>`; finished runs' etcd data is removed and only the newest
/// few keep their logs.
pub(super) fn fresh_run_dir(runs: &Path) -> Result<PathBuf, LaunchError> {
    std::fs::create_dir_all(runs).map_err(LaunchError::io(runs.display()))?;
    // Kubeconfigs name their certificates by absolute path.
    let runs = &std::path::absolute(runs).map_err(LaunchError::io(runs.display()))?;
    prune_finished_runs(runs);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = runs.join(format!("{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(LaunchError::io(dir.display()))?;
    Ok(dir)
}

/// Runs whose process is gone: etcd data removed, all but the newest [`KEPT_RUNS`] removed.
fn prune_finished_runs(runs: &Path) {
    let Ok(entries) = std::fs::read_dir(runs) else {
        return;
    };
    let mut finished: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|path| {
            let pid = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split('-').next())
                .unwrap_or_default();
            !Path::new("/proc").join(pid).exists()
        })
        .collect();
    finished.sort_by_key(|path| {
        std::fs::metadata(path)
            .and_then(|m| m.modified())
            .unwrap_or(std::time::UNIX_EPOCH)
    });
    let old = finished.len().saturating_sub(KEPT_RUNS);
    for (i, path) in finished.iter().enumerate() {
        let _ = if i < old {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_dir_all(path.join("etcd"))
        };
    }
}

/// The running components, in start order.
#[derive(Debug)]
pub(super) struct Processes {
    logs: PathBuf,
    /// The admin kubeconfig, through which readiness is polled.
    admin: PathBuf,
    running: Vec<(&'static str, Child)>,
}

impl Processes {
    pub(super) fn new(logs: PathBuf, admin: PathBuf) -> Result<Processes, LaunchError> {
        std::fs::create_dir_all(&logs).map_err(LaunchError::io(logs.display()))?;
        Ok(Processes {
            logs,
            admin,
            running: Vec::new(),
        })
    }

    pub(super) fn start_etcd(
        &mut self,
        assets: &Assets,
        dir: &Path,
        ports: &Ports,
    ) -> Result<(), LaunchError> {
        let client = format!("http://127.0.0.1:{}", ports.etcd_client);
        let peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
        let data = dir.join("etcd");
        self.spawn(
            "etcd",
            assets,
            &[
                "--name=ttdp-test".into(),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls={client}"),
                format!("--advertise-client-urls={client}"),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                "--unsafe-no-fsync".into(),
            ],
        )
    }

    pub(super) fn start_apiserver(
        &mut self,
        assets: &Assets,
        pki: &Pki,
        ports: &Ports,
        extra: &[String],
    ) -> Result<(), LaunchError> {
        let file = |name: &str| pki.path(name).display().to_string();
        let mut args = vec![
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", ports.apiserver),
            format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd_client),
            format!("--tls-cert-file={}", file("serving.crt")),
            format!("--tls-private-key-file={}", file("serving.key")),
            format!("--client-ca-file={}", file("ca.crt")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", file("sa.pub")),
            format!("--service-account-signing-key-file={}", file("sa.key")),
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            "--authorization-mode=Node,RBAC".into(),
            "--allow-privileged=true".into(),
        ];
        args.extend_from_slice(extra);
        self.spawn("kube-apiserver", assets, &args)
    }

    /// kube-controller-manager or kube-scheduler, each with its own identity, with its extra
    /// flags of `options` after the usual ones.
    pub(super) fn start_controller(
        &mut self,
        assets: &Assets,
        identity: Identity,
        kubeconfig: &Path,
        pki: &Pki,
        ports: &Ports,
        options: &ControlPlaneOptions,
    ) -> Result<(), LaunchError> {
        let kubeconfig = kubeconfig.display().to_string();
        let mut args = vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".into(),
            "--leader-elect=false".into(),
        ];
        let file = |name: &str| pki.path(name).display().to_string();
        let (name, extra) = match identity {
            Identity::Scheduler => {
                args.push(format!("--secure-port={}", ports.scheduler));
                ("kube-scheduler", &options.scheduler_flags)
            }
            _ => {
                args.extend([
                    format!("--secure-port={}", ports.controller_manager),
                    format!("--service-account-private-key-file={}", file("sa.key")),
                    format!("--root-ca-file={}", file("ca.crt")),
                    format!("--cluster-signing-cert-file={}", file("ca.crt")),
                    format!("--cluster-signing-key-file={}", file("ca.key")),
                    "--use-service-account-credentials=true".into(),
                    "--controllers=*,bootstrapsigner,tokencleaner".into(),
                    format!("--service-cluster-ip-range={SERVICE_RANGE}"),
                    "--allocate-node-cidrs=false".into(),
                ]);
                ("kube-controller-manager", &options.controller_manager_flags)
            }
        };
        args.extend_from_slice(extra);
        self.spawn(name, assets, &args)
    }

    /// Starts `name` under `setpriv --pdeathsig KILL`, so that it dies with the calling thread,
    /// in a process group of its own: a terminal's Ctrl-C goes to the whole foreground group, and
    /// the program that launched the control plane must still reach it while it stops in order.
    fn spawn(
        &mut self,
        name: &'static str,
        assets: &Assets,
        args: &[String],
    ) -> Result<(), LaunchError> {
        self.spawn_program(name, &assets.binary(name), args)
    }

    /// [`Processes::spawn`] of `program`, logged and reported as `name`.
    pub(super) fn spawn_program(
        &mut self,
        name: &'static str,
        program: &Path,
        args: &[String],
    ) -> Result<(), LaunchError> {
        let log = self.log(name);
        let out = std::fs::File::create(&log).map_err(LaunchError::io(log.display()))?;
        let err = out.try_clone().map_err(LaunchError::io(log.display()))?;
        let starting = format!("starting {name} under setpriv (util-linux)");
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(LaunchError::io(starting))?;
        self.running.push((name, child));
        Ok(())
    }

    pub(super) fn log(&self, name: &str) -> PathBuf {
        self.logs.join(format!("{name}.log"))
    }

    /// The first component that has exited, as an error.
    pub(super) fn check_running(&mut self) -> Result<(), LaunchError> {
        for (name, child) in &mut self.running {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(LaunchError::Component {
                    component: name,
                    problem: format!("exited ({status})"),
                    log: self.logs.join(format!("{name}.log")),
                });
            }
        }
        Ok(())
    }

    /// Polls `probe` through the admin kubeconfig until it answers; fails as soon as a component
    /// exits, or with `problem` when `component` is not ready within [`READY_WITHIN`].
    pub(super) fn wait_for<Fut>(
        &mut self,
        component: &'static str,
        problem: &str,
        probe: fn(kube::Client) -> Fut,
    ) -> Result<(), LaunchError>
    where
        Fut: std::future::Future<Output = Option<()>> + Send,
    {
        let deadline = Instant::now() + READY_WITHIN;
        blocking(async {
            loop {
                self.check_running()?;
                let client = admin_client(&self.admin, "default").await;
                let client = client.map_err(|e| LaunchError::Kube(format!("{e:#}")))?;
                if probe(client).await.is_some() {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    return Err(LaunchError::Component {
                        component,
                        problem: format!("{problem} after {READY_WITHIN:?}"),
                        log: self.log(component),
                    });
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })?
    }

    /// Kills every component (the test cluster's state is thrown away anyway).
    pub(super) fn stop(&mut self) {
        for (_, child) in self.running.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.running.clear();
    }
}

/// Whether `GET /readyz` answers exactly `ok`.
pub(super) async fn readyz(client: kube::Client) -> Option<()> {
    let request = http::Request::get("/readyz").body(Vec::new()).ok()?;
    let body = client.request_text(request).await.ok()?;
    (body.trim() == "ok").then_some(())
}

/// Whether the controller manager has made the `default` ServiceAccount of `default`.
pub(super) async fn default_service_account(client: kube::Client) -> Option<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
    accounts.get_opt("default").await.ok().flatten().map(|_| ())
}
