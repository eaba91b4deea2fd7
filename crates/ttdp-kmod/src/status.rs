//! [`ModuleStatus`]: what sysfs and `/proc` say about a module right now.

use std::collections::BTreeMap;
use std::path::Path;

use ttdp_hostprobe::HostRoot;

use crate::KmodError;
use crate::holders::{DeviceHolder, find_device_holders};
use crate::parameters::{parameters_at_target, read_parameters};

/// The state of one module, read from `/sys/module/<name>/` and `/proc/*/fd` under the host root.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModuleStatus {
    /// Module name, e.g. `tenstorrent`.
    pub name: String,
    /// Whether the module is loaded (sysfs has its `initstate`).
    pub loaded: bool,
    /// `version`, when the module declares one.
    pub version: Option<String>,
    /// `srcversion`, when present.
    pub srcversion: Option<String>,
    /// `refcnt`: open references (each open device file counts).
    pub refcnt: Option<u32>,
    /// `initstate`: `live`, `coming` or `going`.
    pub initstate: Option<String>,
    /// Modules that depend on this one (`holders/`).
    pub module_holders: Vec<String>,
    /// Processes holding the module's device nodes open.
    pub device_holders: Vec<DeviceHolder>,
    /// The loaded parameters as `parameters/` shows them (empty when not loaded).
    pub parameters: BTreeMap<String, String>,
    /// The parameters ttdp loaded the module with (its record, see [`crate::parameters`]);
    /// `None` without a record. Filled by [`crate::ModuleInstaller::status`].
    pub applied_parameters: Option<String>,
    /// The commit the loaded module was built from: the cache record of the loaded version,
    /// when its srcversion is the loaded one's. Filled by [`crate::ModuleInstaller::status`].
    pub source_commit: Option<String>,
    /// The udev rule file on the host (see [`crate::udev_rule`]); `None` when there is none.
    /// Filled by [`crate::ModuleInstaller::status`].
    pub udev_rule: Option<crate::udev_rule::InstalledUdevRule>,
    /// Who signed the loaded module, as `modinfo` shows `signer`: the cache record of the loaded
    /// version, when its srcversion is the loaded one's. Filled by
    /// [`crate::ModuleInstaller::status`].
    pub signer: Option<String>,
}

impl ModuleStatus {
    /// Reads the status of module `name`, looking for holders of files under `device_dir`
    /// (the device's character-device name is taken to be the module name).
    pub fn read(host: &HostRoot, name: &str, device_dir: &Path) -> Result<Self, KmodError> {
        let dir = host.path(format!("/sys/module/{name}"));
        let field = |file: &str| read_field(&dir.join(file));
        let initstate = field("initstate")?;
        let refcnt = match field("refcnt")? {
            Some(text) => Some(text.parse::<u32>().map_err(|e| KmodError::Io {
                action: "parse",
                path: dir.join("refcnt"),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            })?),
            None => None,
        };
        let module_holders = match std::fs::read_dir(dir.join("holders")) {
            Ok(entries) => {
                let mut names: Vec<String> = entries
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                names
            }
            Err(_) => Vec::new(),
        };
        Ok(Self {
            name: name.to_string(),
            loaded: initstate.is_some(),
            version: field("version")?,
            srcversion: field("srcversion")?,
            refcnt,
            initstate,
            module_holders,
            device_holders: find_device_holders(host, device_dir, name),
            parameters: read_parameters(host, name),
            applied_parameters: None,
            source_commit: None,
            udev_rule: None,
            signer: None,
        })
    }

    /// Whether something holds the module (refcnt above 0, a dependent module or a device holder).
    pub fn in_use(&self) -> bool {
        self.refcnt.unwrap_or(0) > 0
            || !self.module_holders.is_empty()
            || !self.device_holders.is_empty()
    }

    /// Whether the module is loaded at `version` with the parameter string `params`
    /// ([`parameters_at_target`]).
    pub fn at_target(&self, version: &str, params: &str) -> bool {
        self.loaded_version() == Some(version)
            && parameters_at_target(params, &self.parameters, self.applied_parameters.as_deref())
    }

    /// The loaded version, `None` when not loaded.
    pub fn loaded_version(&self) -> Option<&str> {
        if self.loaded {
            self.version.as_deref()
        } else {
            None
        }
    }
}

/// The loaded version of module `name` from sysfs alone (no `/proc` walk): cheap enough for a
/// readiness probe. `None` when the module is not loaded or declares no version.
pub fn loaded_version(host: &HostRoot, name: &str) -> Result<Option<String>, KmodError> {
    let dir = host.path(format!("/sys/module/{name}"));
    if read_field(&dir.join("initstate"))?.is_none() {
        return Ok(None);
    }
    read_field(&dir.join("version"))
}

/// Whether module `name` is loaded, from sysfs alone (no `/proc` walk).
pub fn is_loaded(host: &HostRoot, name: &str) -> Result<bool, KmodError> {
    let initstate = host.path(format!("/sys/module/{name}/initstate"));
    Ok(read_field(&initstate)?.is_some())
}

/// A trimmed sysfs attribute, `None` when the file does not exist.
fn read_field(path: &Path) -> Result<Option<String>, KmodError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(KmodError::io("read", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &HostRoot, path: &str, text: &str) {
        let p = root.path(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn a_loaded_module_reports_version_refcnt_and_holders() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        write(&root, "/sys/module/tenstorrent/version", "2.8.0\n");
        write(&root, "/sys/module/tenstorrent/srcversion", "ABCDEF\n");
        write(&root, "/sys/module/tenstorrent/refcnt", "1\n");
        write(&root, "/sys/module/tenstorrent/initstate", "live\n");
        std::fs::create_dir_all(root.path("/sys/module/tenstorrent/holders/tt_helper")).unwrap();
        write(&root, "/proc/77/comm", "train\n");
        std::fs::create_dir_all(root.path("/proc/77/fd")).unwrap();
        std::os::unix::fs::symlink("/dev/tenstorrent/0", root.path("/proc/77/fd/4")).unwrap();

        let status =
            ModuleStatus::read(&root, "tenstorrent", Path::new("/dev/tenstorrent")).unwrap();
        assert!(status.loaded && status.in_use());
        assert_eq!(status.loaded_version(), Some("2.8.0"));
        assert_eq!(status.srcversion.as_deref(), Some("ABCDEF"));
        assert_eq!(status.refcnt, Some(1));
        assert_eq!(status.initstate.as_deref(), Some("live"));
        assert_eq!(status.module_holders, vec!["tt_helper".to_string()]);
        assert_eq!(status.device_holders.len(), 1);
        assert_eq!(
            loaded_version(&root, "tenstorrent").unwrap().as_deref(),
            Some("2.8.0")
        );
        assert!(is_loaded(&root, "tenstorrent").unwrap());
        assert_eq!(
            (
                status.device_holders[0].pid,
                status.device_holders[0].comm.as_str()
            ),
            (77, "train")
        );
    }

    #[test]
    fn an_absent_module_is_not_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let status = ModuleStatus::read(
            &HostRoot::new(dir.path()),
            "tenstorrent",
            Path::new("/dev/tenstorrent"),
        )
        .unwrap();
        assert!(!status.loaded && !status.in_use());
        assert_eq!(status.loaded_version(), None);
        assert_eq!(
            loaded_version(&HostRoot::new(dir.path()), "tenstorrent").unwrap(),
            None
        );
        assert!(!is_loaded(&HostRoot::new(dir.path()), "tenstorrent").unwrap());
    }

    #[test]
    fn a_garbled_refcnt_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        write(&root, "/sys/module/tenstorrent/initstate", "live\n");
        write(&root, "/sys/module/tenstorrent/refcnt", "many\n");
        let err =
            ModuleStatus::read(&root, "tenstorrent", Path::new("/dev/tenstorrent")).unwrap_err();
        assert!(
            err.to_string().contains("sys/module/tenstorrent/refcnt"),
            "{err}"
        );
    }
}
