//! The post-load validation of [`ModuleInstaller::swap_validated`]: after the new module loaded,
//! a caller's check proves it works (its devices bound, a command passing); when it does not,
//! the previous version is loaded back the way a failed load is rolled back, and the node is
//! never left without a driver it had.

use std::time::Duration;

use crate::KmdVersion;
use crate::KmodError;
use crate::install_report::UnloadOptions;
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::ko_cache::{CacheLookup, CachedKo};
use crate::status::ModuleStatus;
use crate::test_hook::{VALIDATION_ROLLBACK, checkpoint};

/// How long the module that failed validation may take to drop its last references (a
/// validation command that was just killed) before it is unloaded.
const UNLOAD_AFTER_VALIDATION_WAIT: Duration = Duration::from_secs(10);

/// A post-load check: given the module's status right after the load, `Ok` with a one-line
/// account of what was proven, or `Err` with what is missing (e.g. "2 of 4 devices bound").
pub type PostLoadCheck<'a> = &'a (dyn Fn(&ModuleStatus) -> Result<String, String> + Sync);

impl<K: Kernel> ModuleInstaller<K> {
    /// Runs `check` on the module just loaded from `new_ko` (`version`; `None` when its cache
    /// entry is no longer usable, so it cannot be loaded again), `before` being the
    /// status before the swap. On failure, the module is replaced by the previous version from
    /// the cache ([`KmodError::ValidationFailedRolledBack`]); when there is nothing to go back
    /// to (a first install, no verified `.ko` of the previous version) or the module cannot be
    /// unloaded, it stays loaded ([`KmodError::ValidationFailedKeptLoaded`]); when the previous
    /// version does not load, the new one is loaded again
    /// ([`KmodError::ValidationFailedRollbackFailed`]). Called with the module lock held.
    pub(crate) fn validate_loaded(
        &self,
        version: &KmdVersion,
        new_ko: Option<&CachedKo>,
        before: &ModuleStatus,
        params: &str,
        check: PostLoadCheck<'_>,
    ) -> Result<String, KmodError> {
        let problem = match check(&self.status()?) {
            Ok(summary) => return Ok(summary),
            Err(problem) => problem,
        };
        let module = self.config().module.clone();
        let kept = |why: String| KmodError::ValidationFailedKeptLoaded {
            module: module.clone(),
            version: version.to_string(),
            problem: problem.clone(),
            why,
        };
        let previous_ko = match self.previous_ko(before) {
            Ok(ko) => ko,
            Err(why) => return Err(kept(why)),
        };
        let previous = previous_ko.record.version.to_string();
        let unload = UnloadOptions {
            force: false,
            wait: UNLOAD_AFTER_VALIDATION_WAIT,
        };
        // a process stopped from here on leaves a journal that says: load the previous one back
        self.journal_rolling_back()?;
        if let Err(e) = self.unload(&unload) {
            return Err(kept(format!(
                "it could not be unloaded to load {previous} back: {e}"
            )));
        }
        checkpoint(VALIDATION_ROLLBACK);
        // the previous module goes back with the parameters it had
        match self.load_back(
            &previous_ko,
            before.applied_parameters.as_deref().unwrap_or_default(),
        ) {
            Ok(()) => Err(KmodError::ValidationFailedRolledBack {
                module,
                version: version.to_string(),
                previous,
                problem,
            }),
            Err(rollback_error) => {
                // never leave the node without a driver: the one that loaded is better than none
                let reloaded = new_ko.is_some_and(|ko| self.load(ko, params).is_ok());
                Err(KmodError::ValidationFailedRollbackFailed {
                    module,
                    version: version.to_string(),
                    previous,
                    problem,
                    rollback_error: Box::new(rollback_error),
                    reloaded,
                })
            }
        }
    }

    /// The verified cache entry of the version loaded `before` the swap, or why there is none.
    fn previous_ko(&self, before: &ModuleStatus) -> Result<CachedKo, String> {
        if !before.loaded {
            return Err("no module was loaded before it, so there is nothing to go back to".into());
        }
        let Some(previous) = before.loaded_version() else {
            return Err(
                "the previous module declared no version, so which .ko to load back is unknown"
                    .into(),
            );
        };
        let lookup = previous
            .parse::<KmdVersion>()
            .map_err(KmodError::from)
            .and_then(|v| self.cache().lookup(self.release(), &v));
        match lookup {
            Ok(CacheLookup::Hit(ko)) => Ok(ko),
            _ => Err(format!(
                "no verified .ko of the previous version {previous} is in the cache to load back"
            )),
        }
    }
}
