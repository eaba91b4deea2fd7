//! Publishing: labels, the report and Events (and failures, which are all three), each only
//! when changed, each bounded in time so a hung API server never stalls the node flow.

use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};
use ttdp_api::agent_report::{AgentPhase, AgentReport};
use ttdp_kmod::{Kernel, SwapOutcome, SwapReport};

use super::{NodeAgent, millis};
use crate::convergence::{Observation, base_report};
use crate::labels::{InstallMode, NodeLabels};
use crate::reasons;
use crate::reporting::{EventKind, NodeEvent, ReportError, Reporter};

impl<K, R> NodeAgent<K, R>
where
    K: Kernel + Send + Sync + 'static,
    R: Reporter,
{
    /// Reports a failure, announces it once, and schedules a retry with back-off.
    pub(super) async fn fail(
        &mut self,
        reason: &str,
        action: &str,
        message: String,
        observation: Option<&Observation>,
    ) {
        let delay = self.failure_backoff.next_delay();
        self.next_attempt = Some(Instant::now() + delay);
        error!(
            step = %action,
            node = %self.config.node_name,
            reason,
            retry_in_ms = millis(delay),
            error = %message,
            "attempt failed; will retry"
        );
        let mut report = match observation {
            Some(obs) => base_report(AgentPhase::Failed, &self.config.target_version, obs),
            None => AgentReport {
                phase: AgentPhase::Failed,
                target_version: self.config.target_version.to_string(),
                loaded_version: None,
                loaded_parameters: None,
                applied_parameters: None,
                loaded_commit: None,
                udev_rule: None,
                install_mode: self
                    .last_report
                    .as_ref()
                    .map_or(InstallMode::Container.as_str().to_string(), |r| {
                        r.install_mode.clone()
                    }),
                holders: Vec::new(),
                reason: None,
                message: None,
                kernel_compiler: None,
                installed_kernels: Vec::new(),
                start_load: None,
                module_signer: None,
            },
        };
        report.reason = Some(reason.to_string());
        report.message = Some(message.clone());
        self.publish_report(report).await;
        self.event(EventKind::Warning, reason, action, message)
            .await;
    }

    /// Publishes the labels for `observation` when they changed (or a resync is due).
    pub(super) async fn publish_labels(&mut self, observation: &Observation) {
        let tt_smi = self
            .config
            .tt_smi
            .as_ref()
            .filter(|_| self.tt_smi_installed)
            .map(|s| s.version.as_str());
        let labels = NodeLabels::desired(observation.mode(), observation.loaded_version(), tt_smi)
            .with_kernel_compiler(&self.compiler.kernel.label_value());
        if self.last_labels.as_ref() == Some(&labels) {
            return;
        }
        let started = Instant::now();
        match bounded(self.reporter.patch_labels(&labels)).await {
            Ok(()) => {
                info!(
                    step = "labels",
                    node = %self.config.node_name,
                    labels = %labels.merge_patch()["metadata"]["labels"],
                    elapsed_ms = millis(started.elapsed()),
                    "node labels published"
                );
                self.last_labels = Some(labels);
            }
            Err(e) => {
                self.last_labels = None;
                warn!(step = "labels", error = %e, "cannot publish node labels; retrying next pass");
            }
        }
    }

    /// Publishes `report` when it changed (or a resync is due).
    pub(super) async fn publish_report(&mut self, mut report: AgentReport) {
        report.kernel_compiler = Some(self.compiler.kernel.label_value());
        report.installed_kernels = self.next_kernels.readiness();
        report.start_load = self.start.start_load();
        if self.last_report.as_ref() == Some(&report) {
            return;
        }
        match bounded(self.reporter.publish_report(&report)).await {
            Ok(()) => {
                debug!(phase = ?report.phase, "agent report published");
                self.last_report = Some(report);
            }
            Err(e) => {
                self.last_report = None;
                warn!(step = "report", error = %e, "cannot publish the agent report; retrying next pass");
            }
        }
    }

    /// Records an Event unless the same reason and note were the last one recorded.
    pub(super) async fn event(
        &mut self,
        kind: EventKind,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let key = (reason.to_string(), note.clone());
        if self.last_event.as_ref() == Some(&key) {
            return;
        }
        let event = NodeEvent {
            kind,
            reason: reason.to_string(),
            action: action.to_string(),
            note,
        };
        match bounded(self.reporter.record_event(&event)).await {
            Ok(()) => self.last_event = Some(key),
            Err(e) => warn!(step = "event", reason, error = %e, "cannot record an event"),
        }
    }

    /// Logs and announces a successful swap.
    pub(super) async fn swapped(&mut self, report: SwapReport) {
        info!(
            step = "swap",
            version = %report.version,
            previous = report.previous.as_deref().unwrap_or("none"),
            outcome = ?report.outcome,
            killed = report.killed.len(),
            probe_ms = report.probe_ms,
            build_ms = report.build_ms,
            unload_ms = report.unload_ms,
            load_ms = report.load_ms,
            validate_ms = report.validate_ms,
            validation = report.validation.as_deref().unwrap_or("off"),
            total_ms = report.total_ms,
            "module swapped"
        );
        if !report.killed.is_empty() {
            let killed: Vec<String> = report
                .killed
                .iter()
                .map(|h| format!("pid {} ({})", h.pid, h.comm))
                .collect();
            let note = format!(
                "force unload killed {} holding /dev/tenstorrent before unloading",
                killed.join(", ")
            );
            warn!(step = "unload", %note);
            self.event(EventKind::Warning, reasons::HOLDERS_KILLED, "Unload", note)
                .await;
        }
        if report.outcome == SwapOutcome::AlreadyLoaded {
            // another agent on the node loaded the target while this one waited for the lock
            return;
        }
        let (reason, note) = match (report.outcome, &report.previous) {
            (SwapOutcome::Replaced, Some(previous)) if *previous == report.version.as_str() => (
                reasons::MODULE_REPLACED,
                format!(
                    "reloaded tt-kmd {previous} with parameters \"{}\" (unload {} ms, load {} ms)",
                    self.config.parameters, report.unload_ms, report.load_ms
                ),
            ),
            (SwapOutcome::Replaced, Some(previous)) => (
                reasons::MODULE_REPLACED,
                format!(
                    "replaced tt-kmd {previous} with {} (unload {} ms, load {} ms, total {} ms)",
                    report.version, report.unload_ms, report.load_ms, report.total_ms
                ),
            ),
            _ => (
                reasons::MODULE_INSTALLED,
                format!(
                    "loaded tt-kmd {} (load {} ms, total {} ms)",
                    report.version, report.load_ms, report.total_ms
                ),
            ),
        };
        let note = match &report.validation {
            Some(proven) => format!("{note}; validated: {proven}"),
            None => note,
        };
        self.last_event = None;
        self.event(EventKind::Normal, reason, "Load", note).await;
    }
}

/// Longest wait for one publication: a hung API server must not stall the node flow.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(20);

/// A publication, given up (as an error, retried next pass) after [`PUBLISH_TIMEOUT`].
pub(super) async fn bounded(
    publication: impl std::future::Future<Output = Result<(), ReportError>>,
) -> Result<(), String> {
    match tokio::time::timeout(PUBLISH_TIMEOUT, publication).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no answer within {} s; giving up until the next pass",
            PUBLISH_TIMEOUT.as_secs()
        )),
    }
}

/// A read from the reporter, given up after [`PUBLISH_TIMEOUT`].
pub(super) async fn bounded_read<T>(
    read: impl std::future::Future<Output = Result<T, ReportError>>,
) -> Result<T, String> {
    match tokio::time::timeout(PUBLISH_TIMEOUT, read).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} s", PUBLISH_TIMEOUT.as_secs())),
    }
}
