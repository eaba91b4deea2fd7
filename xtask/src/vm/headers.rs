//! The Debian 12 kernel headers the stub module is built against
//! (`linux-headers-6.1.0-<abi>-amd64` under `/usr/src`); the VM boots the kernel image of the
//! same release.

use std::path::PathBuf;
use std::process::Command;

/// The kernel headers the stub module is built against; the VM boots the image of the same ABI.
#[derive(Debug, Clone)]
pub struct Headers {
    /// Kernel release, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The build tree, `/usr/src/linux-headers-<release>`.
    pub dir: PathBuf,
}

/// The ABI number in `6.1.0-<abi>-amd64`.
fn abi_of(release: &str) -> Option<u32> {
    release
        .strip_prefix("6.1.0-")?
        .strip_suffix("-amd64")?
        .parse()
        .ok()
}

/// The `/usr/src/linux-headers-6.1.0-<abi>-amd64` with a Makefile and the highest ABI.
pub fn newest_installed() -> Option<Headers> {
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
pub fn offered_package() -> Option<String> {
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
