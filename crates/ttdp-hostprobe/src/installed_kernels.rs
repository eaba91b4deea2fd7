//! [`installed_kernels`]: every kernel installed on the host, not only the running one: what
//! the node may boot into next.

use std::path::PathBuf;

use crate::HostRoot;
use crate::error::{ProbeError, list_optional};
use crate::kernel::{BuildTree, build_tree};

/// Host directory holding one directory per installed kernel release.
pub const MODULES_DIR: &str = "/lib/modules";
/// Host directory of the kernel images (`vmlinuz-<release>`).
pub const BOOT_DIR: &str = "/boot";

/// One kernel installed on the host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstalledKernel {
    /// Its release, e.g. `6.1.0-58-amd64` (`uname -r` once booted).
    pub release: String,
    /// Its build tree (`/lib/modules/<release>/build`).
    pub build_tree: BuildTree,
    /// Whether its image is installed: `/boot/vmlinuz-<release>`, or the modules its image
    /// package puts in `/lib/modules/<release>/kernel/` (a pod that does not mount `/boot`
    /// still sees those).
    pub has_image: bool,
}

impl InstalledKernel {
    /// Whether modules can be built for it here: its headers are installed.
    pub fn has_headers(&self) -> bool {
        self.build_tree.usable_dir().is_some()
    }

    /// The host path of its image.
    pub fn image_path(&self) -> PathBuf {
        PathBuf::from(format!("{BOOT_DIR}/vmlinuz-{}", self.release))
    }
}

/// Every kernel installed on the host, sorted by release: each `/lib/modules/<release>` that
/// has a usable build tree (headers) or whose image is installed (`/boot/vmlinuz-<release>`,
/// or its modules in `/lib/modules/<release>/kernel/`). A modules directory with neither (what
/// DKMS leaves of a removed kernel) is not a kernel the node can boot or build for, and is left
/// out. The running kernel is listed like any other.
pub fn installed_kernels(host: &HostRoot) -> Result<Vec<InstalledKernel>, ProbeError> {
    let dir = host.path(MODULES_DIR);
    let names = match list_optional(&dir)? {
        Some(names) => names,
        None => return Ok(Vec::new()),
    };
    let mut kernels: Vec<InstalledKernel> = names
        .into_iter()
        .filter(|name| is_release_name(name) && dir.join(name).is_dir())
        .map(|release| InstalledKernel {
            build_tree: build_tree(host, &release),
            has_image: host.path(format!("{BOOT_DIR}/vmlinuz-{release}")).is_file()
                || dir.join(&release).join("kernel").is_dir(),
            release,
        })
        .filter(|k| k.has_image || k.has_headers())
        .collect();
    kernels.sort_by(|a, b| a.release.cmp(&b.release));
    Ok(kernels)
}

/// Whether `name` can be a kernel release: not hidden, no path separator, printable ASCII.
pub fn is_release_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'+' | b'~'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> (tempfile::TempDir, HostRoot) {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        (dir, root)
    }

    fn write(root: &HostRoot, path: &str) {
        let p = root.path(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "x").unwrap();
    }

    fn headers(root: &HostRoot, release: &str) {
        write(root, &format!("/usr/src/linux-headers-{release}/Makefile"));
        let link = root.path(format!("/lib/modules/{release}/build"));
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(format!("/usr/src/linux-headers-{release}"), link).unwrap();
    }

    #[test]
    fn kernels_with_headers_or_an_image_are_installed() {
        let (_d, root) = host();
        headers(&root, "6.1.0-57-amd64");
        // an image without headers: installed, nothing can be built for it
        std::fs::create_dir_all(root.path("/lib/modules/6.1.0-58-amd64")).unwrap();
        write(&root, "/boot/vmlinuz-6.1.0-58-amd64");
        // its modules, seen by a pod without /boot
        std::fs::create_dir_all(root.path("/lib/modules/6.1.0-59-amd64/kernel/drivers")).unwrap();
        // a modules directory left behind by a removed kernel
        std::fs::create_dir_all(root.path("/lib/modules/6.1.0-31-amd64/updates/dkms")).unwrap();
        // headers without a Makefile are no usable tree
        std::fs::create_dir_all(root.path("/lib/modules/6.1.0-30-amd64/build")).unwrap();
        // not a kernel release
        std::fs::create_dir_all(root.path("/lib/modules/.hidden")).unwrap();
        write(&root, "/lib/modules/modules.conf");

        let kernels = installed_kernels(&root).unwrap();
        let found: Vec<(&str, bool, bool)> = kernels
            .iter()
            .map(|k| (k.release.as_str(), k.has_headers(), k.has_image))
            .collect();
        assert_eq!(
            found,
            vec![
                ("6.1.0-57-amd64", true, false),
                ("6.1.0-58-amd64", false, true),
                ("6.1.0-59-amd64", false, true)
            ]
        );
        assert_eq!(
            kernels[1].image_path(),
            PathBuf::from("/boot/vmlinuz-6.1.0-58-amd64")
        );
    }

    #[test]
    fn a_host_without_lib_modules_has_no_kernels() {
        let (_d, root) = host();
        assert!(installed_kernels(&root).unwrap().is_empty());
    }

    #[test]
    fn release_names_are_plain() {
        assert!(is_release_name("6.1.0-58-amd64"));
        assert!(is_release_name("6.12.118+deb13-amd64"));
        assert!(is_release_name("6.8.0-sim"));
        for bad in ["", ".lock", "a/b", "a b", ".."] {
            assert!(!is_release_name(bad), "{bad:?}");
        }
    }
}
