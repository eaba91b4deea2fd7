//! Ages the way kubectl prints them (`45s`, `3m12s`, `2h5m`, `4d`).

use jiff::{SignedDuration, Timestamp};

/// How long ago `then` was, relative to `now`, in kubectl's short form; `-` when unknown.
pub fn age(then: Option<Timestamp>, now: Timestamp) -> String {
    match then {
        Some(then) => human_duration(now.duration_since(then)),
        None => "-".to_owned(),
    }
}

/// kubectl's `HumanDuration`: second precision under 2 minutes, then coarser as it grows.
pub fn human_duration(d: SignedDuration) -> String {
    let seconds = d.as_secs();
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return with_remainder(minutes, "m", seconds % 60, "s");
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        return with_remainder(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return with_remainder(days, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return with_remainder(years, "y", days % 365, "d");
    }
    format!("{years}y")
}

fn with_remainder(major: i64, major_unit: &str, minor: i64, minor_unit: &str) -> String {
    if minor == 0 {
        format!("{major}{major_unit}")
    } else {
        format!("{major}{major_unit}{minor}{minor_unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: i64) -> String {
        human_duration(SignedDuration::from_secs(s))
    }

    #[test]
    fn matches_kubectl_steps() {
        assert_eq!(secs(-5), "<invalid>");
        assert_eq!(secs(0), "0s");
        assert_eq!(secs(119), "119s");
        assert_eq!(secs(120), "2m");
        assert_eq!(secs(192), "3m12s");
        assert_eq!(secs(600), "10m");
        assert_eq!(secs(179 * 60), "179m");
        assert_eq!(secs(3 * 3600), "3h");
        assert_eq!(secs(2 * 3600 + 5 * 60 + 3600), "3h5m");
        assert_eq!(secs(30 * 3600), "30h");
        assert_eq!(secs(4 * 86400 + 3600), "4d1h");
        assert_eq!(secs(100 * 86400), "100d");
        assert_eq!(secs(3 * 365 * 86400 + 86400), "3y1d");
        assert_eq!(secs(9 * 365 * 86400), "9y");
    }

    #[test]
    fn unknown_time_is_a_dash() {
        assert_eq!(age(None, Timestamp::UNIX_EPOCH), "-");
    }
}
