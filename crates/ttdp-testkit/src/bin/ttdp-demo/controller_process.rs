//! The real `ttdp-controller` binary as a child process of the demo, configured the way the
//! Helm chart configures it (environment variables), talking to the simulated cluster through
//! its kubeconfig.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// How long the controller may take to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What the controller is told.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// The binary.
    pub binary: PathBuf,
    /// The cluster's kubeconfig.
    pub kubeconfig: PathBuf,
    /// The operator namespace (DaemonSets live there).
    pub namespace: String,
    /// The default installer image (mapped to the agent binary by the simulated kubelets).
    pub installer_image: String,
    /// The tt-kmd repository the agents fetch from (the simulated one).
    pub kmd_repository: String,
    /// The tt-smi version the agents label nodes with.
    pub tt_smi_version: String,
    /// Where its output goes.
    pub log_file: PathBuf,
}

/// A running controller.
#[derive(Debug)]
pub struct ControllerProcess {
    child: Mutex<Child>,
    log_file: PathBuf,
}

impl ControllerProcess {
    /// Starts the controller in its own process group, so a Ctrl-C in the terminal reaches the
    /// demo only and the demo stops the controller in order.
    pub fn start(config: &ControllerConfig) -> Result<Self> {
        let log = std::fs::File::create(&config.log_file)
            .with_context(|| format!("cannot create the controller log {}", config.log_file.display()))?;
        let err = log
            .try_clone()
            .with_context(|| format!("cannot reopen the controller log {}", config.log_file.display()))?;
        let mut command = Command::new(&config.binary);
        command
            .env("KUBECONFIG", &config.kubeconfig)
            .env("TTDP_NAMESPACE", &config.namespace)
            .env("TTDP_INSTALLER_IMAGE", &config.installer_image)
            .env("TTDP_KMD_REPOSITORY", &config.kmd_repository)
            .env("TTDP_TT_SMI_VERSION", &config.tt_smi_version)
            .env("TTDP_LEADER_ELECT", "false")
            .env("TTDP_METRICS_ADDR", "127.0.0.1:0")
            .env("TTDP_LOG_FORMAT", "text")
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned()))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .process_group(0)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("cannot start the controller {}", config.binary.display()))?;
        Ok(Self {
            child: Mutex::new(child),
            log_file: config.log_file.clone(),
        })
    }

    /// The controller's exit status if it has stopped.
    pub fn exited(&self) -> Option<ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        child.try_wait().ok().flatten()
    }

    /// Its log file.
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// SIGTERM, then SIGKILL after [`STOP_GRACE`].
    pub async fn stop(self) {
        if self.exited().is_some() {
            return;
        }
        let mut child = self.child.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
    }
}

/// The last `lines` lines of a log file (empty when unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
