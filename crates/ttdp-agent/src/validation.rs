//! Post-load validation (`upgradePolicy.validation`): the proof that a loaded tt-kmd works before
//! the node is reported Ready.
//!
//! - the devices ([`check_devices`], [`wait_for_devices`]): every Tenstorrent PCI function bound
//!   to `tenstorrent` with its `/dev/tenstorrent` node ([`DeviceVerdict`]);
//! - optionally a command from the image ([`run_command`]) that must exit 0 within its timeout;
//! - the outcome is kept in a [`ValidationRecord`] next to the module lock on the host, so the
//!   readiness probe, which runs without the agent, knows whether the command passed for the
//!   module loaded now.
//!
//! [`validate_loaded`] runs all of it; the node flow calls it inside the swap (under the module
//! lock, where a failure rolls back: `ttdp_kmod::ModuleInstaller::swap_validated`) and before
//! reporting a module it found loaded as Ready.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ttdp_api::names::{MODULE_NAME, env};
use ttdp_hostprobe::{HostRoot, device_bindings};
use ttdp_kmod::{ModuleStatus, log_tail, run_logged};

use crate::config::ValidationConfig;
use crate::device_check::DeviceVerdict;

/// The record's file name in the module lock directory (`/run/ttdp` on the host).
pub const RECORD_FILE: &str = "tenstorrent.validation.json";
/// How often the devices are looked at again while waiting for them after a load.
const DEVICE_POLL: Duration = Duration::from_millis(100);
/// Lines of the command's output quoted in a failure message.
const OUTPUT_LINES: usize = 5;

/// The last validation of the loaded module, for the readiness probe.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidationRecord {
    /// The version validated.
    pub version: String,
    /// Its `srcversion` (tells two builds of one version apart).
    pub srcversion: Option<String>,
    /// The command run, if any.
    pub command: Option<Vec<String>>,
    /// Whether every check passed.
    pub passed: bool,
    /// What was proven, or what is missing.
    pub message: String,
}

impl ValidationRecord {
    /// The record file in the module lock directory `lock_dir`.
    pub fn path(lock_dir: &Path) -> PathBuf {
        lock_dir.join(RECORD_FILE)
    }

    /// The record in `lock_dir`, `None` when there is none or it cannot be read.
    pub fn read(lock_dir: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(Self::path(lock_dir)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes the record atomically (a reader never sees half of it).
    pub fn write(&self, lock_dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(lock_dir)?;
        let mut file = tempfile::NamedTempFile::new_in(lock_dir)?;
        serde_json::to_writer_pretty(&mut file, self)?;
        file.persist(Self::path(lock_dir))
            .map(|_| ())
            .map_err(|e| e.error)
    }

    /// Whether this record proves that `command` passed for the module `version`
    /// (`srcversion`).
    pub fn proves(&self, version: &str, srcversion: Option<&str>, command: &[String]) -> bool {
        self.passed
            && self.version == version
            && self.srcversion.as_deref() == srcversion
            && self.command.as_deref() == Some(command)
    }
}

/// One look at the devices: `Ok` with what works, `Err` with what does not.
pub fn check_devices(host: &HostRoot) -> Result<String, String> {
    let bindings = device_bindings(host)
        .map_err(|e| format!("cannot read the Tenstorrent PCI devices: {e}"))?;
    let verdict = DeviceVerdict::of(&bindings);
    if verdict.passed() {
        Ok(verdict.message())
    } else {
        Err(verdict.message())
    }
}

/// [`check_devices`] until it passes or `wait` has passed (the driver may still be probing its
/// devices right after the load).
pub fn wait_for_devices(host: &HostRoot, wait: Duration) -> Result<String, String> {
    let started = Instant::now();
    loop {
        let checked = check_devices(host);
        if checked.is_ok() || started.elapsed() >= wait {
            return checked;
        }
        std::thread::sleep(DEVICE_POLL.min(wait.saturating_sub(started.elapsed())));
    }
}

/// Runs the validation command `argv` (in its own process group, killed with it after
/// `timeout`), with `TTDP_HOST_ROOT` and `TT_KMD_VERSION` set for it.
pub fn run_command(
    argv: &[String],
    timeout: Duration,
    host: &HostRoot,
    version: &str,
) -> Result<String, String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("the validation command is empty".into());
    };
    let shown = argv.join(" ");
    let mut command = Command::new(program);
    command
        .args(args)
        .env(env::HOST_ROOT, host.dir())
        .env(env::TT_KMD_VERSION, version);
    let run = run_logged(command, program, timeout)
        .map_err(|e| format!("the validation command `{shown}` could not start: {e}"))?;
    let output = log_tail(&run.log, OUTPUT_LINES);
    let output = if output.is_empty() {
        "no output".to_string()
    } else {
        format!("output: {}", output.replace('\n', " | "))
    };
    if run.timed_out {
        Err(format!(
            "the validation command `{shown}` did not finish within {} s and was killed ({output})",
            timeout.as_secs_f32()
        ))
    } else if !run.success {
        Err(format!(
            "the validation command `{shown}` failed with {} ({output})",
            run.status
        ))
    } else {
        Ok(format!("`{shown}` passed"))
    }
}

/// Validates the module in `status` (just loaded, or found loaded): the devices, waiting up to
/// `config.device_wait` when `after_load`, then the command; records the outcome in `lock_dir`.
/// `Ok` with what was proven, `Err` with what is missing.
pub fn validate_loaded(
    config: &ValidationConfig,
    host: &HostRoot,
    lock_dir: &Path,
    status: &ModuleStatus,
    after_load: bool,
) -> Result<String, String> {
    let version = status.loaded_version().unwrap_or_default().to_string();
    let wait = if after_load {
        config.device_wait
    } else {
        Duration::ZERO
    };
    let outcome = wait_for_devices(host, wait).and_then(|devices| match &config.command {
        Some(argv) => run_command(argv, config.command_timeout, host, &version)
            .map(|ran| format!("{devices}; {ran}")),
        None => Ok(devices),
    });
    let record = ValidationRecord {
        version,
        srcversion: status.srcversion.clone(),
        command: config.command.clone(),
        passed: outcome.is_ok(),
        message: match &outcome {
            Ok(proven) | Err(proven) => proven.clone(),
        },
    };
    match (record.write(lock_dir), &config.command, outcome) {
        // the probe needs the record only to know the command passed
        (Err(e), Some(_), Ok(_)) => Err(format!(
            "cannot record the validation in {} for the readiness probe: {e}",
            ValidationRecord::path(lock_dir).display()
        )),
        (_, _, outcome) => outcome,
    }
}

/// What the readiness probe checks beyond the loaded version, for a module `version`
/// (`srcversion`): `Err` with why the node is not ready.
pub fn probe_checks(
    config: &ValidationConfig,
    host: &HostRoot,
    lock_dir: &Path,
    version: &str,
    srcversion: Option<&str>,
) -> Result<String, String> {
    if !config.enabled {
        return Ok(String::new());
    }
    let devices = check_devices(host)?;
    let Some(command) = &config.command else {
        return Ok(devices);
    };
    match ValidationRecord::read(lock_dir) {
        Some(record) if record.proves(version, srcversion, command) => {
            Ok(format!("{devices}; {}", record.message))
        }
        Some(record) if record.version == version && !record.passed => {
            Err(format!("its validation failed: {}", record.message))
        }
        _ => Err(format!(
            "the validation command `{}` has not passed for {MODULE_NAME} {version} yet",
            command.join(" ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn a_command_passes_fails_or_times_out_with_its_output_quoted() {
        let host = HostRoot::new("/");
        let passed = run_command(
            &argv(&["sh", "-c", "exit 0"]),
            Duration::from_secs(10),
            &host,
            "2.8.0",
        );
        assert_eq!(passed, Ok("`sh -c exit 0` passed".to_string()));

        let failed = run_command(
            &argv(&["sh", "-c", "echo no cards found; exit 3"]),
            Duration::from_secs(10),
            &host,
            "2.8.0",
        )
        .unwrap_err();
        assert!(
            failed.contains("failed with exit status: 3") && failed.contains("no cards found"),
            "{failed}"
        );

        let slow = run_command(
            &argv(&["sleep", "30"]),
            Duration::from_millis(200),
            &host,
            "2.8.0",
        )
        .unwrap_err();
        assert!(
            slow.contains("did not finish within 0.2 s and was killed"),
            "{slow}"
        );

        let missing = run_command(
            &argv(&["/nonexistent/tt-smi"]),
            Duration::from_secs(1),
            &host,
            "2.8.0",
        )
        .unwrap_err();
        assert!(missing.contains("could not start"), "{missing}");
    }

    #[test]
    fn the_command_sees_the_host_root_and_the_version() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let script = format!(
            "[ \"$TTDP_HOST_ROOT\" = {} ] && [ \"$TT_KMD_VERSION\" = 2.8.0 ]",
            dir.path().display()
        );
        assert!(
            run_command(
                &argv(&["sh", "-c", &script]),
                Duration::from_secs(10),
                &host,
                "2.8.0"
            )
            .is_ok()
        );
    }

    #[test]
    fn a_record_proves_only_its_module_and_command() {
        let dir = tempfile::tempdir().unwrap();
        let record = ValidationRecord {
            version: "2.8.0".into(),
            srcversion: Some("ABC".into()),
            command: Some(argv(&["tt-smi", "-s"])),
            passed: true,
            message: "1 of 1 devices bound".into(),
        };
        record.write(dir.path()).unwrap();
        let read = ValidationRecord::read(dir.path()).unwrap();
        assert_eq!(read, record);
        let command = argv(&["tt-smi", "-s"]);
        assert!(read.proves("2.8.0", Some("ABC"), &command));
        assert!(
            !read.proves("2.8.0", Some("DEF"), &command),
            "another build"
        );
        assert!(
            !read.proves("2.7.0", Some("ABC"), &command),
            "another version"
        );
        assert!(
            !read.proves("2.8.0", Some("ABC"), &argv(&["tt-smi"])),
            "another command"
        );
    }
}
