//! The way back: before anything is unloaded, a verified `.ko` of the loaded version must be in
//! the cache (or the caller allows going on without one), and a target that fails to load is
//! replaced by that version again.

use crate::KmdVersion;
use crate::KmodError;
use crate::install_report::{CacheOutcome, EnsuredKo, SwapOptions};
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::ko_cache::CacheLookup;
use crate::status::ModuleStatus;

impl<K: Kernel> ModuleInstaller<K> {
    /// Makes sure the module loaded now (in `status`) can be loaded back if `target` fails to
    /// load: its verified cache entry, or its tag built into the cache first (as
    /// [`ModuleInstaller::ensure_ko`]). `Ok(None)` when nothing is loaded or `target` is.
    /// Fails with [`KmodError::NoRollbackPath`] when the loaded module declares no release
    /// version (none, or one that is not a [`KmdVersion`]: a custom build) or its `.ko` cannot be
    /// fetched, built or cached. Never touches the loaded module.
    pub fn ensure_rollback_ko(
        &self,
        status: &ModuleStatus,
        target: &KmdVersion,
    ) -> Result<Option<EnsuredKo>, KmodError> {
        let Some(loaded) = self.rollback_version(status, target)? else {
            return Ok(None);
        };
        self.ensure_ko(&loaded).map(Some).map_err(|e| {
            self.no_rollback_path(status, target, format!("{}: {e}", e.reason()), Some(e))
        })
    }

    /// What [`ModuleInstaller::ensure_rollback_ko`] returns when the cache alone answers
    /// (see [`ModuleInstaller::cached_ko`]): `Some(None)` when nothing needs a way back,
    /// `Some(Some(entry))` for a verified entry of the loaded version, `None` when
    /// `ensure_rollback_ko` has more to do or to explain.
    pub fn cached_rollback_ko(
        &self,
        status: &ModuleStatus,
        target: &KmdVersion,
    ) -> Option<Option<EnsuredKo>> {
        match self.rollback_version(status, target) {
            Ok(None) => Some(None),
            Ok(Some(loaded)) => self.cached_ko(&loaded, None).map(Some),
            Err(_) => None,
        }
    }

    /// The loaded version a rollback would load back: `None` when nothing is loaded or `target`
    /// is; [`KmodError::NoRollbackPath`] when the loaded module declares no release version.
    fn rollback_version(
        &self,
        status: &ModuleStatus,
        target: &KmdVersion,
    ) -> Result<Option<KmdVersion>, KmodError> {
        if !status.loaded || status.loaded_version() == Some(target.as_str()) {
            return Ok(None);
        }
        let Some(loaded) = status.version.as_deref() else {
            return Err(self.no_rollback_path(
                status,
                target,
                "it declares no version, so which tag to build is unknown".into(),
                None,
            ));
        };
        // sysfs says what the module declares: a release version only if it parses as one
        loaded.parse::<KmdVersion>().map(Some).map_err(|_| {
            self.no_rollback_path(
                status,
                target,
                format!(
                    "its version {loaded:?} is not a tt-kmd release (a custom build?), so there is no tag to build"
                ),
                None,
            )
        })
    }

    fn no_rollback_path(
        &self,
        status: &ModuleStatus,
        target: &KmdVersion,
        why: String,
        source: Option<KmodError>,
    ) -> KmodError {
        KmodError::NoRollbackPath {
            module: self.config().module.clone(),
            loaded: status.version.clone(),
            target: target.to_string(),
            why,
            source: source.map(Box::new),
        }
    }

    /// The rollback `.ko`'s cache outcome; without one, `None` when the options allow it.
    pub(crate) fn rollback_ko_or_allowed(
        &self,
        status: &ModuleStatus,
        version: &KmdVersion,
        options: &SwapOptions,
    ) -> Result<Option<CacheOutcome>, KmodError> {
        match self.ensure_rollback_ko(status, version) {
            Ok(ensured) => Ok(ensured.map(|e| e.cache)),
            Err(KmodError::NoRollbackPath { .. }) if options.allow_no_rollback => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// After `version` failed to load: loads `previous` back from the cache (when a module was
    /// loaded before), and says what happened.
    pub(crate) fn roll_back(
        &self,
        version: &KmdVersion,
        was_loaded: bool,
        previous: Option<String>,
        load_error: KmodError,
        params: &str,
    ) -> KmodError {
        if !was_loaded {
            // nothing was loaded before: there is nothing to roll back to
            return load_error;
        }
        let module = self.config().module.clone();
        let load_error = Box::new(load_error);
        let not_cached = |v: &str| KmodError::NotCached {
            version: v.to_string(),
            release: self.release().to_string(),
        };
        let rollback = match previous.as_deref() {
            // the old module declared no version: we cannot know which .ko to load back
            None => Err(not_cached("(unknown version)")),
            // sysfs said it: a release version only if it parses as one
            Some(previous_version) => previous_version
                .parse::<KmdVersion>()
                .map_err(KmodError::from)
                .and_then(|v| self.cache().lookup(self.release(), &v))
                .and_then(|lookup| match lookup {
                    CacheLookup::Hit(ko) => self
                        .load_back(&ko, params)
                        .map(|()| previous_version.to_string()),
                    _ => Err(not_cached(previous_version)),
                }),
        };
        match rollback {
            Ok(previous) => KmodError::RolledBack {
                module,
                version: version.to_string(),
                previous,
                load_error,
            },
            Err(rollback_error) => KmodError::RollbackFailed {
                module,
                version: version.to_string(),
                previous,
                load_error,
                rollback_error: Box::new(rollback_error),
            },
        }
    }
}
