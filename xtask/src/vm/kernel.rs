//! The Debian kernel image the VM boots: `linux-image-<release>` fetched with `apt-get download`
//! (never installed). Only `boot/vmlinuz-<release>` and the modules a guest needs to mount a host
//! folder over 9p (Debian's 6.1 has no virtio or 9p built in) are unpacked, into
//! `<cache>/kernel/<release>/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::headers::Headers;

/// A bootable kernel whose release matches the headers the stub module is built against.
#[derive(Debug)]
pub struct Kernel {
    /// Kernel release, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The compressed kernel image for `qemu -kernel`.
    pub vmlinuz: PathBuf,
    /// The virtio and 9p modules, in the order they must be loaded.
    pub ninep_modules: Vec<PathBuf>,
}

/// The modules (path under `lib/modules/<release>/kernel/`) for a 9p mount, in load order.
const NINEP_MODULES: &[&str] = &[
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko",
    "drivers/virtio/virtio_pci.ko",
    "net/9p/9pnet.ko",
    "net/9p/9pnet_virtio.ko",
    "fs/netfs/netfs.ko",
    "fs/fscache/fscache.ko",
    "fs/9p/9p.ko",
];

/// Returns the cached kernel for `headers.release`, downloading it first if needed.
pub fn ensure(cache: &Path, headers: &Headers) -> Result<Kernel> {
    let release = headers.release.clone();
    let dir = cache.join("kernel").join(&release);
    let vmlinuz = dir.join(format!("vmlinuz-{release}"));
    let ninep_dir = dir.join("9p");
    let ninep_modules: Vec<PathBuf> = NINEP_MODULES
        .iter()
        .map(|m| ninep_dir.join(module_file_name(m)))
        .collect();
    if vmlinuz.is_file() && ninep_modules.iter().all(|m| m.is_file()) {
        return Ok(Kernel {
            release,
            vmlinuz,
            ninep_modules,
        });
    }

    let download = dir.join("download");
    if download.exists() {
        std::fs::remove_dir_all(&download)
            .with_context(|| format!("removing {}", download.display()))?;
    }
    std::fs::create_dir_all(&download)
        .with_context(|| format!("creating {}", download.display()))?;
    let deb = download_image(&download, &release)?;
    let kernel = from_image_deb(&deb, &release, &dir)?;
    std::fs::remove_dir_all(&download)
        .with_context(|| format!("removing {}", download.display()))?;
    Ok(kernel)
}

/// The kernel `release` of the image package `deb` (`linux-image-<release>`), unpacked into
/// `dir` (`vmlinuz-<release>` and `9p/`) unless it already is.
pub fn from_image_deb(deb: &Path, release: &str, dir: &Path) -> Result<Kernel> {
    let vmlinuz = dir.join(format!("vmlinuz-{release}"));
    let ninep_dir = dir.join("9p");
    let ninep_modules: Vec<PathBuf> = NINEP_MODULES
        .iter()
        .map(|m| ninep_dir.join(module_file_name(m)))
        .collect();
    let kernel = Kernel {
        release: release.to_owned(),
        vmlinuz: vmlinuz.clone(),
        ninep_modules: ninep_modules.clone(),
    };
    if vmlinuz.is_file() && ninep_modules.iter().all(|m| m.is_file()) {
        return Ok(kernel);
    }
    let unpacked = dir.join("unpacked");
    if unpacked.exists() {
        std::fs::remove_dir_all(&unpacked)
            .with_context(|| format!("removing {}", unpacked.display()))?;
    }
    unpack(deb, &unpacked, release)?;
    std::fs::create_dir_all(&ninep_dir)
        .with_context(|| format!("creating {}", ninep_dir.display()))?;
    for (member, module) in NINEP_MODULES.iter().zip(&ninep_modules) {
        let from = unpacked.join(format!("lib/modules/{release}/kernel/{member}"));
        std::fs::rename(&from, module)
            .with_context(|| format!("moving {} to {}", from.display(), module.display()))?;
    }
    let from = unpacked.join(format!("boot/vmlinuz-{release}"));
    std::fs::rename(&from, &vmlinuz)
        .with_context(|| format!("moving {} to {}", from.display(), vmlinuz.display()))?;
    std::fs::remove_dir_all(&unpacked)
        .with_context(|| format!("removing {}", unpacked.display()))?;
    Ok(kernel)
}

/// `apt-get download linux-image-<release>` into `download`; returns the `.deb`.
fn download_image(download: &Path, release: &str) -> Result<PathBuf> {
    let package = format!("linux-image-{release}");
    let status = Command::new("timeout")
        .args([
            "600",
            "apt-get",
            "-q",
            "-o",
            "APT::Sandbox::User=root",
            "download",
            &package,
        ])
        .current_dir(download)
        .status()
        .context("running apt-get download")?;
    if !status.success() {
        bail!(
            "`apt-get download {package}` failed ({status}); the VM boots the image matching the installed \
             linux-headers-{release}: run `apt-get update`, or `sudo bash .ci/vm-deps` to install the headers apt offers now"
        );
    }
    std::fs::read_dir(download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|ext| ext == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", download.display()))
}

/// Unpacks `boot/vmlinuz-<release>` and the [`NINEP_MODULES`] of `deb` into `unpacked`:
/// `dpkg-deb --fsys-tarfile DEB | tar -x -C unpacked ./boot/vmlinuz-<release> ./lib/modules/...`.
fn unpack(deb: &Path, unpacked: &Path, release: &str) -> Result<()> {
    std::fs::create_dir_all(unpacked)
        .with_context(|| format!("creating {}", unpacked.display()))?;
    let members: Vec<String> = std::iter::once(format!("./boot/vmlinuz-{release}"))
        .chain(
            NINEP_MODULES
                .iter()
                .map(|m| format!("./lib/modules/{release}/kernel/{m}")),
        )
        .collect();
    let mut unpack = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("running dpkg-deb")?;
    let tar_input = unpack.stdout.take().context("dpkg-deb has no stdout")?;
    let tar_status = Command::new("tar")
        .args(["-x", "-f", "-", "-C"])
        .arg(unpacked)
        .args(&members)
        .stdin(tar_input)
        .status()
        .context("running tar")?;
    let unpack_status = unpack.wait().context("waiting for dpkg-deb")?;
    if !unpack_status.success() || !tar_status.success() {
        bail!(
            "could not unpack {} from {}",
            members.join(" "),
            deb.display()
        );
    }
    Ok(())
}

/// `fs/9p/9p.ko` -> `9p.ko`.
fn module_file_name(member: &str) -> &str {
    member.rsplit('/').next().unwrap_or(member)
}
