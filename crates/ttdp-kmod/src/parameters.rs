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

/// Whether sysfs showing `shown` means the parameter was set to `wanted`, the way the kernel
/// reads the value and prints it back: the same text; the same boolean (`bool` and `invbool`
/// parameters take what [`kernel_bool`] reads and show `Y`/`N`); or the same integer (integer
/// parameters take what [`kernel_integer`] reads, `0x10`, `020`, `+16`, and show it in decimal,
/// `hexint` ones as `0x%08x`). Any other difference is a difference.
pub fn value_matches(wanted: &str, shown: &str) -> bool {
    if wanted == shown {
        return true;
    }
    match shown {
        "Y" => kernel_bool(wanted) == Some(true),
        "N" => kernel_bool(wanted) == Some(false),
        _ => kernel_integer(wanted).is_some_and(|w| kernel_integer(shown) == Some(w)),
    }
}

/// The boolean the kernel's `kstrtobool` reads `value` as (it looks at the first characters
/// only: `y`, `t`, `1`, `on` are true; `n`, `f`, `0`, `off` are false, in either case), `None`
/// when it reads none (the kernel then refuses the value).
pub fn kernel_bool(value: &str) -> Option<bool> {
    let mut chars = value.chars().map(|c| c.to_ascii_lowercase());
    match chars.next()? {
        'y' | 't' | '1' => Some(true),
        'n' | 'f' | '0' => Some(false),
        'o' => match chars.next()? {
            'n' => Some(true),
            'f' => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// The integer the kernel's `kstrto*` with base 0 (how integer module parameters are parsed)
/// reads `value` as: an optional `+` or `-`, then `0x`/`0X` and hex digits, `0` and octal
/// digits, or decimal digits. `None` when it is not such an integer (or does not fit 64 bits).
pub fn kernel_integer(value: &str) -> Option<i128> {
    let (negative, digits) = match value.as_bytes().first()? {
        b'-' => (true, &value[1..]),
        b'+' => (false, &value[1..]),
        _ => (false, value),
    };
    let hex = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
        // "0x" without a hex digit after it is read as octal 0 followed by junk
        .filter(|rest| rest.starts_with(|c: char| c.is_ascii_hexdigit()));
    let (radix, digits) = match hex {
        Some(rest) => (16, rest),
        None if digits.len() > 1 && digits.starts_with('0') => (8, &digits[1..]),
        None => (10, digits),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u64::from_str_radix(digits, radix).ok()?;
    let magnitude = i128::from(magnitude);
    Some(if negative { -magnitude } else { magnitude })
}

/// Whether [`value_matches`] can say for sure whether `shown` is `wanted`: sysfs shows a
/// boolean and `wanted` is one, or both are integers.
fn interpretable(wanted: &str, shown: &str) -> bool {
    match shown {
        "Y" | "N" => kernel_bool(wanted).is_some(),
        _ => kernel_integer(wanted).is_some() && kernel_integer(shown).is_some(),
    }
}

/// The wanted parameters whose sysfs value differs from the wanted one in a way
/// [`value_matches`] cannot interpret, as `name: wanted "…", sysfs shows "…"`: taken as loaded
/// only because ttdp's record says the module was loaded with exactly that value (a reload
/// would show the same).
pub fn uninterpreted_values(wanted: &str, loaded: &BTreeMap<String, String>) -> Vec<String> {
    parameter_pairs(wanted)
        .filter_map(|(name, value)| {
            let shown = loaded.get(name)?;
            (value != shown && !interpretable(value, shown))
                .then(|| format!("{name}: wanted \"{value}\", sysfs shows \"{shown}\""))
        })
        .collect()
}

/// Whether a module showing `loaded` (sysfs) and loaded by ttdp with `applied` (its record,
/// `None` when there is none) runs with `wanted`: every wanted parameter shows its value (or,
/// for one the module does not show in sysfs, or shows in a form [`value_matches`] cannot
/// compare, the record says it was passed: reloading with it would show the same again), and
/// no parameter ttdp set before has been dropped from `wanted`.
pub fn parameters_at_target(
    wanted: &str,
    loaded: &BTreeMap<String, String>,
    applied: Option<&str>,
) -> bool {
    let recorded = |name: &str, value: &str| {
        applied.is_some_and(|a| parameter_pairs(a).any(|(n, v)| n == name && v == value))
    };
    let shown = parameter_pairs(wanted).all(|(name, value)| match loaded.get(name) {
        Some(shown) if interpretable(value, shown) => value_matches(value, shown),
        Some(shown) => value == shown || recorded(name, value),
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
    fn every_form_the_kernel_reads_matches_what_sysfs_prints() {
        for (wanted, shown) in [
            ("16", "16"),
            ("0x10", "16"),
            ("0X10", "16"),
            ("020", "16"),
            ("+16", "16"),
            ("+0x10", "16"),
            ("-5", "-5"),
            ("0", "0"),
            ("00", "0"),
            ("16", "0x00000010"), // a hexint parameter
            ("0xff", "0x000000ff"),
            ("18446744073709551615", "18446744073709551615"),
        ] {
            assert!(value_matches(wanted, shown), "{wanted} shown as {shown}");
        }
        // kstrtobool reads the first characters only: "16" is true
        for wanted in [
            "1", "y", "Y", "yes", "t", "true", "TRUE", "on", "On", "oN", "16",
        ] {
            assert!(value_matches(wanted, "Y"), "{wanted} is true");
            assert!(!value_matches(wanted, "N"), "{wanted} is not false");
        }
        for wanted in ["0", "n", "N", "no", "f", "false", "off", "OFF", "0x1"] {
            assert!(value_matches(wanted, "N"), "{wanted} is false");
            assert!(!value_matches(wanted, "Y"), "{wanted} is not true");
        }
        for (wanted, shown) in [
            ("0x11", "16"),
            ("010", "10"), // octal 8
            ("08", "8"),   // not octal: the kernel refuses it
            ("0x", "0"),
            ("-+5", "-5"),
            ("5 ", "5"),
            ("o", "N"),
            ("maybe", "Y"),
            ("fast", "FAST"),
        ] {
            assert!(!value_matches(wanted, shown), "{wanted} is not {shown}");
        }
    }

    #[test]
    fn a_value_sysfs_shows_otherwise_is_taken_from_the_record_only_when_uninterpretable() {
        let loaded = map(&[("mode", "fast"), ("reset_limit", "16"), ("auto_reset", "N")]);
        let wanted = "mode=FAST reset_limit=0x10 auto_reset=off";
        assert!(!parameters_at_target(wanted, &loaded, None));
        assert!(parameters_at_target(wanted, &loaded, Some(wanted)));
        assert_eq!(
            uninterpreted_values(wanted, &loaded),
            vec![r#"mode: wanted "FAST", sysfs shows "fast""#.to_string()]
        );
        // what can be compared is compared, whatever the record says
        let changed = map(&[("mode", "fast"), ("reset_limit", "3"), ("auto_reset", "N")]);
        assert!(!parameters_at_target(wanted, &changed, Some(wanted)));
        let flipped = map(&[("mode", "fast"), ("reset_limit", "16"), ("auto_reset", "Y")]);
        assert!(!parameters_at_target(wanted, &flipped, Some(wanted)));
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
        write_record(&record, "reset_limit=7", "reset_limit=7").unwrap();
        assert_eq!(read_record(&record).as_deref(), Some("reset_limit=7"));
        assert_eq!(
            read_record_reading(&record).as_deref(),
            Some("reset_limit=7")
        );
    }
}
