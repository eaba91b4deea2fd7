//! Finds the host tools `cargo xtask vm-test` needs, or fails with the command that installs them.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use super::elf::is_static_elf;
use super::headers::{self, Headers};

/// Programs run by the harness and the Debian package that provides each.
const PROGRAMS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("cpio", "cpio"),
    ("gzip", "gzip"),
    ("make", "make"),
    ("strip", "binutils"),
    ("tar", "tar"),
    ("timeout", "coreutils"),
    ("apt-get", "apt"),
    ("dpkg-deb", "dpkg"),
    ("git", "git"),
    // scenario udev runs the host's udevadm and systemd-udevd in the guest
    ("udevadm", "udev"),
];

/// Where busybox-static puts its binary.
const BUSYBOX: &str = "/bin/busybox";

/// What was found on the host.
#[derive(Debug)]
pub struct HostTools {
    /// A statically linked busybox for the guest.
    pub busybox: PathBuf,
    /// The newest installed Debian 12 amd64 kernel headers.
    pub headers: Headers,
}

/// Checks every tool; on any miss, fails listing all misses and the install commands.
pub fn check() -> Result<HostTools> {
    let mut missing: Vec<(String, String)> = PROGRAMS
        .iter()
        .filter(|(program, _)| find_on_path(program).is_none())
        .map(|(program, package)| (program.to_string(), package.to_string()))
        .collect();

    let busybox = PathBuf::from(BUSYBOX);
    match std::fs::read(&busybox) {
        Ok(bytes) if is_static_elf(&bytes) => {}
        Ok(_) => missing.push((
            format!("{BUSYBOX} (it is dynamically linked)"),
            "busybox-static".into(),
        )),
        Err(_) => missing.push((BUSYBOX.into(), "busybox-static".into())),
    }

    let headers = headers::newest_installed();
    if headers.is_none() {
        let package =
            headers::offered_package().unwrap_or_else(|| "linux-headers-6.1.0-<abi>-amd64".into());
        missing.push((format!("/usr/src/{package}"), package));
    }

    match (missing.is_empty(), headers) {
        (true, Some(headers)) => Ok(HostTools { busybox, headers }),
        _ => {
            let what: Vec<String> = missing
                .iter()
                .map(|(thing, package)| format!("  {thing} (package {package})"))
                .collect();
            let mut packages: Vec<&str> = missing
                .iter()
                .map(|(_, package)| package.as_str())
                .collect();
            packages.sort_unstable();
            packages.dedup();
            bail!(
                "the VM test cannot run: missing on this host:\n{}\ninstall everything with `sudo bash .ci/vm-deps` \
                 (Debian 12), or: sudo apt-get install -y --no-install-recommends {}",
                what.join("\n"),
                packages.join(" ")
            )
        }
    }
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
