//! Host-managed (DKMS) tt-kmd installs, detected exactly as the spec's "Mixed mode" says.

use std::path::PathBuf;

use crate::HostRoot;
use crate::error::{ProbeError, list_optional};

/// Host path of DKMS's state for the tenstorrent module.
pub const DKMS_STATE_DIR: &str = "/var/lib/dkms/tenstorrent";
/// Host directory holding registered DKMS sources (`tenstorrent-<version>/dkms.conf`).
pub const DKMS_SOURCE_PARENT: &str = "/usr/src";

/// One sign that the host manages tt-kmd itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum DkmsSignal {
    /// `/var/lib/dkms/tenstorrent/` exists: DKMS tracks the module.
    DkmsState {
        /// The host path found.
        path: PathBuf,
        /// Versions DKMS tracks (its version subdirectories), possibly empty.
        versions: Vec<String>,
    },
    /// `/usr/src/tenstorrent-<version>/dkms.conf` exists: a DKMS source is registered.
    DkmsSource {
        /// The host path of the `dkms.conf` found.
        path: PathBuf,
        /// The `<version>` part of the directory name.
        version: String,
    },
}

/// What the host-install probe found. Empty `signals` means the node is not host-managed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostInstall {
    /// Every signal found, DKMS state first, then sources by version.
    pub signals: Vec<DkmsSignal>,
}

impl HostInstall {
    /// Whether the host manages tt-kmd itself, so an installer must stand down and touch nothing.
    pub fn is_host_managed(&self) -> bool {
        !self.signals.is_empty()
    }

    /// Every version named by any signal, sorted and without duplicates.
    pub fn versions(&self) -> Vec<String> {
        let mut versions: Vec<String> = self
            .signals
            .iter()
            .flat_map(|s| match s {
                DkmsSignal::DkmsState { versions, .. } => versions.clone(),
                DkmsSignal::DkmsSource { version, .. } => vec![version.clone()],
            })
            .collect();
        versions.sort();
        versions.dedup();
        versions
    }
}

/// Looks for the spec's two DKMS signals under the host root.
pub fn detect_host_install(host: &HostRoot) -> Result<HostInstall, ProbeError> {
    let mut signals = Vec::new();
    // resolve() follows links the way the host would (absolute targets stay inside the root)
    if let Some(state) = host.resolve(DKMS_STATE_DIR).ok().filter(|p| p.is_dir()) {
        // DKMS keeps one directory per version, plus `kernel-*` links and the `original_module` dir.
        let versions = list_optional(&state)?
            .unwrap_or_default()
            .into_iter()
            .filter(|name| name.starts_with(|c: char| c.is_ascii_digit()))
            .collect();
        signals.push(DkmsSignal::DkmsState {
            path: PathBuf::from(DKMS_STATE_DIR),
            versions,
        });
    }
    for name in list_optional(&host.path(DKMS_SOURCE_PARENT))?.unwrap_or_default() {
        let Some(version) = name.strip_prefix("tenstorrent-") else {
            continue;
        };
        let conf = PathBuf::from(DKMS_SOURCE_PARENT)
            .join(&name)
            .join("dkms.conf");
        if host.resolve(&conf).is_ok_and(|p| p.is_file()) {
            signals.push(DkmsSignal::DkmsSource {
                path: conf,
                version: version.to_string(),
            });
        }
    }
    Ok(HostInstall { signals })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_host_is_not_host_managed() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        std::fs::create_dir_all(root.path("/usr/src/linux-headers-6.8.0")).unwrap();
        // a source directory without dkms.conf is not a signal
        std::fs::create_dir_all(root.path("/usr/src/tenstorrent-1.0.0")).unwrap();
        let found = detect_host_install(&root).unwrap();
        assert!(!found.is_host_managed(), "{found:?}");
    }

    #[test]
    fn dkms_state_dir_is_a_signal_with_its_versions() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        std::fs::create_dir_all(root.path("/var/lib/dkms/tenstorrent/2.0.0/6.8.0/x86_64")).unwrap();
        std::fs::create_dir_all(root.path("/var/lib/dkms/tenstorrent/original_module")).unwrap();
        std::os::unix::fs::symlink(
            "2.0.0/6.8.0/x86_64",
            root.path("/var/lib/dkms/tenstorrent/kernel-6.8.0-x86_64"),
        )
        .unwrap();
        let found = detect_host_install(&root).unwrap();
        assert!(found.is_host_managed());
        assert_eq!(
            found.signals,
            vec![DkmsSignal::DkmsState {
                path: PathBuf::from(DKMS_STATE_DIR),
                versions: vec!["2.0.0".into()]
            }]
        );
    }

    #[test]
    fn signals_behind_absolute_links_are_found_inside_the_host_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        std::fs::create_dir_all(root.path("/data/dkms/tenstorrent/2.0.0")).unwrap();
        std::fs::create_dir_all(root.path("/var/lib/dkms")).unwrap();
        std::os::unix::fs::symlink("/data/dkms/tenstorrent", root.path(DKMS_STATE_DIR)).unwrap();
        let found = detect_host_install(&root).unwrap();
        assert_eq!(found.versions(), vec!["2.0.0".to_string()]);
    }

    #[test]
    fn registered_sources_are_signals_with_their_versions() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        for v in ["1.29", "2.1.0"] {
            let conf = root.path(format!("/usr/src/tenstorrent-{v}/dkms.conf"));
            std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
            std::fs::write(conf, "PACKAGE_NAME=tenstorrent\n").unwrap();
        }
        std::fs::create_dir_all(root.path("/var/lib/dkms/tenstorrent/2.1.0")).unwrap();
        let found = detect_host_install(&root).unwrap();
        assert_eq!(found.signals.len(), 3);
        assert!(
            matches!(&found.signals[1], DkmsSignal::DkmsSource { version, path }
            if version == "1.29" && path == &PathBuf::from("/usr/src/tenstorrent-1.29/dkms.conf"))
        );
        assert_eq!(
            found.versions(),
            vec!["1.29".to_string(), "2.1.0".to_string()]
        );
    }
}
