//! Module parameters: the `name=value` string given to `finit_module`, what
//! `/sys/module/<name>/parameters/` shows after the load, and the record of what ttdp loaded the
//! module with (`<lock dir>/<module>.parameters`).
//!
//! Why a record beside sysfs: sysfs shows every parameter the module declares, with its default
//! when none was given, so it cannot tell "set to its default" from "not set". The record says
//! which names ttdp passed, so a parameter removed from the policy still reloads the module.
//! It lives in the lock directory (`/run/ttdp` on the host, a tmpfs): a reboot, which also
//! unloads the module, clears it.
//!
//! How the kernel reads the values (`0x10` is `16`, `on` is `Y`) and whether a loaded module runs
//! with the wanted parameters are pure rules the controller needs too: they live in
//! [`ttdp_kmd_types::parameters`] and are re-exported here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ttdp_hostprobe::HostRoot;

pub use ttdp_kmd_types::parameters::{
    kernel_bool, kernel_integer, parameter_pairs, parameters_at_target, parameters_text,
    uninterpreted_values, value_matches,
};

use crate::KmodError;
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;

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

/// The record of the parameters ttdp loaded `module` with, in the module lock directory
/// `lock_dir`: `<lock dir>/<module>.parameters`.
pub fn record_path(lock_dir: &Path, module: &str) -> PathBuf {
    lock_dir.join(format!("{module}.parameters"))
}

/// The recorded parameters at `path` (its first line, trimmed), `None` without a record.
pub fn read_record(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.lines().next().unwrap_or_default().trim().to_string())
}

/// What sysfs showed right after ttdp's load (the record's second line, as
/// [`parameters_text`]), `None` without one (no record, or one written before it was kept).
pub fn read_record_reading(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().nth(1).map(|l| l.trim().to_string())
}

impl<K: Kernel> ModuleInstaller<K> {
    /// The record of the parameters ttdp loaded the module with: `<lock dir>/<module>.parameters`.
    pub fn parameters_record_path(&self) -> PathBuf {
        let lock = self.module_lock_path();
        let dir = lock.parent().unwrap_or(Path::new("/"));
        record_path(dir, &self.config().module)
    }

    /// The parameters ttdp last loaded the module with, `None` when it has no record (never
    /// loaded by ttdp since boot, or by an older agent) or when the record is not about the
    /// module loaded now: sysfs (`loaded`) no longer shows what it showed right after ttdp's
    /// load (someone reloaded the module or wrote a parameter since).
    pub fn applied_parameters(&self, loaded: &BTreeMap<String, String>) -> Option<String> {
        let path = self.parameters_record_path();
        let applied = read_record(&path)?;
        match read_record_reading(&path) {
            Some(reading) if reading != parameters_text(loaded) => None,
            _ => Some(applied),
        }
    }

    /// Records `params` as what the module was just loaded with, and what sysfs shows now.
    pub(crate) fn record_parameters(&self, params: &str) -> Result<(), KmodError> {
        let reading = parameters_text(&read_parameters(self.host(), &self.config().module));
        write_record(&self.parameters_record_path(), params, &reading)
    }
}

fn write_record(path: &Path, params: &str, reading: &str) -> Result<(), KmodError> {
    let tmp = path.with_extension("parameters.tmp");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| KmodError::io("create", dir, e))?;
    }
    std::fs::write(&tmp, format!("{params}\n{reading}\n"))
        .map_err(|e| KmodError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| KmodError::io("rename", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        write_record(&record, "reset_limit=7", "reset_limit=7").unwrap();
        assert_eq!(read_record(&record).as_deref(), Some("reset_limit=7"));
        assert_eq!(
            read_record_reading(&record).as_deref(),
            Some("reset_limit=7")
        );
    }
}
