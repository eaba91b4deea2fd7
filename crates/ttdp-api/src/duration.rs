//! Durations as ttdp's command-line flags and environment variables take them: a number with an
//! optional unit (`ms`, `s`, `m`, `h`; none means seconds), such as `500ms`, `90s`, `1.5s`, `10m`,
//! or several in a row as Go writes them (`1h30m`).

use std::time::Duration;

/// Parses a duration; the error says what was wrong and shows the accepted form.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("an empty duration; write e.g. 90s, 10m or 500ms".to_owned());
    }
    let mut rest = trimmed;
    let mut seconds = 0.0;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(split);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration; write e.g. 90s, 10m or 500ms"))?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        seconds += match unit {
            "" if next.is_empty() && rest.len() == trimmed.len() => value,
            "s" => value,
            "ms" => value / 1000.0,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            _ => {
                return Err(format!(
                    "{text:?} has an unknown or missing unit {unit:?}; use ms, s, m or h"
                ));
            }
        };
        rest = next;
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?} is out of range: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration(" 10s "), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_say_what_is_wrong() {
        assert!(
            parse_duration("ten")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(
            parse_duration("10d")
                .unwrap_err()
                .contains("unknown or missing unit")
        );
        assert!(
            parse_duration("1m30")
                .unwrap_err()
                .contains("unknown or missing unit")
        );
        assert!(parse_duration("").is_err());
        assert!(parse_duration("1e400s").is_err());
    }
}
