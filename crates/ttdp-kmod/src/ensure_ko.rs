//! [`ModuleInstaller::ensure_ko`]: a verified `.ko` of a version in the cache before anything is
//! unloaded, built from its release tag on a miss, optionally pinned to the commit the tag must
//! still point at (`spec.source.commit`), or downloaded ready-built from a prebuilt server.

use std::time::Instant;

use crate::KmdVersion;
use crate::KmodError;
use crate::install_report::{CacheOutcome, EnsuredKo};
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::ko_cache::{CacheLookup, CachedKo, KoRecord};
use crate::prebuilt::{PrebuiltFallback, PrebuiltFetchError, pin_key};
use crate::source_build::{BuildOptions, build_module, millis};
use crate::test_hook::{ENTRY_BEFORE_BUILD, checkpoint};

impl<K: Kernel> ModuleInstaller<K> {
    /// Makes sure a verified `.ko` for `version` is in the cache: a verified hit is used as is; a
    /// missing entry is fetched and built; an entry failing verification is removed and rebuilt.
    /// Holds the entry's lock throughout, so two agents on one node never build it over each
    /// other.
    /// Never touches the loaded module.
    pub fn ensure_ko(&self, version: &KmdVersion) -> Result<EnsuredKo, KmodError> {
        self.ensure_pinned_ko(version, None)
    }

    /// [`ModuleInstaller::ensure_ko`], with the release tag pinned to `commit` when given: a
    /// cached `.ko` built from another commit is rebuilt, and a tag that points elsewhere now
    /// fails with [`KmodError::SourceCommitMoved`] before anything is built (the pin applies to
    /// this version only: the rollback `.ko` of the loaded version is built unpinned).
    ///
    /// With a prebuilt server ([`ModuleInstaller::with_prebuilt`]), a miss downloads the `.ko`
    /// first when it is trusted (its checksum pinned, or the server's checksum trusted and no
    /// commit pinned); a file the server does not have, or one that is not trusted, is built or
    /// refused as its [`PrebuiltFallback`] says, and a file failing its checks is refused
    /// ([`KmodError::PrebuiltRejected`]), never built around. A pinned checksum binds the cache
    /// entry whatever its origin, and a commit pin refuses an entry naming no commit unless its
    /// checksum is pinned: an entry failing its pin is evicted and fetched or built again.
    pub fn ensure_pinned_ko(
        &self,
        version: &KmdVersion,
        commit: Option<&str>,
    ) -> Result<EnsuredKo, KmodError> {
        self.ensure_entry(self.release(), version, commit, &self.config().build)
    }

    /// [`ModuleInstaller::ensure_pinned_ko`] for the installed kernel `release`, which need not
    /// be the running one: a node's next kernel gets its verified `.ko` before it boots into it.
    /// Built against that kernel's build tree (`build`, whose `build_dir` names it when the host
    /// root's tree is not used) or downloaded with `release` in the URL, and verified against
    /// `release` (vermagic) and `version`. Holds only this entry's lock
    /// ([`KoCache::lock_entry`]), so a build here never delays work on another entry, and never
    /// touches the loaded module.
    ///
    /// [`KoCache::lock_entry`]: crate::KoCache::lock_entry
    pub fn ensure_ko_for(
        &self,
        release: &str,
        version: &KmdVersion,
        commit: Option<&str>,
        build: &BuildOptions,
    ) -> Result<EnsuredKo, KmodError> {
        self.ensure_entry(release, version, commit, build)
    }

    fn ensure_entry(
        &self,
        release: &str,
        version: &KmdVersion,
        commit: Option<&str>,
        build: &BuildOptions,
    ) -> Result<EnsuredKo, KmodError> {
        let started = Instant::now();
        let cache = self.cache();
        let _lock = cache.lock_entry(release, version, self.config().cache_lock_timeout)?;
        // what an agent killed (or a node rebooted) mid-write left; the entry itself is verified below
        cache.remove_temporaries(release, version)?;
        // a key that cannot sign fails before anything is built or downloaded
        self.require_signing_key()?;
        let pins = self.entry_pins(release, version, commit);
        let outcome = match cache.lookup(release, version)? {
            CacheLookup::Hit(ko) if let Some(reason) = pins.refusal(&ko.record) => {
                // cached before the pin (or from a tag since moved): only what is pinned may load
                cache.evict(release, version)?;
                CacheOutcome::Rebuilt { reason }
            }
            CacheLookup::Hit(ko) => {
                let (ko, resigned) = self.signed_entry(ko)?;
                return Ok(EnsuredKo {
                    ko,
                    cache: resigned.map_or(CacheOutcome::Hit, |reason| CacheOutcome::Resigned {
                        reason,
                    }),
                    fetch_ms: 0,
                    build_ms: 0,
                    elapsed_ms: millis(started.elapsed()),
                });
            }
            CacheLookup::Miss => CacheOutcome::Miss,
            CacheLookup::Invalid { reason } => {
                cache.evict(release, version)?;
                CacheOutcome::Rebuilt { reason }
            }
        };
        checkpoint(ENTRY_BEFORE_BUILD);
        if let Some(ko) = self.download_prebuilt(release, version, &pins)? {
            let (ko, _) = self.signed_entry(ko)?;
            let url = ko.record.source_repository.clone();
            return Ok(EnsuredKo {
                ko,
                cache: CacheOutcome::Downloaded { url },
                fetch_ms: millis(started.elapsed()),
                build_ms: 0,
                elapsed_ms: millis(started.elapsed()),
            });
        }
        let options = BuildOptions {
            commit: commit.map(str::to_string),
            ..build.clone()
        };
        let built = build_module(self.host(), release, version, &options)?;
        self.sign_built(&built)?;
        let ko = cache.store(&built)?;
        Ok(EnsuredKo {
            ko,
            cache: outcome,
            fetch_ms: built.fetch_ms,
            build_ms: built.build_ms,
            elapsed_ms: millis(started.elapsed()),
        })
    }

    /// What [`ModuleInstaller::ensure_pinned_ko`] returns when the cache alone answers: the
    /// verified entry of `version`, accepted by its pins. Read without the cache lock, which a
    /// build elsewhere on the node may hold for minutes: entries are written whole (the record
    /// last), so one caught half-written fails verification and gives `None`, as does anything
    /// `ensure_pinned_ko` would fetch, build or evict. Never touches the loaded module.
    pub fn cached_ko(&self, version: &KmdVersion, commit: Option<&str>) -> Option<EnsuredKo> {
        self.cached_ko_for(self.release(), version, commit)
    }

    /// [`ModuleInstaller::cached_ko`] for the installed kernel `release`.
    pub fn cached_ko_for(
        &self,
        release: &str,
        version: &KmdVersion,
        commit: Option<&str>,
    ) -> Option<EnsuredKo> {
        let started = Instant::now();
        let pins = self.entry_pins(release, version, commit);
        match self.cache().lookup(release, version) {
            Ok(CacheLookup::Hit(ko))
                if pins.refusal(&ko.record).is_none() && self.signed_as_wanted(&ko) =>
            {
                Some(EnsuredKo {
                    ko,
                    cache: CacheOutcome::Hit,
                    fetch_ms: 0,
                    build_ms: 0,
                    elapsed_ms: millis(started.elapsed()),
                })
            }
            _ => None,
        }
    }

    /// The pins a cache entry of `version` for `release` must match: `commit`, and the
    /// checksum pinned for that kernel, if any.
    fn entry_pins<'a>(
        &'a self,
        release: &str,
        version: &KmdVersion,
        commit: Option<&'a str>,
    ) -> EntryPins<'a> {
        EntryPins {
            commit,
            sha256: self
                .prebuilt()
                .and_then(|source| source.pins().sha256_for(version, release)),
        }
    }

    /// The prebuilt `.ko` of `version`, downloaded, checked and cached; `None` when there is no
    /// prebuilt server, or it lacks the file (or the file is not trusted) and the fallback is to
    /// build. A pinned file the server lacks is an error whatever the fallback: a build could
    /// not match its checksum.
    fn download_prebuilt(
        &self,
        release: &str,
        version: &KmdVersion,
        pins: &EntryPins<'_>,
    ) -> Result<Option<CachedKo>, KmodError> {
        let Some(source) = self.prebuilt() else {
            return Ok(None);
        };
        let trusted =
            pins.sha256.is_some() || (pins.commit.is_none() && source.pins().trust_server_checksum);
        if !trusted {
            return match source.fallback() {
                PrebuiltFallback::Build => Ok(None),
                PrebuiltFallback::Fail => Err(KmodError::PrebuiltUnpinned {
                    version: version.to_string(),
                    release: release.to_string(),
                    key: pin_key(version, release),
                    commit_pinned: pins.commit.is_some(),
                }),
            };
        }
        match source.fetch(version, release) {
            Ok(fetched) => self
                .cache()
                .store_prebuilt(&fetched, release, version, pins.sha256)
                .map(Some),
            Err(PrebuiltFetchError::NotFound { .. })
                if pins.sha256.is_none() && source.fallback() == PrebuiltFallback::Build =>
            {
                Ok(None)
            }
            Err(PrebuiltFetchError::NotFound { url }) => Err(KmodError::PrebuiltMissing {
                version: version.to_string(),
                release: release.to_string(),
                url,
            }),
            Err(source) => Err(KmodError::PrebuiltFetch {
                version: version.to_string(),
                release: release.to_string(),
                source,
            }),
        }
    }
}

/// What a cache entry of one version and kernel must match: the commit its tag is pinned to and
/// the checksum the administrator pinned, either or both.
#[derive(Debug, Clone, Copy)]
struct EntryPins<'a> {
    commit: Option<&'a str>,
    sha256: Option<&'a str>,
}

impl EntryPins<'_> {
    /// Why the entry `record` must not be loaded under these pins; `None` when it may. A pinned
    /// checksum decides alone (it names the very file); without one, a commit pin wants an
    /// entry built from that commit, which a download naming no commit cannot show.
    fn refusal(&self, record: &KoRecord) -> Option<String> {
        if let Some(pinned) = self.sha256 {
            // a download ttdp re-signed is still the pinned file, with another signature
            let before_signing = record.signature.as_ref();
            let before_signing = before_signing.and_then(|s| s.signed_from_sha256.as_deref());
            let pinned_file = [Some(record.sha256.as_str()), before_signing]
                .into_iter()
                .flatten()
                .any(|sha| pinned.eq_ignore_ascii_case(sha));
            return (!pinned_file).then(|| {
                format!(
                    "its sha256 {} is not the {pinned} pinned in spec.source.prebuilt.checksums",
                    record.sha256
                )
            });
        }
        let pin = self.commit?;
        match record.source_commit.as_deref() {
            Some(built) if pin.eq_ignore_ascii_case(built) => None,
            Some(built) => Some(format!(
                "it was built from commit {built}, not the pinned {pin}"
            )),
            None => Some(format!(
                "it was downloaded from {} and names no commit, so it cannot show it comes from the pinned {pin}, and no checksum is pinned for it",
                record.source_repository
            )),
        }
    }
}
