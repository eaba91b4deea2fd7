//! What scenario `agent-image` needs from the agent image users get: its OCI archive (built by
//! `cargo xtask image agent`, or reused when its inputs did not change) unpacked into a root
//! filesystem that the guest mounts read-only over 9p and runs the agent from (`chroot`, with
//! the image config's environment and the DaemonSet's mounts), and the stub module built on
//! the host by the image's own toolchain against the VM kernel's headers, mounted the way the
//! DaemonSet mounts the host's.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::image::{self, Which};
use crate::image_test::{IMAGE_STUB_VERSION, build_stub_module, container::Container};

/// Directories a container runtime would create as mount points: the DaemonSet's host paths
/// under `/host` and the kernel build tree at its own paths. The guest cannot create them on
/// the read-only 9p mount.
const MOUNT_POINTS: [&str; 11] = [
    "host/sys",
    "host/proc",
    "host/lib/modules",
    "host/usr/src",
    "host/var/lib/dkms",
    "host/var/cache/tt-kmd",
    "host/usr/local/bin",
    "host/run/ttdp",
    "host/dev",
    "usr/lib/modules",
    "usr/src",
];

/// The prepared image for one boot.
#[derive(Debug)]
pub struct AgentImage {
    /// The unpacked root filesystem (shared over 9p).
    pub rootfs: PathBuf,
    /// The stub module the image's toolchain built (copied into the initramfs).
    pub ko: PathBuf,
    /// Variables for the guest: the image config's environment (`TTDP_VM_IMAGE_ENV`, one
    /// `KEY=value` per line) and the stub module's version.
    pub guest_env: Vec<(String, String)>,
}

/// Builds (or reuses) the agent image and prepares it under `<cache>/agent-image/`.
pub fn prepare(root: &Path, cache: &Path) -> Result<AgentImage> {
    let built = image::build(Which::Agent, None)?;
    let dir = cache.join("agent-image");
    let rootfs = dir.join("rootfs");
    let marker = dir.join("unpacked-digest");
    let current = std::fs::read_to_string(&marker).unwrap_or_default();
    if current.trim() != built.archive.digest || !rootfs.is_dir() {
        if rootfs.exists() {
            std::fs::remove_dir_all(&rootfs)
                .with_context(|| format!("clearing {}", rootfs.display()))?;
        }
        built.archive.unpack(&rootfs)?;
        for point in MOUNT_POINTS {
            std::fs::create_dir_all(rootfs.join(point))
                .with_context(|| format!("creating mount point {point}"))?;
        }
        std::fs::write(&marker, &built.archive.digest).context("writing the unpack marker")?;
    }
    let storage = image::image_dir(root)?.join("buildah");
    let ctr = Container::from_archive(&storage, &built.archive.path)?;
    let ko = build_stub_module(root, &dir.join("stub-module"), &ctr)?;
    let env: Vec<String> = built
        .archive
        .config_env()?
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    Ok(AgentImage {
        rootfs,
        ko,
        guest_env: vec![
            ("TTDP_VM_IMAGE_ENV".into(), env.join("\n")),
            ("TTDP_VM_IMAGE_KO_VERSION".into(), IMAGE_STUB_VERSION.into()),
            ("TTDP_VM_IMAGE_DIGEST".into(), built.archive.digest.clone()),
        ],
    })
}
