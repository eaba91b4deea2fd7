//! Finds the host tools `cargo xtask vm-test` needs, or fails with the command that installs them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

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
];

/// Where busybox-static puts its binary.
const BUSYBOX: &str = "/bin/busybox";

/// The kernel headers the stub module is built against; the VM boots the image of the same ABI.
#[derive(Debug, Clone)]
pub struct Headers {
    /// Kernel release, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The build tree, `/usr/src/linux-headers-<release>`.
    pub dir: PathBuf,
}

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
        Ok(bytes) if super::vm_initramfs::is_static_elf(&bytes) => {}
        Ok(_) => missing.push((
            format!("{BUSYBOX} (it is dynamically linked)"),
            "busybox-static".into(),
        )),
        Err(_) => missing.push((BUSYBOX.into(), "busybox-static".into())),
    }

    let headers = newest_installed_headers();
    if headers.is_none() {
        let package =
            offered_headers_package().unwrap_or_else(|| "linux-headers-6.1.0-<abi>-amd64".into());
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

/// The ABI number in `6.1.0-<abi>-amd64`.
fn abi_of(release: &str) -> Option<u32> {
    release
        .strip_prefix("6.1.0-")?
        .strip_suffix("-amd64")?
        .parse()
        .ok()
}

/// `/usr/src/linux-headers-6.1.0-<abi>-amd64` with a Makefile, highest ABI first.
fn newest_installed_headers() -> Option<Headers> {
    let entries = std::fs::read_dir("/usr/src").ok()?;
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let release = name.strip_prefix("linux-headers-")?.to_string();
            let abi = abi_of(&release)?;
            entry.path().join("Makefile").is_file().then(|| {
                (
                    abi,
                    Headers {
                        release,
                        dir: entry.path(),
                    },
                )
            })
        })
        .max_by_key(|(abi, _)| *abi)
        .map(|(_, headers)| headers)
}

/// The `linux-headers-6.1.0-<abi>-amd64` package apt would install now, if apt knows.
fn offered_headers_package() -> Option<String> {
    let output = Command::new("apt-cache")
        .args(["depends", "linux-headers-amd64"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends: "))
        .find(|dep| {
            dep.strip_prefix("linux-headers-")
                .and_then(abi_of)
                .is_some()
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_is_read_from_debian_release_names() {
        assert_eq!(abi_of("6.1.0-57-amd64"), Some(57));
        assert_eq!(abi_of("6.1.0-57-common"), None);
        assert_eq!(abi_of("6.1.0-57-rt-amd64"), None);
        assert_eq!(abi_of("6.12.0-1-amd64"), None);
    }
}
