//! [`ModuleInstaller::ensure_ko`]: a verified `.ko` of a version in the cache before anything is
//! unloaded, built from its release tag on a miss, optionally pinned to the commit the tag must
//! still point at (`spec.source.commit`), or downloaded ready-built from a prebuilt server.

use std::time::Instant;

use crate::KmodError;
use crate::install_report::{CacheOutcome, EnsuredKo};
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::ko_cache::{CacheLookup, CachedKo, KoRecord};
use crate::prebuilt::{PrebuiltFallback, PrebuiltFetchError};
use crate::source_build::{BuildOptions, build_module, millis};
use crate::version::KmdVersion;

impl<K: Kernel> ModuleInstaller<K> {
    /// Makes sure a verified `.ko` for `version` is in the cache: a verified hit is used as is; a
    /// missing entry is fetched and built; an entry failing verification is removed and rebuilt.
    /// Holds the cache lock throughout, so two agents on one node never build over each other.
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
    /// first; a file the server does not have is built or refused as its
    /// [`PrebuiltFallback`] says, and a file failing its checks is refused
    /// ([`KmodError::PrebuiltRejected`]), never built around. The pin concerns builds: a
    /// prebuilt module is trusted by its published checksum.
    pub fn ensure_pinned_ko(
        &self,
        version: &KmdVersion,
        commit: Option<&str>,
    ) -> Result<EnsuredKo, KmodError> {
        let started = Instant::now();
        let (cache, release) = (self.cache(), self.release());
        let _lock = cache.lock(self.config().cache_lock_timeout)?;
        let outcome = match cache.lookup(release, version)? {
            CacheLookup::Hit(ko) if built_from_another_commit(&ko.record, commit) => {
                // built before the pin (or from a tag since moved): only the pinned commit may load
                cache.evict(release, version)?;
                CacheOutcome::Rebuilt {
                    reason: format!(
                        "it was built from commit {}, not the pinned {}",
                        ko.record.source_commit.as_deref().unwrap_or_default(),
                        commit.unwrap_or_default()
                    ),
                }
            }
            CacheLookup::Hit(ko) => {
                return Ok(EnsuredKo {
                    ko,
                    cache: CacheOutcome::Hit,
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
        if let Some(ko) = self.download_prebuilt(version)? {
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
            ..self.config().build.clone()
        };
        let built = build_module(self.host(), release, version, &options)?;
        let ko = cache.store(&built)?;
        Ok(EnsuredKo {
            ko,
            cache: outcome,
            fetch_ms: built.fetch_ms,
            build_ms: built.build_ms,
            elapsed_ms: millis(started.elapsed()),
        })
    }

    /// The prebuilt `.ko` of `version`, downloaded, checked and cached; `None` when there is no
    /// prebuilt server, or it lacks the file and the fallback is to build.
    fn download_prebuilt(&self, version: &KmdVersion) -> Result<Option<CachedKo>, KmodError> {
        let Some(source) = self.prebuilt() else {
            return Ok(None);
        };
        let release = self.release();
        match source.fetch(version, release) {
            Ok(fetched) => self
                .cache()
                .store_prebuilt(&fetched, release, version)
                .map(Some),
            Err(PrebuiltFetchError::NotFound { .. })
                if source.fallback() == PrebuiltFallback::Build =>
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

/// Whether a cached `.ko` was built from a commit other than the pinned one (a prebuilt module
/// names no commit and is kept).
fn built_from_another_commit(record: &KoRecord, pin: Option<&str>) -> bool {
    match (pin, record.source_commit.as_deref()) {
        (Some(pin), Some(built)) => !pin.eq_ignore_ascii_case(built),
        _ => false,
    }
}
