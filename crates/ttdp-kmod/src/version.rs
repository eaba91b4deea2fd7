//! tt-kmd versions and their release tags.

use crate::KmodError;

/// The release tag of a tt-kmd version: `ttkmd-<version>`.
pub fn release_tag(version: &str) -> String {
    format!("ttkmd-{version}")
}

/// Checks that `version` is `MAJOR.MINOR.PATCH` (digits only), as the spec requires. Versions
/// become paths and git refs, so nothing else is accepted.
pub fn validate_version(version: &str) -> Result<(), KmodError> {
    let parts: Vec<&str> = version.split('.').collect();
    let valid = parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if valid {
        Ok(())
    } else {
        Err(KmodError::InvalidVersion {
            version: version.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_three_part_versions_are_valid() {
        for good in ["2.8.0", "0.0.1", "10.20.30"] {
            assert!(validate_version(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "2.8",
            "2.8.0.1",
            "v2.8.0",
            "2.8.0-rc1",
            "../1.2.3",
            "2..0",
            "2.8.x",
        ] {
            let err = validate_version(bad).unwrap_err();
            assert_eq!(err.reason(), "InvalidVersion", "{bad}");
        }
        assert_eq!(release_tag("2.8.0"), "ttkmd-2.8.0");
    }
}
