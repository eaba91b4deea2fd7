//! The real `ttdp-controller` binary as a child process, configured by its flags (see
//! `crates/ttdp-controller/src/args.rs`), so that its memory is its own: resident set (`VmRSS`)
//! and peak (`VmHWM`) are read from `/proc/<pid>/status`.
//!
//! The controller never outlives the program that started it: it runs under util-linux's
//! `setpriv --pdeathsig KILL` when available (the kernel kills it when the starting thread dies,
//! even by SIGKILL), it is killed when its [`ControllerProcess`] is dropped, and
//! [`kill_controllers_on_signal`] kills every running one on SIGINT, SIGTERM or SIGHUP before
//! the program exits. It runs in its own process group, so a Ctrl-C in the terminal reaches
//! the program only, which then stops the controller in order.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::ProgramError;

/// How long the controller may take to stop after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// util-linux's `setpriv`, which sets the parent-death signal of what it runs.
const SETPRIV: &str = "/usr/bin/setpriv";
/// Longest log line [`log_tail`] shows in full.
pub const LINE_LIMIT: usize = 400;

/// Controllers started and not yet stopped, by pid.
static RUNNING: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn running() -> MutexGuard<'static, BTreeSet<i32>> {
    RUNNING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the controller is told.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// The binary.
    pub binary: PathBuf,
    /// The cluster's kubeconfig.
    pub kubeconfig: PathBuf,
    /// The operator namespace (DaemonSets live there).
    pub namespace: String,
    /// The default installer image of the DaemonSets.
    pub default_image: String,
    /// The tt-kmd repository the agents fetch from, if not the controller's default.
    pub kmd_repository: Option<String>,
    /// First and longest back-off before a Failed node is retried, in whole seconds, if not the
    /// controller's defaults.
    pub retry_seconds: Option<(u64, u64)>,
    /// Only policies with these labels (`--policy-selector`), for a cluster shared with others.
    pub policy_selector: Option<String>,
    /// Its `RUST_LOG`.
    pub log_filter: String,
    /// Where its output goes.
    pub log_file: PathBuf,
}

impl ControllerConfig {
    /// `binary` against `kubeconfig` with operator namespace `namespace`, logging at `info` to
    /// `log_file`; the other settings are the controller's defaults.
    pub fn new(binary: &Path, kubeconfig: &Path, namespace: &str, log_file: &Path) -> Self {
        Self {
            binary: binary.to_path_buf(),
            kubeconfig: kubeconfig.to_path_buf(),
            namespace: namespace.to_owned(),
            default_image: "bench.invalid/ttdp-agent:bench".to_owned(),
            kmd_repository: None,
            retry_seconds: None,
            policy_selector: None,
            log_filter: "info".to_owned(),
            log_file: log_file.to_path_buf(),
        }
    }

    fn args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--namespace={}", self.namespace),
            format!("--default-image={}", self.default_image),
            // One replica: no Lease to wait for. No admin server: nothing scrapes it here.
            "--leader-election=false".to_owned(),
            "--metrics-address=".to_owned(),
            "--log-format=text".to_owned(),
        ];
        if let Some(repository) = &self.kmd_repository {
            args.push(format!("--kmd-repository={repository}"));
        }
        if let Some((base, max)) = self.retry_seconds {
            args.push(format!("--retry-base-seconds={base}"));
            args.push(format!("--retry-max-seconds={max}"));
        }
        if let Some(selector) = &self.policy_selector {
            args.push(format!("--policy-selector={selector}"));
        }
        args
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

/// A running controller.
#[derive(Debug)]
pub struct ControllerProcess {
    child: Mutex<Child>,
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

impl ControllerProcess {
    /// Starts the controller as `config` says. Call from a thread that lives as long as the
    /// controller should (an async runtime's worker): the parent-death signal follows it.
    pub fn start(config: &ControllerConfig) -> Result<Self, ProgramError> {
        let log_error = |source| ProgramError::Log {
            path: config.log_file.clone(),
            source,
        };
        let log = std::fs::File::create(&config.log_file).map_err(log_error)?;
        let err = log.try_clone().map_err(log_error)?;
        let mut command = if Path::new(SETPRIV).is_file() {
            let mut c = Command::new(SETPRIV);
            c.args(["--pdeathsig", "KILL", "--"]).arg(&config.binary);
            c
        } else {
            Command::new(&config.binary)
        };
        let child = command
            .args(config.args())
            .env("KUBECONFIG", &config.kubeconfig)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", &config.log_filter)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ProgramError::Spawn {
                binary: config.binary.clone(),
                source,
            })?;
        let pid = child.id().unwrap_or_default();
        if let Ok(pid) = i32::try_from(pid) {
            running().insert(pid);
        }
        Ok(Self {
            child: Mutex::new(child),
            pid,
            log_file: config.log_file.clone(),
        })
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The controller's exit status if it has stopped.
    pub fn exited(&self) -> Option<ExitStatus> {
        self.child().try_wait().ok().flatten()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its log file.
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// Its memory now, or an error naming the log when it has exited.
    pub fn memory(&self) -> Result<Memory, ProgramError> {
        if let Some(status) = self.exited() {
            return Err(ProgramError::Exited {
                status,
                log: self.log_file.clone(),
            });
        }
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path)
            .map_err(|source| ProgramError::ProcStatus { path, source })?;
        Ok(parse_status(&text))
    }

    /// SIGTERM, then SIGKILL after [`STOP_GRACE`].
    pub async fn stop(self) {
        if self.exited().is_some() {
            return;
        }
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        // Polled rather than awaited: the child sits behind a lock that must not be held
        // across an await.
        let deadline = std::time::Instant::now() + STOP_GRACE;
        while self.exited().is_none() {
            if std::time::Instant::now() >= deadline {
                let _ = self.child().start_kill();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Kills every running controller and exits (status 128 + the signal) on SIGINT, SIGTERM or
/// SIGHUP. Call once, inside the runtime, before starting controllers; for programs that have no
/// orderly shutdown of their own.
pub fn kill_controllers_on_signal() -> Result<(), ProgramError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut streams = Vec::new();
    for (kind, number) in [
        (SignalKind::interrupt(), 2),
        (SignalKind::terminate(), 15),
        (SignalKind::hangup(), 1),
    ] {
        streams.push((signal(kind).map_err(ProgramError::Signal)?, number));
    }
    for (mut stream, number) in streams {
        tokio::spawn(async move {
            if stream.recv().await.is_some() {
                for pid in running().iter() {
                    let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
                    eprintln!("signal {number}: killed the controller (pid {pid})");
                }
                std::process::exit(128 + number);
            }
        });
    }
    Ok(())
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

    #[test]
    fn optional_flags_appear_only_when_set() {
        let mut config =
            ControllerConfig::new(Path::new("/bin/c"), Path::new("/k"), "ns", Path::new("/l"));
        assert!(!config.args().iter().any(|a| a.starts_with("--retry")));
        config.retry_seconds = Some((6, 120));
        config.policy_selector = Some("a=b".to_owned());
        let args = config.args();
        assert!(args.contains(&"--retry-base-seconds=6".to_owned()));
        assert!(args.contains(&"--policy-selector=a=b".to_owned()));
    }
}
