//! [`KoCache`]: built modules kept at `/var/cache/tt-kmd/<release>/<version>/tenstorrent.ko`,
//! written atomically, with a sidecar `tenstorrent.ko.json` ([`KoRecord`]) that lets every hit be
//! verified before it is trusted.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use ttdp_hostprobe::HostRoot;

use crate::KmdVersion;
use crate::file_lock::FileLock;
use crate::modinfo::ModInfo;
use crate::module_signing::RecordedSignature;
use crate::prebuilt::{CHECKSUM_SUFFIX, FetchedKo, pin_key};
use crate::source_build::BuiltModule;
use crate::test_hook::{ENTRY_KO_STORED, RECORD_WRITING, checkpoint};
use crate::udev_rule::ShippedUdevRule;
use crate::{KO_FILE_NAME, KmodError};

/// Host path of the cache.
pub const CACHE_DIR: &str = "/var/cache/tt-kmd";
/// Sidecar file name, next to the `.ko`.
pub const RECORD_FILE_NAME: &str = "tenstorrent.ko.json";
/// How the name of every temporary file written in a cache entry starts: a `.ko` or record
/// before its rename, a copy being re-signed. No file of a whole entry starts so.
pub const TEMPORARY_PREFIX: &str = ".";
/// Lock file name, at the top of the cache.
const LOCK_FILE_NAME: &str = ".lock";
/// Directory of the per-entry lock files, at the top of the cache: apart from the entries, so
/// removing an entry never removes a lock another process waits on.
const ENTRY_LOCK_DIR: &str = ".locks";

/// What the cache knows about one `.ko`: its checksum and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KoRecord {
    /// tt-kmd version (a record naming anything else fails to read, so the entry is invalid).
    pub version: KmdVersion,
    /// Kernel release it was built for.
    pub kernel_release: String,
    /// Hex sha256 of the `.ko`.
    pub sha256: String,
    /// The `.ko`'s vermagic.
    pub vermagic: String,
    /// The `.ko`'s srcversion, when it has one.
    pub srcversion: Option<String>,
    /// Repository the sources came from, or the URL a prebuilt module was downloaded from.
    pub source_repository: String,
    /// Commit of tag `ttkmd-<version>` that was built; `None` for a prebuilt module, which is
    /// trusted by the checksum its server published.
    #[serde(default)]
    pub source_commit: Option<String>,
    /// When it was built.
    pub built_at: jiff::Timestamp,
    /// The udev rule its version ships, read from the source tree it was built from;
    /// [`ShippedUdevRule::Unknown`] for a prebuilt module and a record written before ttdp kept
    /// rules.
    #[serde(default)]
    pub udev_rule: ShippedUdevRule,
    /// Who signed the `.ko`, when it is signed (see [`crate::RecordedSignature`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<RecordedSignature>,
}

/// A verified cache entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedKo {
    /// Local path of the `.ko`.
    pub path: PathBuf,
    /// Its sidecar record.
    pub record: KoRecord,
}

/// The result of a cache lookup.
// a lookup answers once per swap and is matched at once: boxing the hit would buy nothing
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheLookup {
    /// A verified entry: checksum, version and vermagic all match.
    Hit(CachedKo),
    /// Nothing cached for this release and version.
    Miss,
    /// Something is cached but must not be loaded; `reason` says why.
    Invalid {
        /// What failed verification.
        reason: String,
    },
}

/// The `.ko` cache under a host root.
#[derive(Debug, Clone)]
pub struct KoCache {
    dir: PathBuf,
}

impl KoCache {
    /// The cache at [`CACHE_DIR`] under `host`.
    pub fn new(host: &HostRoot) -> Self {
        Self {
            dir: host.path(CACHE_DIR),
        }
    }

    /// A cache at `dir`, a path as this process sees it.
    pub fn at(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The local cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Local path of the `.ko` for `release` and `version` (whether or not it exists).
    pub fn ko_path(&self, release: &str, version: &KmdVersion) -> PathBuf {
        self.entry_dir(release, version).join(KO_FILE_NAME)
    }

    pub(crate) fn entry_dir(&self, release: &str, version: &KmdVersion) -> PathBuf {
        self.dir.join(release).join(version.as_str())
    }

    /// Takes the cache's exclusive lock, waiting at most `timeout` (another agent may be building).
    pub fn lock(&self, timeout: Duration) -> Result<FileLock, KmodError> {
        FileLock::acquire(&self.dir.join(LOCK_FILE_NAME), timeout)
    }

    /// Takes the exclusive lock of the entry for `release` and `version`, waiting at most
    /// `timeout`: whoever builds, stores or removes that entry holds it, so work on one kernel's
    /// entry never waits for a build of another's.
    pub fn lock_entry(
        &self,
        release: &str,
        version: &KmdVersion,
        timeout: Duration,
    ) -> Result<FileLock, KmodError> {
        let name = format!("{release}_{}.lock", version.as_str());
        FileLock::acquire(&self.dir.join(ENTRY_LOCK_DIR).join(name), timeout)
    }

    /// Removes the temporary files left in the entry for `release` and `version` by a process
    /// killed before it renamed them into place (a `.ko` or record on its way in, a copy being
    /// re-signed; each named with a leading [`TEMPORARY_PREFIX`]), and returns how many went.
    /// The cache is on the host and outlives the agent: without this every kill or reboot in
    /// the middle of a write would leave a module-sized file for good. Callers hold the entry's
    /// [`KoCache::lock_entry`], so no live writer owns one of them.
    pub fn remove_temporaries(
        &self,
        release: &str,
        version: &KmdVersion,
    ) -> Result<usize, KmodError> {
        let dir = self.entry_dir(release, version);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(0);
        };
        let mut removed = 0;
        for entry in entries.filter_map(Result::ok) {
            let is_temporary = entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.starts_with(TEMPORARY_PREFIX));
            if is_temporary && entry.file_type().is_ok_and(|t| t.is_file()) {
                remove_if_present(&entry.path())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Looks up and verifies the entry for `release` and `version`.
    pub fn lookup(&self, release: &str, version: &KmdVersion) -> Result<CacheLookup, KmodError> {
        let ko = self.ko_path(release, version);
        let record_path = self.entry_dir(release, version).join(RECORD_FILE_NAME);
        let (ko_exists, record_exists) = (ko.exists(), record_path.exists());
        if !ko_exists && !record_exists {
            return Ok(CacheLookup::Miss);
        }
        let invalid = |reason: String| Ok(CacheLookup::Invalid { reason });
        if !ko_exists {
            return invalid(format!("{} is missing", ko.display()));
        }
        if !record_exists {
            return invalid(format!("{} is missing", record_path.display()));
        }
        let text = std::fs::read_to_string(&record_path)
            .map_err(|e| KmodError::io("read", &record_path, e))?;
        let record: KoRecord = match serde_json::from_str(&text) {
            Ok(record) => record,
            Err(e) => {
                return invalid(format!(
                    "{} is not a valid record: {e}",
                    record_path.display()
                ));
            }
        };
        let bytes = std::fs::read(&ko).map_err(|e| KmodError::io("read", &ko, e))?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        if sha256 != record.sha256 {
            return invalid(format!(
                "checksum mismatch: file has sha256 {sha256}, record says {}",
                record.sha256
            ));
        }
        let info = match ModInfo::parse(&bytes) {
            Ok(info) => info,
            Err(reason) => return invalid(format!("{}: {reason}", ko.display())),
        };
        if info.version() != Some(version.as_str()) || record.version != *version {
            return invalid(format!(
                "module declares version {:?}, expected {version}",
                info.version()
            ));
        }
        if info.vermagic_release() != Some(release) || record.kernel_release != release {
            return invalid(format!(
                "module vermagic {:?} does not match kernel {release}",
                info.vermagic()
            ));
        }
        Ok(CacheLookup::Hit(CachedKo { path: ko, record }))
    }

    /// The record of the entry for `release` and `version`, read but not verified (for showing
    /// where a loaded module came from, never for deciding what to load); `None` without one.
    pub fn record(&self, release: &str, version: &KmdVersion) -> Option<KoRecord> {
        let path = self.entry_dir(release, version).join(RECORD_FILE_NAME);
        let text = std::fs::read_to_string(path).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Stores a freshly built module atomically (temporary file, fsync, rename; the record last)
    /// and returns the new entry. Callers hold [`KoCache::lock`].
    pub fn store(&self, built: &BuiltModule) -> Result<CachedKo, KmodError> {
        self.store_built(
            &built.ko_path,
            &built.release,
            &built.version,
            &built.repository,
            &built.source_commit,
            built.udev_rule.clone(),
        )
    }

    /// Rewrites the record of an entry atomically, e.g. to add the rule its version ships.
    /// Callers hold [`KoCache::lock`].
    pub fn write_record(&self, record: &KoRecord) -> Result<(), KmodError> {
        let dir = self.entry_dir(&record.kernel_release, &record.version);
        let json = serde_json::to_vec_pretty(record).map_err(|e| {
            KmodError::io(
                "encode",
                dir.join(RECORD_FILE_NAME),
                std::io::Error::other(e),
            )
        })?;
        write_atomically(&dir, RECORD_FILE_NAME, &json)
    }

    /// Stores the module file `ko`, built elsewhere from `source_commit` of `repository`, as
    /// `version` for kernel `release`. Refuses a file whose `.modinfo` declares another version or
    /// kernel. Callers hold [`KoCache::lock`].
    pub fn store_file(
        &self,
        ko: &Path,
        release: &str,
        version: &KmdVersion,
        repository: &str,
        source_commit: &str,
    ) -> Result<CachedKo, KmodError> {
        self.store_built(
            ko,
            release,
            version,
            repository,
            source_commit,
            ShippedUdevRule::Unknown,
        )
    }

    fn store_built(
        &self,
        ko: &Path,
        release: &str,
        version: &KmdVersion,
        repository: &str,
        source_commit: &str,
        udev_rule: ShippedUdevRule,
    ) -> Result<CachedKo, KmodError> {
        let bytes = std::fs::read(ko).map_err(|e| KmodError::io("read", ko, e))?;
        let info = ModInfo::parse(&bytes).map_err(|reason| KmodError::Modinfo {
            path: ko.to_path_buf(),
            reason,
        })?;
        info.check_built_for(version, release)?;
        let source = EntrySource {
            repository,
            commit: Some(source_commit),
            udev_rule,
        };
        self.write_entry(&bytes, &info, release, version, source)
    }

    /// Stores a prebuilt module downloaded from a server, after the checks a module built here
    /// passes: the checksum its server published, the checksum the administrator pinned
    /// (`pinned_sha256`, when given), the version its `.modinfo` declares, and its vermagic
    /// against `release`, the kernel it is for. A file failing any of them is refused with
    /// [`KmodError::PrebuiltRejected`] and nothing is written. Callers hold [`KoCache::lock`].
    pub fn store_prebuilt(
        &self,
        fetched: &FetchedKo,
        release: &str,
        version: &KmdVersion,
        pinned_sha256: Option<&str>,
    ) -> Result<CachedKo, KmodError> {
        let rejected = |reason: String| KmodError::PrebuiltRejected {
            version: version.to_string(),
            release: release.to_string(),
            url: fetched.url.clone(),
            reason,
        };
        let sha256 = hex::encode(Sha256::digest(&fetched.bytes));
        if sha256 != fetched.sha256 {
            return Err(rejected(format!(
                "checksum mismatch: the file has sha256 {sha256}, the server's {CHECKSUM_SUFFIX} file says {}",
                fetched.sha256
            )));
        }
        if let Some(pinned) = pinned_sha256.filter(|p| !p.eq_ignore_ascii_case(&sha256)) {
            return Err(rejected(format!(
                "the file has sha256 {sha256}, but spec.source.prebuilt.checksums pins {pinned} for {}; if the new file is trusted, pin its checksum instead",
                pin_key(version, release)
            )));
        }
        let info = ModInfo::parse(&fetched.bytes)
            .map_err(|reason| rejected(format!("not a kernel module: {reason}")))?;
        if !info.is_for(version, release) {
            return Err(rejected(format!(
                "it declares version {} and vermagic {}, expected version {version} for kernel {release}",
                info.version().unwrap_or("(none)"),
                info.vermagic().unwrap_or("(none)"),
            )));
        }
        let source = EntrySource {
            repository: &fetched.url,
            commit: None,
            udev_rule: ShippedUdevRule::Unknown,
        };
        self.write_entry(&fetched.bytes, &info, release, version, source)
    }

    /// Writes the `.ko` and its record for `version` and `release` atomically.
    fn write_entry(
        &self,
        bytes: &[u8],
        info: &ModInfo,
        release: &str,
        version: &KmdVersion,
        source: EntrySource<'_>,
    ) -> Result<CachedKo, KmodError> {
        let record = KoRecord {
            version: version.clone(),
            kernel_release: release.to_string(),
            sha256: hex::encode(Sha256::digest(bytes)),
            vermagic: info.vermagic().unwrap_or_default().to_string(),
            srcversion: info.srcversion().map(str::to_string),
            source_repository: source.repository.to_string(),
            source_commit: source.commit.map(str::to_string),
            built_at: jiff::Timestamp::now(),
            udev_rule: source.udev_rule,
            signature: RecordedSignature::of(bytes),
        };
        let dir = self.entry_dir(release, version);
        std::fs::create_dir_all(&dir).map_err(|e| KmodError::io("create", &dir, e))?;
        // a stale record must never describe the new file, even for a moment
        remove_if_present(&dir.join(RECORD_FILE_NAME))?;
        write_atomically(&dir, KO_FILE_NAME, bytes)?;
        checkpoint(ENTRY_KO_STORED);
        let json = serde_json::to_vec_pretty(&record).map_err(|e| {
            KmodError::io(
                "encode",
                dir.join(RECORD_FILE_NAME),
                std::io::Error::other(e),
            )
        })?;
        write_atomically(&dir, RECORD_FILE_NAME, &json)?;
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| KmodError::io("sync", &dir, e))?;
        Ok(CachedKo {
            path: dir.join(KO_FILE_NAME),
            record,
        })
    }

    /// Removes the entry for `release` and `version` (used for entries that failed verification).
    pub fn evict(&self, release: &str, version: &KmdVersion) -> Result<(), KmodError> {
        let dir = self.entry_dir(release, version);
        remove_if_present(&dir.join(RECORD_FILE_NAME))?;
        remove_if_present(&dir.join(KO_FILE_NAME))
    }

    /// Removes the entry for `release` and `version` whole (its directory, and the release's
    /// when no entry is left). Callers hold its [`KoCache::lock_entry`].
    pub fn remove_entry(&self, release: &str, version: &KmdVersion) -> Result<(), KmodError> {
        let dir = self.entry_dir(release, version);
        // the record first: what is left of an entry caught half-removed fails verification
        remove_if_present(&dir.join(RECORD_FILE_NAME))?;
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(KmodError::io("remove", &dir, e));
            }
            _ => {}
        }
        // fails while other entries remain: that is the point
        let _ = std::fs::remove_dir(self.dir.join(release));
        Ok(())
    }

    /// Kernel releases with a directory in the cache, sorted.
    pub fn releases(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut releases: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|name| ttdp_hostprobe::is_release_name(name))
            .collect();
        releases.sort();
        releases
    }

    /// Bytes of the entry for `release` and `version` (its files together).
    pub fn entry_bytes(&self, release: &str, version: &KmdVersion) -> u64 {
        std::fs::read_dir(self.entry_dir(release, version))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| e.metadata().ok())
                    .filter(std::fs::Metadata::is_file)
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }

    /// When the `.ko` of the entry for `release` and `version` was last written.
    pub fn entry_written(
        &self,
        release: &str,
        version: &KmdVersion,
    ) -> Option<std::time::SystemTime> {
        std::fs::metadata(self.ko_path(release, version))
            .and_then(|m| m.modified())
            .ok()
    }

    /// Versions with a `.ko` cached for `release` (verified or not), oldest first. A directory
    /// whose name is not a tt-kmd version is no entry of this cache and is left out.
    pub fn versions(&self, release: &str) -> Vec<KmdVersion> {
        let Ok(entries) = std::fs::read_dir(self.dir.join(release)) else {
            return Vec::new();
        };
        let mut versions: Vec<KmdVersion> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().join(KO_FILE_NAME).is_file())
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        versions.sort();
        versions
    }
}

/// Where a cache entry came from: its record's provenance fields.
struct EntrySource<'a> {
    repository: &'a str,
    commit: Option<&'a str>,
    udev_rule: ShippedUdevRule,
}

/// Writes `dir/name` through a temporary file in `dir`, fsynced, then renamed over the target.
pub(crate) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), KmodError> {
    let target = dir.join(name);
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!("{TEMPORARY_PREFIX}{name}."))
        .tempfile_in(dir)
        .map_err(|e| KmodError::io("create a temporary file in", dir, e))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| KmodError::io("write", tmp.path(), e))?;
    if name == RECORD_FILE_NAME {
        checkpoint(RECORD_WRITING);
    }
    tmp.persist(&target)
        .map_err(|e| KmodError::io("rename into", &target, e.error))?;
    Ok(())
}

pub(crate) fn remove_if_present(path: &Path) -> Result<(), KmodError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(KmodError::io("remove", path, e)),
        _ => Ok(()),
    }
}
