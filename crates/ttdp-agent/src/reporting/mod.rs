//! [`Reporter`]: where the agent publishes what it found and did, so the node flow runs the same
//! against a cluster ([`KubeReporter`]), a file ([`FileReporter`], e.g. inside a VM) or nothing
//! ([`NoReporter`]), and is unit-testable with a fake.
//!
//! Three things are published, each only by the agent about its own node:
//! - node labels ([`NodeLabels`], a minimal merge patch);
//! - the [`AgentReport`] (JSON in the pod annotation `driver.tenstorrent.com/agent-report`);
//! - Events about the node ([`NodeEvent`]: holders, failures, installs).
//!
//! A failed publication is logged and retried on the next pass; it never stops the node flow.

mod disabled;
mod file;
mod kube;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use ttdp_api::agent_report::AgentReport;

use crate::grant::GrantView;
use crate::labels::NodeLabels;

pub use disabled::NoReporter;
pub use file::{FileReporter, MAX_EVENTS, RecordedEvent, ReportFile};
pub use kube::{KubeReporter, PodRef};

/// Normal or Warning, as in Kubernetes Events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EventKind {
    /// Something worth knowing happened.
    Normal,
    /// Something needs attention.
    Warning,
}

/// An Event about the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    /// Normal or Warning.
    pub kind: EventKind,
    /// UpperCamelCase reason, e.g. `DeviceHeld`, `BuildFailed`, `ModuleInstalled`.
    pub reason: String,
    /// What the agent was doing, e.g. `Unload`, `Build`, `Load`.
    pub action: String,
    /// The human-readable account.
    pub note: String,
}

/// Publishing failed (the agent retries on its next pass).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A Kubernetes API call failed.
    #[error(
        "cannot {action} {object} through the kubernetes api: {source}; check the agent's RBAC and the api server"
    )]
    Kube {
        /// What was attempted, e.g. `patch labels of`.
        action: &'static str,
        /// The object, e.g. `node n1`.
        object: String,
        /// The kube error.
        #[source]
        source: ::kube::Error,
    },
    /// The report file could not be written.
    #[error("cannot write report file {}: {source}; check that its directory exists and is writable", .path.display())]
    File {
        /// The report file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Encoding to JSON failed.
    #[error("cannot encode the agent report as json: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Where the node flow publishes labels, its report and Events.
pub trait Reporter: Send + Sync {
    /// Applies `labels` to this node (set or remove each key, nothing else).
    fn patch_labels(
        &self,
        labels: &NodeLabels,
    ) -> impl Future<Output = Result<(), ReportError>> + Send;

    /// Publishes the agent's latest report.
    fn publish_report(
        &self,
        report: &AgentReport,
    ) -> impl Future<Output = Result<(), ReportError>> + Send;

    /// Records an Event about this node.
    fn record_event(
        &self,
        event: &NodeEvent,
    ) -> impl Future<Output = Result<(), ReportError>> + Send;

    /// The value of label `key` on this node as an admin set it (e.g. the per-node opt-in
    /// `driver.tenstorrent.com/allow-no-rollback`); `None` when unset or when the backend has no
    /// node to read (the default).
    fn node_label(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<String>, ReportError>> + Send {
        let _ = key;
        std::future::ready(Ok(None))
    }

    /// The controller's upgrade grant on this node, read fresh (see [`crate::grant`]). Backends
    /// without a controller behind them (the default) answer [`GrantView::NotEnforced`].
    fn upgrade_grant(&self) -> impl Future<Output = Result<GrantView, ReportError>> + Send {
        std::future::ready(Ok(GrantView::NotEnforced))
    }
}

impl<R: Reporter> Reporter for Arc<R> {
    fn patch_labels(
        &self,
        labels: &NodeLabels,
    ) -> impl Future<Output = Result<(), ReportError>> + Send {
        self.as_ref().patch_labels(labels)
    }

    fn publish_report(
        &self,
        report: &AgentReport,
    ) -> impl Future<Output = Result<(), ReportError>> + Send {
        self.as_ref().publish_report(report)
    }

    fn record_event(
        &self,
        event: &NodeEvent,
    ) -> impl Future<Output = Result<(), ReportError>> + Send {
        self.as_ref().record_event(event)
    }

    fn node_label(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<String>, ReportError>> + Send {
        self.as_ref().node_label(key)
    }

    fn upgrade_grant(&self) -> impl Future<Output = Result<GrantView, ReportError>> + Send {
        self.as_ref().upgrade_grant()
    }
}
