//! Resuming a swap that a stopped process left half-way ([`crate::swap_journal`]): the node
//! gets back a driver it had, or the one that was coming, and is never taken for a node on
//! which nothing was ever installed.

use std::time::Duration;

use crate::KmdVersion;
use crate::KmodError;
use crate::error::ResumeProblems;
use crate::install_report::UnloadOptions;
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::ko_cache::{CacheLookup, CachedKo};
use crate::swap_journal::{SwapJournal, SwapPhase};
use crate::validated_swap::PostLoadCheck;

/// How long the target may take to drop its last references before a resumed rollback unloads
/// it (as after a failed validation).
const UNLOAD_WAIT: Duration = Duration::from_secs(10);

/// What [`ModuleInstaller::resume_swap`] did with the journal of a stopped swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumedSwap {
    /// The journal found.
    pub journal: SwapJournal,
    /// What was done.
    pub outcome: ResumeOutcome,
}

/// How a stopped swap was settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeOutcome {
    /// A module was loaded (the swap stopped before its unload): nothing was changed.
    Untouched {
        /// The version loaded.
        loaded: Option<String>,
    },
    /// The target is loaded (from its verified cache entry, or found loaded after the load) and,
    /// when a check was given, proven to work.
    Finished {
        /// What the check proved, when one was given.
        validation: Option<String>,
    },
    /// The previous version is loaded again from its verified cache entry.
    Restored {
        /// Why the target is not loaded.
        why: String,
    },
}

impl<K: Kernel> ModuleInstaller<K> {
    /// Settles a swap a stopped process left: `Ok(None)` without a journal (nothing to do), or
    /// when another process holds the module lock (its swap is running, so the journal is its
    /// own, not left: whoever takes the lock next finds it settled or settles it). Otherwise,
    /// under the module lock, taken without waiting: with the target's `.ko` verified in the cache and nothing
    /// loaded, loads it and (with `check`) proves it, as the swap would have; when it cannot be
    /// loaded, or failed its validation, loads the previous version back from its verified cache
    /// entry with its parameters. Fails with [`KmodError::SwapResumeFailed`] when neither loads
    /// (the journal stays for the next attempt).
    pub fn resume_swap(
        &self,
        check: Option<PostLoadCheck<'_>>,
    ) -> Result<Option<ResumedSwap>, KmodError> {
        if self.swap_journal()?.is_none() {
            return Ok(None);
        }
        let Some(_module_lock) = self.try_lock_module()? else {
            return Ok(None);
        };
        self.resume_swap_locked(check)
    }

    /// [`ModuleInstaller::resume_swap`] with the module lock held by the caller.
    pub(crate) fn resume_swap_locked(
        &self,
        check: Option<PostLoadCheck<'_>>,
    ) -> Result<Option<ResumedSwap>, KmodError> {
        let Some(journal) = self.swap_journal()? else {
            return Ok(None);
        };
        let outcome = self.resume_from(&journal, check);
        self.settle_swap_journal()?;
        outcome.map(|outcome| Some(ResumedSwap { journal, outcome }))
    }

    fn resume_from(
        &self,
        journal: &SwapJournal,
        check: Option<PostLoadCheck<'_>>,
    ) -> Result<ResumeOutcome, KmodError> {
        let status = self.status()?;
        let loaded = status.loaded_version().map(str::to_string);
        let target_loaded = loaded.as_deref() == Some(journal.target.as_str());
        let target: KmdVersion = journal.target.parse()?;
        match (status.loaded, journal.phase) {
            (true, SwapPhase::Replacing) if target_loaded => {
                let ko = self.verified_ko(&target).ok();
                self.prove_target(journal, &target, ko.as_ref(), check)
            }
            (true, SwapPhase::RollingBack) if target_loaded => {
                self.unload(&UnloadOptions {
                    force: false,
                    wait: UNLOAD_WAIT,
                })?;
                self.restore_previous(journal, failed_validation(journal))
            }
            (true, _) => Ok(ResumeOutcome::Untouched { loaded }),
            (false, SwapPhase::Replacing) => match self.load_target(journal, &target) {
                Ok(ko) => self.prove_target(journal, &target, Some(&ko), check),
                Err(why) => self.restore_previous(journal, why),
            },
            (false, SwapPhase::RollingBack) => {
                self.restore_previous(journal, failed_validation(journal))
            }
        }
    }

    /// Loads the target from its verified cache entry; why not, when it cannot.
    fn load_target(&self, journal: &SwapJournal, target: &KmdVersion) -> Result<CachedKo, String> {
        let ko = self.verified_ko(target)?;
        self.check_signature_policy(&ko)
            .and_then(|()| self.load(&ko, &journal.target_parameters))
            .map_err(|e| e.to_string())?;
        Ok(ko)
    }

    /// With `check`, proves the loaded target works, rolling back as a swap does when not.
    fn prove_target(
        &self,
        journal: &SwapJournal,
        target: &KmdVersion,
        ko: Option<&CachedKo>,
        check: Option<PostLoadCheck<'_>>,
    ) -> Result<ResumeOutcome, KmodError> {
        let Some(check) = check else {
            return Ok(ResumeOutcome::Finished { validation: None });
        };
        let before = journal.status_before(&self.config().module);
        match self.validate_loaded(target, ko, &before, &journal.target_parameters, check) {
            Ok(summary) => Ok(ResumeOutcome::Finished {
                validation: Some(summary),
            }),
            Err(e @ KmodError::ValidationFailedRolledBack { .. }) => {
                Ok(ResumeOutcome::Restored { why: e.to_string() })
            }
            Err(e) => Err(e),
        }
    }

    /// Loads the journal's previous version back from its verified cache entry, with the
    /// parameters it had.
    fn restore_previous(
        &self,
        journal: &SwapJournal,
        why: String,
    ) -> Result<ResumeOutcome, KmodError> {
        let failed = |rollback_error: String| KmodError::SwapResumeFailed {
            module: self.config().module.clone(),
            previous: journal.previous.clone(),
            target: journal.target.clone(),
            problems: Box::new(ResumeProblems {
                target_problem: why.clone(),
                rollback_error,
                journal: self.swap_journal_path(),
            }),
        };
        let Some(previous) = journal.previous.as_deref() else {
            return Err(failed(
                "the previous module declared no version, so which .ko to load back is unknown"
                    .into(),
            ));
        };
        let version: KmdVersion = previous.parse().map_err(|_| {
            failed(format!(
                "its version {previous:?} is not a tt-kmd release, so no .ko of it is cached"
            ))
        })?;
        let ko = self.verified_ko(&version).map_err(failed)?;
        self.load_back(&ko, &journal.previous_parameters)
            .map_err(|e| failed(e.to_string()))?;
        Ok(ResumeOutcome::Restored { why })
    }

    /// The verified cache entry of `version`, or why there is none.
    fn verified_ko(&self, version: &KmdVersion) -> Result<CachedKo, String> {
        match self.cache().lookup(self.release(), version) {
            Ok(CacheLookup::Hit(ko)) => Ok(ko),
            Ok(CacheLookup::Miss) => Err(format!(
                "no .ko of {version} for kernel {} is in the cache",
                self.release()
            )),
            Ok(CacheLookup::Invalid { reason }) => Err(format!(
                "the cached .ko of {version} cannot be used: {reason}"
            )),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Why a target whose validation failed before the stop is not loaded again.
fn failed_validation(journal: &SwapJournal) -> String {
    format!(
        "{} failed its post-load validation before the swap was interrupted",
        journal.target
    )
}
