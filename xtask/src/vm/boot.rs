//! One boot-run-poweroff cycle: `qemu-system-x86_64 -accel tcg` (KVM cannot run a stock kernel on
//! these machines), no network, three serial ports written to files in `run_dir` (console, the
//! scenario's output, its exit status), always under `timeout`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// What one boot produced.
#[derive(Debug)]
pub struct Boot {
    /// The scenario's exit status as reported by `/init`; `None` if the VM never reported one.
    pub exit_code: Option<i32>,
    /// `timeout` had to stop QEMU.
    pub timed_out: bool,
    /// QEMU's own exit status and stderr when it failed.
    pub qemu_error: Option<String>,
    /// The scenario's output (second serial port).
    pub output: String,
    /// The kernel console (first serial port).
    pub console: String,
    /// Where the serial port files are.
    pub run_dir: PathBuf,
    /// Wall-clock time of the cycle.
    pub elapsed: Duration,
}

/// Exit status of `timeout` when it had to stop the command.
const TIMED_OUT: i32 = 124;

/// One VM to boot.
#[derive(Debug)]
pub struct Machine<'a> {
    /// The kernel image.
    pub vmlinuz: &'a Path,
    /// The gzip initramfs.
    pub initrd: &'a Path,
    /// Where the serial port files go.
    pub run_dir: &'a Path,
    /// Wall-clock limit for the whole cycle.
    pub limit: Duration,
    /// Share the host's `/usr` read-only over 9p (mount tag [`HOST_USR_TAG`]).
    pub host_usr: bool,
    /// Share this directory (the agent image's root filesystem) read-only over 9p (mount tag
    /// [`AGENT_IMAGE_TAG`]).
    pub agent_image: Option<&'a Path>,
    /// More host folders shared over 9p.
    pub shares: &'a [Share],
}

/// A host folder shared with the guest over 9p.
#[derive(Debug, Clone)]
pub struct Share {
    /// The host folder.
    pub path: PathBuf,
    /// Its 9p mount tag.
    pub tag: &'static str,
    /// Whether the guest may only read it (else what it writes stays in the host folder, for
    /// the next boot to see).
    pub read_only: bool,
}

/// The 9p mount tag of the agent image's root filesystem (scenario `agent-image` mounts it).
pub const AGENT_IMAGE_TAG: &str = "agentimage";

/// The 9p mount tag of the host's `/usr` (`/init` mounts it).
pub const HOST_USR_TAG: &str = "hostusr";

/// Boots the machine and waits for it to power off (or for its time limit).
pub fn boot(machine: &Machine<'_>) -> Result<Boot> {
    let run_dir = machine.run_dir;
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let console = run_dir.join("console.log");
    let output = run_dir.join("output.log");
    let status_file = run_dir.join("status.log");
    for file in [&console, &output, &status_file] {
        // QEMU appends to nothing: it truncates; removing also clears a previous run's files.
        if file.exists() {
            std::fs::remove_file(file).with_context(|| format!("removing {}", file.display()))?;
        }
    }
    let start = Instant::now();
    let result = qemu(machine, [&console, &output, &status_file])
        .output()
        .context("running qemu-system-x86_64 under timeout")?;
    let elapsed = start.elapsed();

    let read = |path: &Path| {
        std::fs::read(path)
            .map(|b| String::from_utf8_lossy(&b).replace("\r\n", "\n"))
            .unwrap_or_default()
    };
    let timed_out =
        result.status.code() == Some(TIMED_OUT) || result.status.code() == Some(128 + 9);
    let qemu_error = (!result.status.success() && !timed_out).then(|| {
        format!(
            "qemu exited with {}: {}",
            result.status,
            String::from_utf8_lossy(&result.stderr).trim()
        )
    });
    Ok(Boot {
        exit_code: parse_exit_code(&read(&status_file)),
        timed_out,
        qemu_error,
        output: read(&output),
        console: read(&console),
        run_dir: run_dir.to_path_buf(),
        elapsed,
    })
}

/// The `timeout ... qemu-system-x86_64 ...` command for `machine`, its three serial ports written
/// to `serial_files` (console, scenario output, exit status).
fn qemu(machine: &Machine<'_>, serial_files: [&Path; 3]) -> Command {
    let Machine {
        vmlinuz,
        initrd,
        limit,
        host_usr,
        agent_image,
        shares,
        ..
    } = *machine;
    let mut qemu = Command::new("timeout");
    qemu.args([
        "--kill-after=10",
        &limit.as_secs().to_string(),
        "qemu-system-x86_64",
    ])
    .args([
        "-accel",
        "tcg",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ])
    .args(["-m", "1024", "-smp", "2", "-nic", "none"])
    .arg("-kernel")
    .arg(vmlinuz)
    .arg("-initrd")
    .arg(initrd)
    .args(["-append", "console=ttyS0 panic=-1 quiet loglevel=3"]);
    for file in serial_files {
        qemu.arg("-serial").arg(format!("file:{}", file.display()));
    }
    if host_usr {
        qemu.args([
            "-virtfs",
            &format!("local,path=/usr,mount_tag={HOST_USR_TAG},security_model=none,readonly=on"),
        ]);
    }
    for share in shares {
        let access = if share.read_only { ",readonly=on" } else { "" };
        qemu.arg("-virtfs").arg(format!(
            "local,path={},mount_tag={},security_model=none{access}",
            share.path.display(),
            share.tag
        ));
    }
    if let Some(dir) = agent_image {
        // The image's tt-smi bundles native code built for the CPUs of real hosts; TCG's default
        // model (qemu64, no SSE4.2 or POPCNT) stops it with an illegal instruction.
        qemu.args(["-cpu", "max"]);
        qemu.arg("-virtfs").arg(format!(
            "local,path={},mount_tag={AGENT_IMAGE_TAG},security_model=none,readonly=on",
            dir.display()
        ));
    }
    qemu
}

/// Reads `TTDP_VM_EXIT=<code>` written by `/init`.
fn parse_exit_code(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|line| line.trim().strip_prefix("TTDP_VM_EXIT=")?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_is_read_from_the_status_port() {
        assert_eq!(parse_exit_code("TTDP_VM_EXIT=0\r\n"), Some(0));
        assert_eq!(parse_exit_code("noise\nTTDP_VM_EXIT=101\n"), Some(101));
        assert_eq!(parse_exit_code(""), None);
        assert_eq!(parse_exit_code("TTDP_VM_EXIT="), None);
    }
}
