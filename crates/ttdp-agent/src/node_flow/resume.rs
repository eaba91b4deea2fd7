//! The first thing of every pass: a swap journal left by an agent stopped mid-swap (killed,
//! its pod deleted, the node's power cut short of a reboot) is settled before anything else
//! looks at the node, so a node whose driver was unloaded by that swap is never taken for a node
//! on which nothing was installed. See `ttdp_kmod::ModuleInstaller::resume_swap`.

use std::sync::Arc;

use tracing::{info, warn};
use ttdp_kmod::{Kernel, ResumeOutcome, ResumedSwap};

use super::NodeAgent;
use super::validate::ValidatedModule;
use crate::reasons;
use crate::reporting::{EventKind, Reporter};
use crate::validation::validate_loaded;

impl<K, R> NodeAgent<K, R>
where
    K: Kernel + Send + Sync + 'static,
    R: Reporter,
{
    /// Settles a swap journal left by a stopped agent, and says whether the pass may go on: not
    /// while the journal stays (no driver could be loaded, or its retry is not due), so the
    /// node is neither labelled nor reported as one without a driver to install from scratch.
    pub(super) async fn resume_interrupted_swap(&mut self) -> bool {
        match self.installer.swap_journal() {
            Ok(None) => return true,
            Ok(Some(_)) => {}
            Err(e) => {
                let message = format!("cannot read the swap journal: {e}");
                self.fail(e.reason(), "Resume", message, None).await;
                return false;
            }
        }
        if !self.attempt_due() {
            return false;
        }
        let installer = Arc::clone(&self.installer);
        let validation = self.config.validation.clone();
        let (host, lock_dir) = (self.config.host.clone(), self.config.lock_dir.clone());
        // like the swap it finishes, it is never abandoned half-way
        let resumed = tokio::task::spawn_blocking(move || {
            if !validation.enabled {
                return installer.resume_swap(None);
            }
            let check = |status: &ttdp_kmod::ModuleStatus| {
                validate_loaded(&validation, &host, &lock_dir, status, true)
            };
            installer.resume_swap(Some(&check))
        })
        .await;
        match resumed {
            Ok(Ok(None)) => true,
            Ok(Ok(Some(resumed))) => {
                self.announce_resumed(resumed).await;
                true
            }
            Ok(Err(e)) => {
                let message = e.to_string();
                self.fail(e.reason(), "Resume", message, None).await;
                // an error that left a module loaded settled the journal: the pass goes on
                matches!(self.installer.swap_journal(), Ok(None))
            }
            Err(e) => {
                let message = format!("the task resuming the interrupted swap failed: {e}");
                self.fail(reasons::SWAP_RESUME_FAILED, "Resume", message, None)
                    .await;
                false
            }
        }
    }

    /// Logs and reports what became of the stopped swap.
    async fn announce_resumed(&mut self, resumed: ResumedSwap) {
        let journal = &resumed.journal;
        let previous = journal.previous.as_deref().unwrap_or("(unknown version)");
        let swap = format!(
            "the swap of tt-kmd {previous} to {} (started {}, pid {}) was interrupted",
            journal.target, journal.started_at, journal.pid
        );
        match resumed.outcome {
            ResumeOutcome::Untouched { loaded } => {
                info!(step = "resume", %swap, loaded = ?loaded, "a module is loaded; nothing to resume");
            }
            ResumeOutcome::Finished { validation } => {
                let mut note = format!("{swap}; finished it: {} is loaded", journal.target);
                if let Some(proven) = validation {
                    note = format!("{note}; validated: {proven}");
                    self.validated = self.installer.status().ok().map(|status| ValidatedModule {
                        version: journal.target.clone(),
                        srcversion: status.srcversion,
                        summary: proven,
                    });
                }
                info!(step = "resume", %note);
                self.last_event = None;
                self.event(EventKind::Normal, reasons::SWAP_RESUMED, "Resume", note)
                    .await;
            }
            ResumeOutcome::Restored { why } => {
                let message = format!(
                    "{swap}; {} cannot be loaded now ({why}), so {previous} was loaded back from the cache",
                    journal.target
                );
                warn!(step = "resume", %message);
                let observation = self.observe().await;
                self.fail(
                    reasons::SWAP_RESUMED_ROLLED_BACK,
                    "Resume",
                    message,
                    observation.as_ref(),
                )
                .await;
            }
        }
    }
}
