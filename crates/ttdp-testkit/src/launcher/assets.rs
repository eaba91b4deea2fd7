//! Where the control-plane binaries come from.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::LaunchError;

/// A folder holding `bin/` with the four binaries, or a `control-plane-*.tar.xz` archive of
/// one.
pub const ASSETS_ENV: &str = "TTDP_KUBE_ASSETS";

/// A folder holding `bin/kubelet` and `bin/kube-proxy`, or a `node-*.tar.xz` archive of one:
/// the real node's binaries.
pub const NODE_ASSETS_ENV: &str = "TTDP_KUBE_NODE_ASSETS";

/// The binaries a real node runs.
const NODE_BINARIES: [&str; 2] = ["kubelet", "kube-proxy"];

/// The binaries the launcher runs.
const BINARIES: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// The folder whose `bin/` holds etcd, kube-apiserver, kube-controller-manager and
/// kube-scheduler.
#[derive(Debug, Clone)]
pub struct Assets {
    bin: PathBuf,
}

impl Assets {
    /// `TTDP_KUBE_ASSETS`, else the archive in `../shared/kube` beside the repository; an
    /// archive is unpacked once under the target directory.
    pub fn locate() -> Result<Assets, LaunchError> {
        Assets::locate_set(ASSETS_ENV, "control-plane-", &BINARIES)
    }

    /// The real node's kubelet and kube-proxy: `TTDP_KUBE_NODE_ASSETS`, else the
    /// `node-*.tar.xz` archive in `../shared/kube`, unpacked once like [`Assets::locate`]'s.
    pub fn locate_node() -> Result<Assets, LaunchError> {
        Assets::locate_set(NODE_ASSETS_ENV, "node-", &NODE_BINARIES)
    }

    fn locate_set(env: &str, prefix: &str, names: &[&str]) -> Result<Assets, LaunchError> {
        let source = match std::env::var_os(env) {
            Some(path) => PathBuf::from(path),
            None => shared_archive(env, prefix)?,
        };
        if source.is_dir() {
            return Assets::holding(&source, names);
        }
        if source.is_file() {
            return Assets::unpacked(&source, names);
        }
        Err(LaunchError::MissingAssets(format!(
            "{} does not exist",
            source.display()
        )))
    }

    /// The binaries in `folder/bin`.
    pub fn in_folder(folder: &Path) -> Result<Assets, LaunchError> {
        Assets::holding(folder, &BINARIES)
    }

    /// `folder/bin`, if it holds every one of `names`.
    fn holding(folder: &Path, names: &[&str]) -> Result<Assets, LaunchError> {
        let bin = folder.join("bin");
        let mut missing = names.to_vec();
        missing.retain(|name| !bin.join(name).is_file());
        if missing.is_empty() {
            return Ok(Assets { bin });
        }
        let lacking = format!("{} lacks {}", bin.display(), missing.join(", "));
        Err(LaunchError::MissingAssets(lacking))
    }

    /// The binaries of `archive`, unpacked under the target directory on first use (into a
    /// temporary folder renamed into place, so concurrent test processes never see half of it).
    fn unpacked(archive: &Path, names: &[&str]) -> Result<Assets, LaunchError> {
        let stem = archive
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| n.trim_end_matches(".tar.xz").to_string())
            .unwrap_or_else(|| "control-plane".to_string());
        let parent = kube_dir();
        let folder = parent.join(stem);
        if let Ok(assets) = Assets::holding(&folder, names) {
            return Ok(assets);
        }
        std::fs::create_dir_all(&parent).map_err(LaunchError::io(parent.display()))?;
        let staging = tempfile::tempdir_in(&parent).map_err(LaunchError::io("a staging folder"))?;
        let status = Command::new("tar")
            .arg("-xJf")
            .arg(archive)
            .arg("-C")
            .arg(staging.path())
            .status()
            .map_err(LaunchError::io("running tar"))?;
        if !status.success() {
            return Err(LaunchError::MissingAssets(format!(
                "tar -xJf {} failed ({status})",
                archive.display()
            )));
        }
        // Another process may have won the race: its copy is as good as ours.
        let _ = std::fs::rename(staging.keep(), &folder);
        Assets::holding(&folder, names)
    }

    /// The path of one binary.
    pub fn binary(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }
}

/// `../shared/kube/<prefix>*.tar.xz` beside the repository (`env` names the variable that would
/// have said otherwise).
fn shared_archive(env: &str, prefix: &str) -> Result<PathBuf, LaunchError> {
    let folder = repo_root().join("../shared/kube");
    let entries = std::fs::read_dir(&folder).map_err(|e| {
        LaunchError::MissingAssets(format!("{env} is not set and {}: {e}", folder.display()))
    })?;
    entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".tar.xz"))
        })
        .max()
        .ok_or_else(|| {
            LaunchError::MissingAssets(format!(
                "{env} is not set and {} holds no {prefix}*.tar.xz",
                folder.display()
            ))
        })
}

/// The repository's root (this crate is `crates/ttdp-testkit`).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `<target>/ttdp-kube`, the target being `CARGO_TARGET_DIR`, else the repository's `target/`.
pub(super) fn kube_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from);
    target
        .unwrap_or_else(|| repo_root().join("target"))
        .join("ttdp-kube")
}

/// Where control-plane runs keep their folders: `<target>/ttdp-kube/runs`.
pub fn runs_dir() -> PathBuf {
    kube_dir().join("runs")
}
