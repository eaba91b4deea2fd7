//! The real `ttdp-controller` binary as a child process, so its memory is its own: resident set
//! (`VmRSS`) and peak (`VmHWM`) are read from `/proc/<pid>/status`.
//!
//! The controller never outlives the benchmark: it is started through util-linux's `setpriv
//! --pdeathsig KILL` when available (the kernel kills it when the benchmark dies, even by
//! SIGKILL), and [`stop_children_on_signal`] kills it on SIGINT, SIGTERM or SIGHUP before the
//! benchmark exits.

use std::collections::BTreeSet;
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
/// util-linux's `setpriv`, which sets the parent-death signal of what it runs.
const SETPRIV: &str = "/usr/bin/setpriv";

/// Controllers started and not yet stopped, by pid.
static RUNNING: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn running() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    RUNNING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Kills every running controller and exits (status 128 + the signal) on SIGINT, SIGTERM or
/// SIGHUP. Call once, inside the runtime, before starting controllers.
pub fn stop_children_on_signal() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut streams = Vec::new();
    for (kind, number) in [
        (SignalKind::interrupt(), 2),
        (SignalKind::terminate(), 15),
        (SignalKind::hangup(), 1),
    ] {
        let stream = signal(kind).context("cannot install a signal handler")?;
        streams.push((stream, number));
    }
    for (mut stream, number) in streams {
        tokio::spawn(async move {
            if stream.recv().await.is_some() {
                for pid in running().iter() {
                    let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
                    eprintln!("ttdp-bench: signal {number}: killed the controller (pid {pid})");
                }
                std::process::exit(128 + number);
            }
        });
    }
    Ok(())
}

/// A running controller.
#[derive(Debug)]
pub struct ControllerProcess {
    child: Child,
    pid: u32,
    log_file: PathBuf,
}

impl Drop for ControllerProcess {
    /// The child is killed on drop (`kill_on_drop`); it is no longer one to kill on a signal.
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.pid) {
            running().remove(&pid);
        }
    }
}

/// Memory figures of a process, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set now.
    pub rss_kib: u64,
    /// Peak resident set since start.
    pub hwm_kib: u64,
}

impl ControllerProcess {
    /// Starts `binary` against `kubeconfig`, operator namespace `namespace`, logging to `log_file`.
    pub fn start(
        binary: &Path,
        kubeconfig: &Path,
        namespace: &str,
        log_file: &Path,
    ) -> Result<Self> {
        let log = std::fs::File::create(log_file)
            .with_context(|| format!("cannot create the controller log {}", log_file.display()))?;
        let err = log
            .try_clone()
            .with_context(|| format!("cannot reopen the controller log {}", log_file.display()))?;
        let mut command = if Path::new(SETPRIV).is_file() {
            let mut c = Command::new(SETPRIV);
            c.args(["--pdeathsig", "KILL", "--"]).arg(binary);
            c
        } else {
            Command::new(binary)
        };
        let child = command
            .env("KUBECONFIG", kubeconfig)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", std::env::var("TTDP_BENCH_CONTROLLER_LOG").unwrap_or_else(|_| "info".to_owned()))
            .arg(format!("--namespace={namespace}"))
            .arg("--default-image=bench.invalid/ttdp-agent:bench")
            .arg("--leader-election=false")
            .arg("--metrics-address=")
            .arg("--log-format=text")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start the controller {}; build it with cargo build --release -p ttdp-controller", binary.display()))?;
        let Some(pid) = child.id() else {
            bail!(
                "the controller {} exited at once; see {}",
                binary.display(),
                log_file.display()
            );
        };
        if let Ok(pid) = i32::try_from(pid) {
            running().insert(pid);
        }
        Ok(Self {
            child,
            pid,
            log_file: log_file.to_owned(),
        })
    }

    /// Its memory now, or an error naming the log when it has exited.
    pub fn memory(&mut self) -> Result<Memory> {
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!(
                "the controller exited ({status}); see {}",
                self.log_file.display()
            );
        }
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
        Ok(parse_status(&text))
    }

    /// SIGTERM, then SIGKILL after [`STOP_GRACE`].
    pub async fn stop(mut self) {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        if tokio::time::timeout(STOP_GRACE, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// `VmRSS` and `VmHWM` of a `/proc/<pid>/status` text.
pub fn parse_status(text: &str) -> Memory {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
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
