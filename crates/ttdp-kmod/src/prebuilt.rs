//! Ready-built modules from a server (`spec.source.prebuilt`): the URL template, the checksum file
//! format, and [`PrebuiltSource`], the fetcher a caller plugs into
//! [`crate::ModuleInstaller::with_prebuilt`]. This crate does no network I/O itself (it has no
//! async runtime); the agent implements the fetch with its HTTP client. What a fetched file must
//! pass before it enters the cache is [`crate::KoCache::store_prebuilt`].

use std::collections::BTreeMap;
use std::fmt::Debug;

use crate::KmdVersion;

/// Stands for the tt-kmd version in a URL template.
pub const VERSION_PLACEHOLDER: &str = "{version}";
/// Stands for the node's kernel release (`uname -r`) in a URL template.
pub const KERNEL_RELEASE_PLACEHOLDER: &str = "{kernelRelease}";
/// Appended to a `.ko` URL to name its checksum file.
pub const CHECKSUM_SUFFIX: &str = ".sha256";

/// The URL of the `.ko` of `version` for kernel `release`: `template` with its placeholders
/// replaced.
pub fn prebuilt_url(template: &str, version: &KmdVersion, release: &str) -> String {
    template
        .replace(VERSION_PLACEHOLDER, version.as_str())
        .replace(KERNEL_RELEASE_PLACEHOLDER, release)
}

/// The hex sha256 in a checksum file: its first word, as `sha256sum` writes it
/// (`<hex>  tenstorrent.ko`), or the bare hex. The error says what is wrong with the file.
pub fn parse_checksum_file(text: &str) -> Result<String, String> {
    let word = text.split_whitespace().next().unwrap_or_default();
    if word.len() == 64 && word.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(word.to_ascii_lowercase())
    } else {
        Err(format!(
            "the checksum file does not start with a sha256 (64 hex digits): {:?}",
            text.chars().take(80).collect::<String>()
        ))
    }
}

/// What a missing prebuilt module (the server answers 404) means.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PrebuiltFallback {
    /// Build the module from its release tag, as without a prebuilt server.
    #[default]
    Build,
    /// Fail the install with [`crate::KmodError::PrebuiltMissing`]; nothing is built.
    Fail,
}

/// What the administrator vouches for, beyond the server: the sha256 of each prebuilt `.ko`
/// (`spec.source.prebuilt.checksums`), and whether a file without one may be trusted on the
/// server's own `.sha256` file (`trustServerChecksum`). A pinned checksum binds every cache entry
/// of its version and kernel, downloaded or built.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrebuiltPins {
    /// Lowercase hex sha256 by [`pin_key`] (`<version>/<kernelRelease>`), one entry of the
    /// policy's `checksums` each.
    pub sha256: BTreeMap<String, String>,
    /// Download a file without a pinned checksum, trusting the server's checksum file. Never
    /// under a commit pin: a download cannot show which commit it was built from.
    pub trust_server_checksum: bool,
}

impl PrebuiltPins {
    /// The pinned sha256 of the `.ko` of `version` for kernel `release`, if any.
    pub fn sha256_for(&self, version: &KmdVersion, release: &str) -> Option<&str> {
        self.sha256
            .get(&pin_key(version, release))
            .map(String::as_str)
    }
}

/// The key of a pinned checksum: `<version>/<kernelRelease>`, e.g. `2.8.0/6.8.0-111-generic`.
pub fn pin_key(version: &KmdVersion, release: &str) -> String {
    format!("{version}/{release}")
}

/// Pinned checksums from their JSON form (`{"2.8.0/6.8.0-111-generic": "<64 hex>"}`), hex
/// lowercased. The error says which entry is wrong.
pub fn parse_pinned_checksums(text: &str) -> Result<BTreeMap<String, String>, String> {
    if text.trim().is_empty() {
        return Ok(BTreeMap::new());
    }
    let map: BTreeMap<String, String> = serde_json::from_str(text).map_err(|e| {
        format!("expected a JSON object of \"<version>/<kernelRelease>\": \"<sha256>\": {e}")
    })?;
    map.into_iter()
        .map(|(key, hex)| {
            let valid_key = key
                .split_once('/')
                .is_some_and(|(v, r)| v.parse::<KmdVersion>().is_ok() && !r.is_empty());
            if !valid_key {
                return Err(format!(
                    "{key:?} is not <version>/<kernelRelease>, e.g. 2.8.0/6.8.0-111-generic"
                ));
            }
            let sum = parse_checksum_file(&hex).map_err(|e| format!("{key}: {e}"))?;
            Ok((key, sum))
        })
        .collect()
}

/// A `.ko` and its checksum as downloaded, not yet verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedKo {
    /// Where the `.ko` was downloaded from.
    pub url: String,
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// The hex sha256 the server published next to it.
    pub sha256: String,
}

/// Why a prebuilt module could not be downloaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrebuiltFetchError {
    /// The server has no such file (HTTP 404 or 410): [`PrebuiltFallback`] decides what follows.
    #[error("{url} was not found on the server")]
    NotFound {
        /// The URL asked for.
        url: String,
    },
    /// Anything else: unreachable server, TLS failure, another HTTP status, a bad checksum file.
    #[error("cannot fetch {url}: {message}")]
    Failed {
        /// The URL asked for.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// A server of ready-built modules, consulted on a cache miss before anything is built.
pub trait PrebuiltSource: Send + Sync + Debug {
    /// Downloads the `.ko` of `version` for kernel `release` and its published checksum. Blocks;
    /// called with the cache lock held, never with the module touched.
    fn fetch(&self, version: &KmdVersion, release: &str) -> Result<FetchedKo, PrebuiltFetchError>;

    /// What a missing file means.
    fn fallback(&self) -> PrebuiltFallback;

    /// The checksums the administrator pinned, and whether the server's word suffices without.
    fn pins(&self) -> &PrebuiltPins;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_template_takes_the_version_and_the_kernel_release() {
        let version: KmdVersion = "2.8.0".parse().unwrap();
        assert_eq!(
            prebuilt_url(
                "https://ko.internal/tt-kmd/{version}/{kernelRelease}/tenstorrent.ko",
                &version,
                "6.8.0-111-generic"
            ),
            "https://ko.internal/tt-kmd/2.8.0/6.8.0-111-generic/tenstorrent.ko"
        );
    }

    #[test]
    fn a_checksum_file_is_read_as_sha256sum_writes_it() {
        let hex = "AB".repeat(32);
        assert_eq!(
            parse_checksum_file(&format!("{hex}  tenstorrent.ko\n")).unwrap(),
            hex.to_ascii_lowercase()
        );
        assert_eq!(parse_checksum_file(&hex).unwrap(), hex.to_ascii_lowercase());
        let err = parse_checksum_file("<html>not found</html>").unwrap_err();
        assert!(err.contains("64 hex digits"), "{err}");
        assert!(parse_checksum_file("").is_err());
    }

    #[test]
    fn pinned_checksums_are_keyed_by_version_and_kernel_release() {
        let hex = "AB".repeat(32);
        let pins = PrebuiltPins {
            sha256: parse_pinned_checksums(&format!(r#"{{"2.8.0/6.8.0-sim": "{hex}"}}"#)).unwrap(),
            trust_server_checksum: false,
        };
        let version: KmdVersion = "2.8.0".parse().unwrap();
        assert_eq!(
            pins.sha256_for(&version, "6.8.0-sim"),
            Some(hex.to_ascii_lowercase().as_str())
        );
        assert_eq!(pins.sha256_for(&version, "6.9.0-other"), None);
        assert_eq!(parse_pinned_checksums(""), Ok(BTreeMap::new()));
        for bad in [
            r#"{"2.8.0": "ab"}"#,
            r#"{"2.8/6.8.0": "ab"}"#,
            r#"{"2.8.0/6.8.0": "abc"}"#,
            "2.8.0/6.8.0=ab",
        ] {
            assert!(parse_pinned_checksums(bad).is_err(), "{bad}");
        }
    }
}
