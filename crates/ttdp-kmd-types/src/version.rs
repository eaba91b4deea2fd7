//! [`KmdVersion`]: a tt-kmd release version, checked once where it enters the program.
//!
//! A version becomes a git ref (`ttkmd-<version>`), a cache path
//! (`/var/cache/tt-kmd/<release>/<version>/`) and a label value, so only plain
//! `MAJOR.MINOR.PATCH` digits are accepted: no `v` prefix, no pre-release, no build metadata.
//! Parse it at the edge (a flag, an environment variable, a file written by someone else) with
//! [`str::parse`] or [`TryFrom`]; everything past the edge takes a `&KmdVersion` and checks
//! nothing again.
//!
//! The `semver` crate is not used: it refuses leading zeros (`2.08.0`), which this rule has always
//! accepted, and accepts pre-release and build suffixes, which this rule refuses.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// A version text that is not `MAJOR.MINOR.PATCH` digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid tt-kmd version {version:?}: expected MAJOR.MINOR.PATCH such as 2.8.0 (the release tag without its ttkmd- prefix)"
)]
pub struct InvalidVersion {
    /// The rejected version text.
    pub version: String,
}

/// Prefix of tt-kmd release tags: version `2.8.0` is tag `ttkmd-2.8.0`.
pub const RELEASE_TAG_PREFIX: &str = "ttkmd-";

/// A tt-kmd release version: `MAJOR.MINOR.PATCH`, each part one or more ASCII digits.
///
/// Displays, serialises (as a JSON string) and converts to `String` as exactly the text it was
/// parsed from. Deserialising checks the text like [`str::parse`] does. Orders by the numeric
/// value of its parts (`2.10.0` > `2.9.0`); two texts of equal value (`2.8.0`, `2.08.0`, which
/// name different tags) are ordered by their text, so they are never equal.
///
/// ```
/// use ttdp_kmd_types::KmdVersion;
/// let v: KmdVersion = "2.10.0".parse()?;
/// assert_eq!(v.as_str(), "2.10.0");
/// assert_eq!(v.release_tag(), "ttkmd-2.10.0");
/// assert!(v > "2.9.0".parse()?);
/// assert!("v2.10.0".parse::<KmdVersion>().is_err());
/// # Ok::<(), ttdp_kmd_types::InvalidVersion>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KmdVersion {
    /// The version text, checked to be `MAJOR.MINOR.PATCH` digits.
    text: String,
}

impl KmdVersion {
    /// The version text, e.g. `2.8.0`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The release tag of this version in the tt-kmd repository: `ttkmd-<version>`.
    pub fn release_tag(&self) -> String {
        format!("{RELEASE_TAG_PREFIX}{}", self.text)
    }

    /// The three digit strings; the text was checked to have exactly three.
    fn parts(&self) -> impl Iterator<Item = &str> {
        self.text.split('.')
    }

    /// Checks `text` and takes it.
    fn checked(text: String) -> Result<Self, InvalidVersion> {
        let parts: Vec<&str> = text.split('.').collect();
        let valid = parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if valid {
            Ok(Self { text })
        } else {
            Err(InvalidVersion { version: text })
        }
    }
}

/// Compares two digit strings by their numeric value, of any length.
fn cmp_numeric(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

impl Ord for KmdVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts()
            .zip(other.parts())
            .map(|(a, b)| cmp_numeric(a, b))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
            // equal values written differently (`2.08.0`, `2.8.0`) are different tags
            .then_with(|| self.text.cmp(&other.text))
    }
}

impl PartialOrd for KmdVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl FromStr for KmdVersion {
    type Err = InvalidVersion;

    /// Parses `MAJOR.MINOR.PATCH`; anything else is [`InvalidVersion`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::checked(s.to_string())
    }
}

impl TryFrom<&str> for KmdVersion {
    type Error = InvalidVersion;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl TryFrom<String> for KmdVersion {
    type Error = InvalidVersion;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::checked(s)
    }
}

impl From<KmdVersion> for String {
    fn from(version: KmdVersion) -> Self {
        version.text
    }
}

/// Compares the text: `version == "2.8.0"`.
impl PartialEq<str> for KmdVersion {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

/// Compares the text: `version == "2.8.0"`.
impl PartialEq<&str> for KmdVersion {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

impl AsRef<str> for KmdVersion {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for KmdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for KmdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KmdVersion({:?})", self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> KmdVersion {
        text.parse().unwrap()
    }

    #[test]
    fn only_plain_three_part_versions_are_valid() {
        for good in [
            "2.8.0",
            "0.0.1",
            "10.20.30",
            "2.08.0",
            "123456789012345678901234.0.0",
        ] {
            assert_eq!(v(good).as_str(), good);
            assert_eq!(KmdVersion::try_from(good).unwrap().as_str(), good);
            assert_eq!(
                KmdVersion::try_from(good.to_string()).unwrap().as_str(),
                good
            );
        }
        for bad in [
            "",
            "2.8",
            "2.8.0.1",
            "v2.8.0",
            "2.8.0-rc1",
            "2.8.0+git",
            "../1.2.3",
            "2..0",
            "2.8.x",
            " 2.8.0",
            "2.8.0\n",
            "２.8.0",
        ] {
            let err = bad.parse::<KmdVersion>().unwrap_err();
            assert_eq!(err.version, bad);
        }
    }

    #[test]
    fn shows_itself_and_its_tag_as_written() {
        let version = v("2.8.0");
        assert_eq!(version.to_string(), "2.8.0");
        assert_eq!(format!("{version:?}"), "KmdVersion(\"2.8.0\")");
        assert_eq!(version.release_tag(), "ttkmd-2.8.0");
        assert_eq!(version.as_ref(), "2.8.0");
        assert!(version == "2.8.0" && version == *"2.8.0" && version != "2.08.0");
        assert_eq!(String::from(version), "2.8.0");
    }

    #[test]
    fn orders_by_numeric_parts() {
        assert!(v("2.10.0") > v("2.9.0"));
        assert!(v("10.0.0") > v("9.99.99"));
        assert!(v("2.8.1") > v("2.8.0"));
        assert!(v("123456789012345678901234.0.0") > v("99999999999999999999.0.0"));
        assert_eq!(v("2.8.0").cmp(&v("2.8.0")), Ordering::Equal);
        // same value, different tags: ordered, never equal
        assert_ne!(v("2.08.0"), v("2.8.0"));
        assert_ne!(v("2.08.0").cmp(&v("2.8.0")), Ordering::Equal);
        assert!(v("2.08.0") < v("2.9.0") && v("2.08.0") > v("2.7.0"));
        let mut sorted = [v("2.10.0"), v("1.0.0"), v("2.9.0"), v("2.9.10"), v("2.9.2")];
        sorted.sort();
        let texts: Vec<&str> = sorted.iter().map(KmdVersion::as_str).collect();
        assert_eq!(texts, ["1.0.0", "2.9.0", "2.9.2", "2.9.10", "2.10.0"]);
    }

    #[test]
    fn serde_is_the_plain_string_and_deserialising_checks_it() {
        let version = v("2.8.0");
        assert_eq!(serde_json::to_string(&version).unwrap(), "\"2.8.0\"");
        let back: KmdVersion = serde_json::from_str("\"2.8.0\"").unwrap();
        assert_eq!(back, version);
        let err = serde_json::from_str::<KmdVersion>("\"2.8.0-rc1\"").unwrap_err();
        assert!(err.to_string().contains("invalid tt-kmd version"), "{err}");
        assert!(serde_json::from_str::<KmdVersion>("280").is_err());
    }

    #[test]
    fn hashes_like_it_compares() {
        use std::collections::HashSet;
        let set: HashSet<KmdVersion> = [v("2.8.0"), v("2.8.0"), v("2.08.0")].into();
        assert_eq!(set.len(), 2);
    }
}
