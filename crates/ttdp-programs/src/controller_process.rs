//! The real `ttdp-controller` binary as a child process, configured by its flags (see
//! `crates/ttdp-controller/src/args.rs`), so that its memory is its own: resident set (`VmRSS`)
//! and peak (`VmHWM`) are read from `/proc/<pid>/status`.
//!
//! The controller never outlives the program that started it: like the control plane (see
//! `ttdp_testkit::launcher`) it runs under util-linux's `setpriv --pdeathsig KILL`, so the kernel
//! kills it when the starting thread dies, even by a signal; and it is killed when its
//! [`ControllerProcess`] is dropped. It runs in its own process group, so that a Ctrl-C in the
//! terminal reaches the program only, which may then stop the controller in order.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// How long the controller may take to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Memory figures of a process, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set now.
    pub rss_kib: u64,
    /// Peak resident set since start.
    pub hwm_kib: u64,
}

/// A running controller.
#[derive(Debug)]
pub struct ControllerProcess {
    child: Mutex<Child>,
    pid: i32,
    log_file: PathBuf,
}

impl ControllerProcess {
    /// Starts `binary` against `kubeconfig` with `flags` (`--namespace=...` and the like) after
    /// the ones every program wants, `RUST_LOG=log_filter`, its output in `log_file`. Call from a
    /// thread that lives as long as the controller should: the parent-death signal follows it.
    pub fn start(
        binary: &Path,
        kubeconfig: &Path,
        flags: &[String],
        log_filter: &str,
        log_file: &Path,
    ) -> Result<Self> {
        let shown = binary.display();
        if !binary.is_file() {
            bail!("{shown} does not exist; build it first (cargo build -p ttdp-controller)");
        }
        let log = std::fs::File::create(log_file)
            .with_context(|| format!("cannot create the log {}", log_file.display()))?;
        let err = log.try_clone().context("cannot share the log file")?;
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(binary)
            // One replica: no Lease to wait for. No admin server: nothing scrapes it here.
            .args([
                "--leader-election=false",
                "--metrics-address=",
                "--log-format=text",
            ])
            .args(flags)
            .env("KUBECONFIG", kubeconfig)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", log_filter)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {shown} under setpriv (util-linux)"))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .context("the controller has no process id")?;
        Ok(Self {
            child: Mutex::new(child),
            pid,
            log_file: log_file.to_path_buf(),
        })
    }

    /// An error naming the log when the controller has exited.
    pub fn check_running(&self) -> Result<()> {
        let mut child = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "the controller exited ({status}); see {}",
                self.log_file.display()
            );
        }
        Ok(())
    }

    /// Its memory now, or an error naming the log when it has exited.
    pub fn memory(&self) -> Result<Memory> {
        self.check_running()?;
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
        Ok(parse_status(&text))
    }

    /// SIGTERM, then SIGKILL after `STOP_GRACE`.
    pub async fn stop(self) {
        let mut child = self
            .child
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGTERM);
        if tokio::time::timeout(STOP_GRACE, child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

/// `dir`, else a new `<temp>/<program>-<pid>`, created: where a program puts its logs and the
/// controller's.
pub fn log_dir(dir: Option<&Path>, program: &str) -> Result<PathBuf> {
    let default = || std::env::temp_dir().join(format!("{program}-{}", std::process::id()));
    let dir = dir.map_or_else(default, Path::to_path_buf);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the log directory {}", dir.display()))?;
    Ok(dir)
}

/// `VmRSS` and `VmHWM` of a `/proc/<pid>/status` text.
fn parse_status(text: &str) -> Memory {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_and_peak_are_read_from_proc_status() {
        let text = "Name:\tttdp-controller\nVmHWM:\t   40960 kB\nVmRSS:\t   30720 kB\n";
        assert_eq!(
            parse_status(text),
            Memory {
                rss_kib: 30_720,
                hwm_kib: 40_960
            }
        );
    }
}
