//! Module parameters: the `name=value` string given to `finit_module`, what
//! `/sys/module/<name>/parameters/` shows after the load, and the record of what ttdp loaded the
//! module with (`<lock dir>/<module>.parameters`).
//!
//! Why a record beside sysfs: sysfs shows every parameter the module declares, with its default
//! when none was given, so it cannot tell "set to its default" from "not set". The record says
//! which names ttdp passed, so a parameter removed from the policy still reloads the module.
//! It lives in the lock directory (`/run/ttdp` on the host, a tmpfs): a reboot, which also
//! unloads the module, clears it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ttdp_hostprobe::HostRoot;

use crate::KmodError;
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;

/// The `name=value` pairs of a parameter string (whitespace-separated, as `finit_module` takes
/// them); words without `=` are skipped.
pub fn parameter_pairs(params: &str) -> impl Iterator<Item = (&str, &str)> {
    params.split_whitespace().filter_map(|p| p.split_once('='))
}

/// The loaded parameters of module `name` as sysfs shows them (`parameters/<param>`, trimmed),
/// empty when the module is not loaded or exposes none. Parameters the module does not expose
/// in sysfs (permission 0) cannot be read back and are absent.
pub fn read_parameters(host: &HostRoot, name: &str) -> BTreeMap<String, String> {
    let dir = host.path(format!("/sys/module/{name}/parameters"));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            // a write-only or vanishing parameter is simply not shown
            let value = std::fs::read_to_string(e.path()).ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                value.trim().to_string(),
            ))
        })
        .collect()
}

/// Whether sysfs showing `shown` means the parameter was set to `wanted`: the same text, or the
/// same boolean (the kernel shows `bool` parameters as `Y`/`N` whatever was given).
pub fn value_matches(wanted: &str, shown: &str) -> bool {
    let truth = |v: &str| match v {
        "1" | "y" | "Y" | "on" | "true" => Some(true),
        "0" | "n" | "N" | "off" | "false" => Some(false),
        _ => None,
    };
    wanted == shown
        || matches!(
            (shown, truth(wanted)),
            ("Y", Some(true)) | ("N", Some(false))
        )
}

/// Whether a module showing `loaded` (sysfs) and loaded by ttdp with `applied` (its record,
/// `None` when there is none) runs with `wanted`: every wanted parameter shows its value (or,
/// for one the module does not show in sysfs, the record says it was passed), and no parameter
/// ttdp set before has been dropped from `wanted`.
pub fn parameters_at_target(
    wanted: &str,
    loaded: &BTreeMap<String, String>,
    applied: Option<&str>,
) -> bool {
    let recorded = |name: &str, value: &str| {
        applied.is_some_and(|a| parameter_pairs(a).any(|(n, v)| n == name && v == value))
    };
    let shown = parameter_pairs(wanted).all(|(name, value)| match loaded.get(name) {
        Some(shown) => value_matches(value, shown),
        None => recorded(name, value),
    });
    let dropped = applied.is_some_and(|applied| {
        parameter_pairs(applied).any(|(name, _)| !parameter_pairs(wanted).any(|(n, _)| n == name))
    });
    shown && !dropped
}

/// `name=value` pairs, space-separated and sorted by name: how status and reports show them.
pub fn parameters_text(params: &BTreeMap<String, String>) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The record of the parameters ttdp loaded `module` with, in the module lock directory
/// `lock_dir`: `<lock dir>/<module>.parameters`.
pub fn record_path(lock_dir: &Path, module: &str) -> PathBuf {
    lock_dir.join(format!("{module}.parameters"))
}

/// The recorded parameters at `path` (trimmed), `None` without a record.
pub fn read_record(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

impl<K: Kernel> ModuleInstaller<K> {
    /// The record of the parameters ttdp loaded the module with: `<lock dir>/<module>.parameters`.
    pub fn parameters_record_path(&self) -> PathBuf {
        let lock = self.module_lock_path();
        let dir = lock.parent().unwrap_or(Path::new("/"));
        record_path(dir, &self.config().module)
    }

    /// The parameters ttdp last loaded the module with, `None` when it has no record (never
    /// loaded by ttdp since boot, or by an older agent).
    pub fn applied_parameters(&self) -> Option<String> {
        read_record(&self.parameters_record_path())
    }

    /// Records `params` as what the module was just loaded with.
    pub(crate) fn record_parameters(&self, params: &str) -> Result<(), KmodError> {
        write_record(&self.parameters_record_path(), params)
    }
}

fn write_record(path: &Path, params: &str) -> Result<(), KmodError> {
    let tmp = path.with_extension("parameters.tmp");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| KmodError::io("create", dir, e))?;
    }
    std::fs::write(&tmp, format!("{params}\n")).map_err(|e| KmodError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| KmodError::io("rename", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn wanted_parameters_must_show_their_values() {
        let loaded = map(&[("reset_limit", "5"), ("auto_reset", "Y")]);
        assert!(parameters_at_target("", &loaded, None));
        assert!(parameters_at_target("reset_limit=5", &loaded, None));
        assert!(parameters_at_target(
            "auto_reset=1 reset_limit=5",
            &loaded,
            None
        ));
        assert!(!parameters_at_target("reset_limit=6", &loaded, None));
        assert!(!parameters_at_target("auto_reset=0", &loaded, None));
        assert!(!parameters_at_target("missing=1", &loaded, None));
        // a parameter without a sysfs file (permission 0) is taken from the record
        assert!(parameters_at_target("hidden=1", &loaded, Some("hidden=1")));
        assert!(!parameters_at_target("hidden=2", &loaded, Some("hidden=1")));
    }

    #[test]
    fn a_parameter_dropped_from_the_policy_is_not_at_target() {
        let loaded = map(&[("reset_limit", "5")]);
        assert!(!parameters_at_target("", &loaded, Some("reset_limit=5")));
        assert!(parameters_at_target(
            "reset_limit=5",
            &loaded,
            Some("reset_limit=5")
        ));
        assert!(parameters_at_target("", &loaded, Some("")));
    }

    #[test]
    fn sysfs_parameters_are_read_back_and_the_record_kept() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        assert!(read_parameters(&host, "tenstorrent").is_empty());
        let params = host.path("/sys/module/tenstorrent/parameters");
        std::fs::create_dir_all(&params).unwrap();
        std::fs::write(params.join("reset_limit"), "7\n").unwrap();
        let loaded = read_parameters(&host, "tenstorrent");
        assert_eq!(parameters_text(&loaded), "reset_limit=7");
        let record = dir.path().join("run/tenstorrent.parameters");
        write_record(&record, "reset_limit=7").unwrap();
        assert_eq!(std::fs::read_to_string(record).unwrap(), "reset_limit=7\n");
    }
}
