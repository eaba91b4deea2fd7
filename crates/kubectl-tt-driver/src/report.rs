//! Machine-readable output (`-o json`, `-o yaml`) of `status` and `nodes`.
//!
//! The field names here are a stable interface for scripts: they are only ever added to, never
//! renamed or removed, within `apiVersion: tt-driver.kubectl.tenstorrent.com/v1`. Absent values
//! are `null` (never omitted), so every document has the same shape.

use serde::Serialize;

use crate::fleet::{Fleet, NodeRow, RowSource, listed_nodes, policy_name};

/// The `apiVersion` of the documents.
pub const API_VERSION: &str = "tt-driver.kubectl.tenstorrent.com/v1";

/// `status -o json|yaml`.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// [`API_VERSION`].
    pub api_version: &'static str,
    /// `Status`.
    pub kind: &'static str,
    /// One entry per policy, sorted by name.
    pub policies: Vec<PolicyReport>,
}

/// One policy in a [`StatusReport`].
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReport {
    /// The policy's name.
    pub name: String,
    /// `spec.version`.
    pub version: String,
    /// `spec.paused`.
    pub paused: bool,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.observedGeneration`.
    pub observed_generation: Option<i64>,
    /// Nodes selected.
    pub matched: i32,
    /// Nodes running the target version.
    pub up_to_date: i32,
    /// Nodes between Cordoning and Uncordoning.
    pub in_progress: i32,
    /// Nodes waiting.
    pub pending: i32,
    /// Nodes failed.
    pub failed: i32,
    /// Nodes the host manages.
    pub host_managed: i32,
    /// Nodes left to an older policy.
    pub conflicts: i32,
    /// Done and waiting nodes left out of `nodes` by the controller (large fleets).
    pub nodes_omitted: i32,
    /// `status.conditions`.
    pub conditions: Vec<ConditionReport>,
    /// The policy's DaemonSet, when found.
    pub daemon_set: Option<DaemonSetReport>,
    /// `status.nodes`.
    pub nodes: Vec<PolicyNodeReport>,
}

/// A condition in a [`PolicyReport`].
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConditionReport {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
    /// RFC 3339.
    pub last_transition_time: String,
}

/// A DaemonSet in a [`PolicyReport`].
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSetReport {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Pods it should run.
    pub desired: i32,
    /// Pods ready.
    pub ready: i32,
    /// Pods on the current template.
    pub updated: i32,
}

/// A node in a [`PolicyReport`].
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyNodeReport {
    /// Node name.
    pub name: String,
    /// State.
    pub state: String,
    /// Loaded version.
    pub current_version: Option<String>,
    /// Target version.
    pub target_version: Option<String>,
    /// `container` or `host`.
    pub install_mode: Option<String>,
    /// Reason.
    pub reason: Option<String>,
    /// Message.
    pub message: Option<String>,
    /// When the node entered its state (RFC 3339).
    pub since: Option<String>,
    /// Failed attempts.
    pub attempts: Option<i32>,
}

/// `nodes -o json|yaml`.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodesReport {
    /// [`API_VERSION`].
    pub api_version: &'static str,
    /// `NodeList`.
    pub kind: &'static str,
    /// One entry per node of each policy, sorted by policy then node.
    pub nodes: Vec<NodeReport>,
}

/// A node in a [`NodesReport`].
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// The policy.
    pub policy: String,
    /// Node name.
    pub name: String,
    /// State.
    pub state: String,
    /// Loaded version.
    pub current_version: Option<String>,
    /// Version being installed.
    pub target_version: String,
    /// `container` or `host`.
    pub install_mode: Option<String>,
    /// Who cordoned it (the `driver.tenstorrent.com/cordoned-by` annotation).
    pub cordoned_by: Option<String>,
    /// Whether the node is unschedulable (null when Nodes could not be read).
    pub unschedulable: Option<bool>,
    /// When it entered its state (RFC 3339).
    pub since: Option<String>,
    /// Reason.
    pub reason: Option<String>,
    /// Message.
    pub message: Option<String>,
    /// Failed attempts.
    pub attempts: Option<i32>,
    /// A `retry` was asked for and not yet taken.
    pub retry_requested: bool,
    /// `status` (the policy's status), `nodeLabels` (an omitted Done node found by labels) or
    /// `nodeRecord` (the node's upgrade record, newer than the status).
    pub source: &'static str,
}

/// The status document of a fleet.
pub fn status_report(fleet: &Fleet) -> StatusReport {
    let policies = fleet
        .policies
        .iter()
        .map(|view| {
            let p = &view.policy;
            let status = p.status.clone().unwrap_or_default();
            let s = status.summary.clone().unwrap_or_default();
            PolicyReport {
                name: policy_name(p).to_owned(),
                version: p.spec.version.clone(),
                paused: p.spec.paused,
                generation: p.metadata.generation,
                observed_generation: status.observed_generation,
                matched: s.matched,
                up_to_date: s.up_to_date,
                in_progress: s.in_progress,
                pending: s.pending,
                failed: s.failed,
                host_managed: s.host_managed,
                conflicts: s.conflicts,
                nodes_omitted: s.nodes_omitted,
                conditions: status
                    .conditions
                    .iter()
                    .map(|c| ConditionReport {
                        type_: c.type_.clone(),
                        status: c.status.clone(),
                        reason: c.reason.clone(),
                        message: c.message.clone(),
                        last_transition_time: c.last_transition_time.0.to_string(),
                    })
                    .collect(),
                daemon_set: view.daemonset.as_ref().map(|d| DaemonSetReport {
                    namespace: d.namespace.clone(),
                    name: d.name.clone(),
                    desired: d.desired,
                    ready: d.ready,
                    updated: d.updated,
                }),
                nodes: listed_nodes(p)
                    .iter()
                    .map(|n| PolicyNodeReport {
                        name: n.name.clone(),
                        state: n.state.as_str().to_owned(),
                        current_version: n.current_version.clone(),
                        target_version: n.target_version.clone(),
                        install_mode: n.install_mode.clone(),
                        reason: n.reason.clone(),
                        message: n.message.clone(),
                        since: n.last_transition_time.as_ref().map(|t| t.0.to_string()),
                        attempts: n.attempts,
                    })
                    .collect(),
            }
        })
        .collect();
    StatusReport {
        api_version: API_VERSION,
        kind: "Status",
        policies,
    }
}

/// The nodes document of these rows.
pub fn nodes_report(rows: &[NodeRow]) -> NodesReport {
    NodesReport {
        api_version: API_VERSION,
        kind: "NodeList",
        nodes: rows
            .iter()
            .map(|r| NodeReport {
                policy: r.policy.clone(),
                name: r.node.clone(),
                state: r.state.as_str().to_owned(),
                current_version: r.current_version.clone(),
                target_version: r.target_version.clone(),
                install_mode: r.install_mode.clone(),
                cordoned_by: r.cordoned_by.clone(),
                unschedulable: r.unschedulable,
                since: r.since.map(|t| t.to_string()),
                reason: r.reason.clone(),
                message: r.message.clone(),
                attempts: r.attempts,
                retry_requested: r.retry_requested,
                source: match r.source {
                    RowSource::Status => "status",
                    RowSource::NodeLabels => "nodeLabels",
                    RowSource::NodeRecord => "nodeRecord",
                },
            })
            .collect(),
    }
}
