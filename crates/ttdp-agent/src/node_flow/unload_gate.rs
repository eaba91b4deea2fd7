//! What must hold before the loaded module is unloaded: a way back (a verified `.ko` of the
//! loaded version, or the node's opt-in), the controller's upgrade grant, and no holders (or
//! force unload); the grant and the holders are checked again under the module lock, on what
//! the node shows then.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use ttdp_api::agent_report::AgentPhase;
use ttdp_api::names::labels;
use ttdp_kmod::Kernel;

use super::publishing::bounded_read;
use super::{LockTaken, NodeAgent, RollbackPath, millis};
use crate::convergence::{
    Observation, UnloadGate, allows_no_rollback, base_report, holders_message, no_rollback_message,
    report_holders, unload_gate,
};
use crate::error::AgentError;
use crate::grant::{self, GrantDecision};
use crate::reasons;
use crate::reporting::{EventKind, Reporter};

impl<K, R> NodeAgent<K, R>
where
    K: Kernel + Send + Sync + 'static,
    R: Reporter,
{
    /// Before anything is unloaded: a verified `.ko` of the loaded version in the cache (built
    /// from its tag when missing; may be abandoned on shutdown), or the node's opt-in to go on
    /// without one.
    pub(super) async fn secure_rollback(
        &mut self,
        observation: &Observation,
        status: &ttdp_kmod::ModuleStatus,
        shutdown: &CancellationToken,
    ) -> Result<RollbackPath, AgentError> {
        let target = self.config.target_version.clone();
        // the cache alone usually answers: no thread, no cache lock
        let ensured = match self.installer.cached_rollback_ko(status, &target) {
            Some(cached) => Ok(cached),
            None => {
                let installer = Arc::clone(&self.installer);
                let status = status.clone();
                let ensure = tokio::task::spawn_blocking(move || {
                    installer.ensure_rollback_ko(&status, &target)
                });
                tokio::select! {
                    joined = ensure => joined.map_err(|source| AgentError::Task { task: "ensure rollback .ko", source })?,
                    () = shutdown.cancelled() => {
                        info!(step = "rollback-ko", "shutdown while securing the rollback .ko: abandoned, the loaded module was not touched");
                        return Ok(RollbackPath::Abandoned);
                    }
                }
            }
        };
        let cause = match ensured {
            Ok(None) => return Ok(RollbackPath::Secured),
            Ok(Some(ensured)) => {
                info!(
                    step = "rollback-ko",
                    version = %ensured.ko.record.version,
                    cache = ?ensured.cache,
                    elapsed_ms = ensured.elapsed_ms,
                    "rollback module file ready"
                );
                return Ok(RollbackPath::Secured);
            }
            Err(e) => e,
        };
        let label = bounded_read(self.reporter.node_label(labels::ALLOW_NO_ROLLBACK)).await;
        if allows_no_rollback(label.as_ref().ok().and_then(Option::as_deref)) {
            let note = format!(
                "{cause}; proceeding anyway because the node is labelled {}={}: if the new version fails to load, no tt-kmd module will be loaded",
                labels::ALLOW_NO_ROLLBACK,
                labels::ALLOW_NO_ROLLBACK_ENABLED
            );
            warn!(step = "rollback-ko", %note);
            self.event(
                EventKind::Warning,
                reasons::NO_ROLLBACK_ALLOWED,
                "Unload",
                note,
            )
            .await;
            return Ok(RollbackPath::Allowed);
        }
        let mut message = no_rollback_message(&cause.to_string());
        if let Err(e) = label {
            message = format!("{message} (the label could not be read: {e})");
        }
        self.fail(cause.reason(), "Unload", message, Some(observation))
            .await;
        Ok(RollbackPath::Refused)
    }

    /// Whether the controller granted this node the swap of the loaded module (see
    /// [`crate::grant`]). Without a grant (or when it cannot be read): report `WaitingForGrant`,
    /// leave the module and its holders alone, and look again after a probe period.
    pub(super) async fn granted(
        &mut self,
        observation: &Observation,
        status: &ttdp_kmod::ModuleStatus,
    ) -> bool {
        let target = self.config.target_version.clone();
        let message = match bounded_read(self.reporter.upgrade_grant()).await {
            Ok(view) => match grant::decide(&view, status.loaded_version(), &target) {
                GrantDecision::Granted => return true,
                GrantDecision::Waiting { message } => message,
            },
            Err(e) => format!(
                "cannot read the node's upgrade grant ({e}); the loaded module stays loaded until it can be read"
            ),
        };
        let mut report = base_report(AgentPhase::WaitingForGrant, &target, observation);
        report.reason = Some(reasons::WAITING_FOR_GRANT.to_string());
        report.message = Some(message.clone());
        self.next_attempt = Some(Instant::now() + self.config.probe_period);
        if self.last_report.as_ref().map(|r| r.phase) != Some(AgentPhase::WaitingForGrant) {
            info!(step = "grant", node = %self.config.node_name, loaded = ?status.loaded_version(), target = %target, "waiting for the controller's upgrade grant");
        }
        self.publish_report(report).await;
        self.event(
            EventKind::Normal,
            reasons::WAITING_FOR_GRANT,
            "Unload",
            message,
        )
        .await;
        false
    }

    /// Takes the node's module lock, waiting on a blocking thread when it is held (another
    /// agent on the node may hold it for minutes while it swaps); abandoned on shutdown,
    /// nothing changed yet.
    pub(super) async fn take_module_lock(
        &mut self,
        observation: &Observation,
        shutdown: &CancellationToken,
    ) -> Result<LockTaken, AgentError> {
        // free is the common case: taken at once, without a thread to wait on
        let taken = match self.installer.try_lock_module() {
            Ok(Some(lock)) => Ok(lock),
            Ok(None) => {
                let installer = Arc::clone(&self.installer);
                let lock = tokio::task::spawn_blocking(move || installer.lock_module());
                tokio::select! {
                    joined = lock => joined.map_err(|source| AgentError::Task { task: "module lock", source })?,
                    () = shutdown.cancelled() => {
                        info!(step = "lock", "shutdown while waiting for the module lock: abandoned, the loaded module was not touched");
                        return Ok(LockTaken::Abandoned);
                    }
                }
            }
            Err(e) => Err(e),
        };
        match taken {
            Ok(lock) => Ok(LockTaken::Held(lock)),
            Err(e) => {
                let message = format!("{e}; the loaded module was left as it is");
                self.fail(e.reason(), "Lock", message, Some(observation))
                    .await;
                Ok(LockTaken::Failed)
            }
        }
    }

    /// Under the module lock, decides again on what the node shows now, since the checks
    /// before the lock may be minutes old (another agent swapped meanwhile, the grant was
    /// revoked, a workload started): the status is read again; a journal of a stopped swap
    /// waits for the next pass to settle it; a loaded module other than the target needs the
    /// grant, read again; holders wait unless force unload. `Some(status)` when the swap may go.
    pub(super) async fn still_allowed(
        &mut self,
        observation: &Observation,
    ) -> Option<ttdp_kmod::ModuleStatus> {
        let target = self.config.target_version.clone();
        let status = match self.installer.status() {
            Ok(status) => status,
            Err(e) => {
                let message = format!("cannot read the module status: {e}");
                self.fail(e.reason(), "Probe", message, Some(observation))
                    .await;
                return None;
            }
        };
        if !matches!(self.installer.swap_journal(), Ok(None)) {
            info!(
                step = "lock",
                "a stopped swap's journal appeared; settling it first on the next pass"
            );
            self.next_attempt = None;
            return None;
        }
        if status.loaded
            && !status.at_target(target.as_str(), &self.config.parameters)
            && !self.granted(observation, &status).await
        {
            return None;
        }
        if unload_gate(&status, self.config.force_unload) == UnloadGate::WaitForHolders {
            self.wait_for_holders(observation, &status).await;
            return None;
        }
        Some(status)
    }

    /// Not forced and held: report the holders, retry with back-off.
    pub(super) async fn wait_for_holders(
        &mut self,
        observation: &Observation,
        status: &ttdp_kmod::ModuleStatus,
    ) {
        let message = holders_message(status, &self.config.target_version);
        let mut report = base_report(
            AgentPhase::WaitingForHolders,
            &self.config.target_version,
            observation,
        );
        report.holders = report_holders(&status.device_holders);
        report.reason = Some(reasons::DEVICE_HELD.to_string());
        report.message = Some(message.clone());
        let delay = self.holder_backoff.next_delay();
        self.next_attempt = Some(Instant::now() + delay);
        warn!(
            step = "unload",
            node = %self.config.node_name,
            refcnt = ?status.refcnt,
            holders = ?report.holders.iter().map(|h| h.pid).collect::<Vec<_>>(),
            retry_in_ms = millis(delay),
            "module in use; waiting for its holders to go"
        );
        self.publish_report(report).await;
        self.event(EventKind::Warning, reasons::DEVICE_HELD, "Unload", message)
            .await;
    }
}
