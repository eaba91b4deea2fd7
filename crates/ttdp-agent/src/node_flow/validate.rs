//! Post-load validation in the node flow: the swap runs it under the module lock (a failure
//! rolls back there, see `ttdp_kmod::ModuleInstaller::swap_validated`), and a module the agent
//! found loaded is validated before it is first reported Ready; once Ready, its devices are
//! looked at on every pass, so a node whose cards vanish fails and stops being Ready.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use ttdp_kmod::{FileLock, Kernel, KmdVersion, KmodError, SwapOptions, SwapReport};

use super::NodeAgent;
use crate::convergence::Observation;
use crate::error::AgentError;
use crate::reasons;
use crate::reporting::Reporter;
use crate::validation::{check_devices, validate_loaded};

/// A module this agent proved works: its identity and what was proven.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ValidatedModule {
    /// The version validated.
    pub version: String,
    /// Its `srcversion`.
    pub srcversion: Option<String>,
    /// What was proven, e.g. `4 of 4 devices bound to tenstorrent, ...`.
    pub summary: String,
}

impl ValidatedModule {
    fn is(&self, observation: &Observation) -> bool {
        observation.loaded_version() == Some(self.version.as_str())
            && observation.status.srcversion == self.srcversion
    }
}

impl<K, R> NodeAgent<K, R>
where
    K: Kernel + Send + Sync + 'static,
    R: Reporter,
{
    /// Swaps `target` in on a blocking thread under `module_lock` (taken by the caller, who
    /// decided under it, on `observed`, that the swap may go), validated when validation is on; on shutdown
    /// the swap (and its validation) finishes first.
    pub(super) async fn run_swap(
        &mut self,
        module_lock: FileLock,
        observed: ttdp_kmod::ModuleStatus,
        target: &KmdVersion,
        options: SwapOptions,
        shutdown: &CancellationToken,
    ) -> Result<Result<SwapReport, KmodError>, AgentError> {
        let installer = Arc::clone(&self.installer);
        let version = target.clone();
        let validation = self.config.validation.clone();
        let (host, lock_dir) = (self.config.host.clone(), self.config.lock_dir.clone());
        let mut swap = tokio::task::spawn_blocking(move || {
            if !validation.enabled {
                return (
                    installer.swap_locked(&module_lock, observed, &version, &options, None),
                    None,
                );
            }
            // the srcversion of the module proven to work, as the check saw it
            let proven = Mutex::new(None);
            let check = |status: &ttdp_kmod::ModuleStatus| {
                let checked = validate_loaded(&validation, &host, &lock_dir, status, true);
                if checked.is_ok()
                    && let Ok(mut proven) = proven.lock()
                {
                    *proven = Some(status.srcversion.clone());
                }
                checked
            };
            let swapped =
                installer.swap_locked(&module_lock, observed, &version, &options, Some(&check));
            (swapped, proven.into_inner().ok().flatten())
        });
        let (swapped, proven) = tokio::select! {
            joined = &mut swap => joined,
            () = shutdown.cancelled() => {
                info!(step = "swap", version = %target, "shutdown requested during the swap: finishing it first");
                swap.await
            }
        }
        .map_err(|source| AgentError::Task {
            task: "swap",
            source,
        })?;
        if let Ok(report) = &swapped
            && let Some(summary) = &report.validation
        {
            self.validated = proven.map(|srcversion| ValidatedModule {
                version: report.version.to_string(),
                srcversion,
                summary: summary.clone(),
            });
        }
        Ok(swapped)
    }

    /// Whether the loaded target may be reported Ready: always with validation off; a module
    /// this agent validated must still see its devices; any other is validated now (devices,
    /// command), retried with back-off when that fails. Reports the failure (never unloads: the
    /// agent did not load it in this run, so it knows no previous version to go back to).
    pub(super) async fn proven_working(&mut self, observation: &Observation) -> bool {
        if !self.config.validation.enabled {
            return true;
        }
        let version = observation.loaded_version().unwrap_or_default().to_string();
        if let Some(validated) = self.validated.as_ref().filter(|v| v.is(observation)) {
            let summary = validated.summary.clone();
            let Err(problem) = check_devices(&self.config.host) else {
                return true;
            };
            self.validated = None;
            self.ready_version = None;
            let message = format!(
                "tt-kmd {version} is loaded but its devices stopped working: {problem} (validated before: {summary}); the node is not ready until they are back"
            );
            warn!(step = "validate", node = %self.config.node_name, %message);
            self.fail(
                reasons::DEVICES_LOST,
                "Validate",
                message,
                Some(observation),
            )
            .await;
            return false;
        }
        if !self.attempt_due() {
            return false;
        }
        let (config, host) = (self.config.validation.clone(), self.config.host.clone());
        let (lock_dir, status) = (self.config.lock_dir.clone(), observation.status.clone());
        let checked = tokio::task::spawn_blocking(move || {
            validate_loaded(&config, &host, &lock_dir, &status, false)
        })
        .await
        .unwrap_or_else(|e| Err(format!("the validation task failed: {e}")));
        match checked {
            Ok(summary) => {
                info!(step = "validate", node = %self.config.node_name, version = %version, %summary, "loaded module validated");
                self.validated = Some(ValidatedModule {
                    version,
                    srcversion: observation.status.srcversion.clone(),
                    summary,
                });
                true
            }
            Err(problem) => {
                let message = format!(
                    "tt-kmd {version} is loaded but does not work: {problem}; it stays loaded (this agent did not load it, so it knows no previous version to go back to) and the node is not ready"
                );
                self.fail(
                    reasons::VALIDATION_FAILED,
                    "Validate",
                    message,
                    Some(observation),
                )
                .await;
                false
            }
        }
    }
}
