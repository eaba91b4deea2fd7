//! The loaded version's udev rule on a Ready node. A swap puts the rule in place before its load
//! (`ttdp_kmod::udev_rule`); this covers a module found loaded at the target (loaded before ttdp
//! kept rules, or with the rule file removed by hand since), once per version that becomes
//! Ready, under the module lock so it never runs in the middle of another agent's swap. A cache
//! entry written by an older ttdp learns its rule from the tag it was built from first. A
//! problem (no udevadm, no udevd, a rules directory that cannot be written) never fails the node:
//! it is logged, sent as a Warning Event and shown in the Ready message.

use tracing::warn;
use ttdp_kmod::{Kernel, KmdVersion};

use super::NodeAgent;
use crate::convergence::Observation;
use crate::reasons;
use crate::reporting::{EventKind, Reporter};

impl<K, R> NodeAgent<K, R>
where
    K: Kernel + Send + Sync + 'static,
    R: Reporter,
{
    /// Puts the loaded version's rule in place once it is Ready; returns the problem to show,
    /// if any (from this check or from the swap that loaded the version).
    pub(super) async fn ensure_udev_rule(&mut self, observation: &Observation) -> Option<String> {
        let loaded = observation.loaded_version()?.to_string();
        if let Some((version, problem)) = &self.udev_checked
            && *version == loaded
        {
            return problem.clone();
        }
        let version: KmdVersion = loaded.parse().ok()?;
        let installer = self.installer.clone();
        let commit = self.config.source_commit.clone();
        let checked = tokio::task::spawn_blocking(move || {
            // a version cached by an older ttdp learns its rule from its tag first (a fetch,
            // before the module lock, which a swap elsewhere must not wait for)
            let unlearned = installer.learn_udev_rule(&version).err();
            // another agent swapping holds the lock: look again on the next pass
            let _lock = installer.try_lock_module().ok().flatten()?;
            if let Some(ensured) = installer.cached_ko(&version, commit.as_deref()) {
                installer.sync_loaded_udev_rule(&ensured.ko);
            }
            let unlearned =
                unlearned.map(|e| format!("the rule {version} ships could not be read: {e}"));
            Some(installer.take_udev_problem().or(unlearned))
        })
        .await
        .ok()
        .flatten()?;
        let problem = checked.map(|p| format!("device nodes may keep their old mode: {p}"));
        if let Some(problem) = &problem {
            warn!(step = "udev-rule", version = %loaded, problem = %problem, "udev rule not applied");
            let note = problem.clone();
            self.event(
                EventKind::Warning,
                reasons::UDEV_RULE_NOT_APPLIED,
                "PlaceUdevRule",
                note,
            )
            .await;
        }
        self.udev_checked = Some((loaded, problem.clone()));
        problem
    }
}
