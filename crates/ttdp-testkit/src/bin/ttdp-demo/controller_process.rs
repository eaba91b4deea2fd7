//! The real `ttdp-controller` binary as a child process of the demo, configured by its flags
//! (see `crates/ttdp-controller/src/args.rs`), talking to the simulated cluster through its
//! kubeconfig.

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
    /// First back-off before a Failed node is retried (whole seconds, at least 1).
    pub retry_base_seconds: u64,
    /// Longest back-off before a Failed node is retried.
    pub retry_max_seconds: u64,
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
        let log = std::fs::File::create(&config.log_file).with_context(|| {
            format!(
                "cannot create the controller log {}",
                config.log_file.display()
            )
        })?;
        let err = log.try_clone().with_context(|| {
            format!(
                "cannot reopen the controller log {}",
                config.log_file.display()
            )
        })?;
        let mut command = Command::new(&config.binary);
        command
            .env("KUBECONFIG", &config.kubeconfig)
            .env("NO_COLOR", "1")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            .arg(format!("--namespace={}", config.namespace))
            .arg(format!("--default-image={}", config.installer_image))
            .arg(format!("--kmd-repository={}", config.kmd_repository))
            .arg(format!(
                "--retry-base-seconds={}",
                config.retry_base_seconds
            ))
            .arg(format!("--retry-max-seconds={}", config.retry_max_seconds))
            // One replica: no Lease to wait for. No admin server: nothing scrapes it here.
            .arg("--leader-election=false")
            .arg("--metrics-address=")
            .arg("--log-format=text")
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
        let mut child = self
            .child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
        let mut child = self
            .child
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        if tokio::time::timeout(STOP_GRACE, child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

/// Longest log line shown in full.
const LINE_LIMIT: usize = 400;

/// The last `lines` lines of a log file (empty when unreadable), each cut at [`LINE_LIMIT`]
/// characters.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|line| match line.char_indices().nth(LINE_LIMIT) {
            Some((cut, _)) => format!("{} ...", &line[..cut]),
            None => (*line).to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
