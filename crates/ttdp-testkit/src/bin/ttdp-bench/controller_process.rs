//! The real `ttdp-controller` binary as a child process, so its memory is its own: resident set
//! (`VmRSS`) and peak (`VmHWM`) are read from `/proc/<pid>/status`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// How long the controller may take to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A running controller.
#[derive(Debug)]
pub struct ControllerProcess {
    child: Child,
    pid: u32,
    log_file: PathBuf,
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
        let child = Command::new(binary)
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
