//! Sizes as ttdp's command-line flags and environment variables take them: a number of bytes,
//! optionally followed by `Ki`, `Mi` or `Gi` (`512Mi`, `2Gi`). The agent reads its cache limit
//! so, and the controller checks the value it hands the agents with the same rule.

/// A size in bytes: a number, optionally followed by `Ki`, `Mi` or `Gi` (`512Mi`, `2Gi`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => s.split_at(at),
        None => (s, ""),
    };
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => {
            return Err(format!(
                "unknown unit {unit:?}; expected a number of bytes, or Ki, Mi or Gi after it (e.g. 2Gi)"
            ));
        }
    };
    let number: u64 = digits.parse().map_err(|_| {
        "expected a number of bytes, or Ki, Mi or Gi after it (e.g. 2Gi)".to_string()
    })?;
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{s} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_bytes_or_binary_units() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_size("2Gi"), Ok(2 << 30));
        for bad in ["", "2G", "2 Gi", "-1", "Gi"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }
}
