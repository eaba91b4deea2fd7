//! The Debian kernel image the VM boots: `linux-image-<release>` fetched with `apt-get download`
//! (never installed); only `boot/vmlinuz-<release>` is unpacked, into `<cache>/kernel/<release>/`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::vm_host_tools::Headers;

/// A bootable kernel whose release matches the headers the stub module is built against.
#[derive(Debug)]
pub struct Kernel {
    /// Kernel release, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The compressed kernel image for `qemu -kernel`.
    pub vmlinuz: PathBuf,
}

/// Returns the cached kernel for `headers.release`, downloading it first if needed.
pub fn ensure(cache: &Path, headers: &Headers) -> Result<Kernel> {
    let release = headers.release.clone();
    let dir = cache.join("kernel").join(&release);
    let vmlinuz = dir.join(format!("vmlinuz-{release}"));
    if vmlinuz.is_file() {
        return Ok(Kernel { release, vmlinuz });
    }

    let download = dir.join("download");
    if download.exists() {
        std::fs::remove_dir_all(&download)
            .with_context(|| format!("removing {}", download.display()))?;
    }
    std::fs::create_dir_all(&download)
        .with_context(|| format!("creating {}", download.display()))?;
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
        .current_dir(&download)
        .status()
        .context("running apt-get download")?;
    if !status.success() {
        bail!(
            "`apt-get download {package}` failed ({status}); the VM boots the image matching the installed \
             linux-headers-{release}: run `apt-get update`, or `sudo bash .ci/vm-deps` to install the headers apt offers now"
        );
    }
    let deb = std::fs::read_dir(&download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|ext| ext == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", download.display()))?;

    // dpkg-deb --fsys-tarfile DEB | tar -xO ./boot/vmlinuz-<release> > vmlinuz.partial
    let partial = dir.join("vmlinuz.partial");
    let mut unpack = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(&deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("running dpkg-deb")?;
    let tar_input = unpack.stdout.take().context("dpkg-deb has no stdout")?;
    let tar_status = Command::new("tar")
        .args(["-x", "-O", "-f", "-"])
        .arg(format!("./boot/vmlinuz-{release}"))
        .stdin(tar_input)
        .stdout(File::create(&partial).with_context(|| format!("creating {}", partial.display()))?)
        .status()
        .context("running tar")?;
    let unpack_status = unpack.wait().context("waiting for dpkg-deb")?;
    if !unpack_status.success() || !tar_status.success() {
        bail!(
            "could not unpack boot/vmlinuz-{release} from {}",
            deb.display()
        );
    }
    std::fs::rename(&partial, &vmlinuz)
        .with_context(|| format!("renaming to {}", vmlinuz.display()))?;
    std::fs::remove_dir_all(&download)
        .with_context(|| format!("removing {}", download.display()))?;
    Ok(Kernel { release, vmlinuz })
}
