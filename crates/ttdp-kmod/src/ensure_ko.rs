//! [`ModuleInstaller::ensure_ko`]: a verified `.ko` of a version in the cache before anything is
//! unloaded, built from its release tag on a miss, optionally pinned to the commit the tag must
//! still point at (`spec.source.commit`).

use std::time::Instant;

use crate::KmodError;
use crate::install_report::{CacheOutcome, EnsuredKo};
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::ko_cache::CacheLookup;
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
    pub fn ensure_pinned_ko(
        &self,
        version: &KmdVersion,
        commit: Option<&str>,
    ) -> Result<EnsuredKo, KmodError> {
        let started = Instant::now();
        let (cache, release) = (self.cache(), self.release());
        let _lock = cache.lock(self.config().cache_lock_timeout)?;
        let outcome = match cache.lookup(release, version)? {
            CacheLookup::Hit(ko)
                if commit.is_some_and(|c| !c.eq_ignore_ascii_case(&ko.record.source_commit)) =>
            {
                // built before the pin (or from a tag since moved): only the pinned commit may load
                cache.evict(release, version)?;
                CacheOutcome::Rebuilt {
                    reason: format!(
                        "it was built from commit {}, not the pinned {}",
                        ko.record.source_commit,
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
}
