//! Module parameters as the kernel reads them: the `name=value` string given to `finit_module`,
//! what `/sys/module/<name>/parameters/` shows after the load, and whether the two say the same.
//!
//! Pure functions of text: reading sysfs and the record of what ttdp loaded the module with is
//! `ttdp-kmod`'s (`ttdp_kmod::parameters`).

use std::collections::BTreeMap;

/// The `name=value` pairs of a parameter string (whitespace-separated, as `finit_module` takes
/// them); words without `=` are skipped.
pub fn parameter_pairs(params: &str) -> impl Iterator<Item = (&str, &str)> {
    params.split_whitespace().filter_map(|p| p.split_once('='))
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
}
