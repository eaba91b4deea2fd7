//! Machine-readable output (`-o json`, `-o yaml`) of `status`, `nodes` and `describe`.
//!
//! The field names here are a stable interface for scripts: they are only ever added to, never
//! renamed or removed, within `apiVersion: tt-driver.kubectl.tenstorrent.com/v1`. Absent values
//! are `null` (never omitted), so every document has the same shape.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Serialize;
use ttdp_api::TenstorrentDriverPolicySpec;

use crate::fleet::{
    EventFacts, Fleet, NodeRow, PodFacts, PolicyView, RowSource, listed_nodes, policy_name,
};
use crate::render::describe::recent_events;

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

/// `describe POLICY -o json|yaml`: the facts the describe page shows.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DescribeReport {
    /// [`API_VERSION`].
    pub api_version: &'static str,
    /// `PolicyDescription`.
    pub kind: &'static str,
    /// The policy's name.
    pub name: String,
    /// When the policy was created (RFC 3339).
    pub created: Option<String>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.observedGeneration`.
    pub observed_generation: Option<i64>,
    /// The policy's `spec` as stored, with the CRD's field names.
    pub spec: TenstorrentDriverPolicySpec,
    /// The policy's DaemonSet, when found.
    pub daemon_set: Option<DaemonSetReport>,
    /// `status.summary` (null until the controller has written a status).
    pub summary: Option<SummaryReport>,
    /// `status.conditions`.
    pub conditions: Vec<ConditionReport>,
    /// Every node of the policy, as `nodes -o json` lists them: the status's entries, newer
    /// facts from each node's upgrade record, and the nodes a large status omits.
    pub nodes: Vec<NodeReport>,
    /// The policy's agent pods, sorted by node.
    pub agent_pods: Vec<AgentPodReport>,
    /// The most recent Events about the policy (at most 20), oldest first.
    pub events: Vec<EventReport>,
}

/// The counters of `status.summary` in a [`DescribeReport`].
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SummaryReport {
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
    /// Done and waiting nodes left out of `status.nodes` (large fleets).
    pub nodes_omitted: i32,
}

/// An agent pod in a [`DescribeReport`].
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentPodReport {
    /// The node it runs on (null while unscheduled).
    pub node: Option<String>,
    /// The pod's name.
    pub name: String,
    /// Containers ready.
    pub ready_containers: usize,
    /// Containers.
    pub containers: usize,
    /// `status.phase`, or why a container waits (e.g. `CrashLoopBackOff`), or `Terminating`.
    pub status: String,
    /// Container restarts, summed.
    pub restarts: i32,
    /// When the pod was created (RFC 3339).
    pub created: Option<String>,
}

/// An Event in a [`DescribeReport`].
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EventReport {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Reason.
    pub reason: String,
    /// When it was last seen (RFC 3339).
    pub last_seen: Option<String>,
    /// How many times it happened.
    pub count: i32,
    /// The reporting component.
    pub from: String,
    /// Message.
    pub message: String,
}

fn condition_report(c: &Condition) -> ConditionReport {
    ConditionReport {
        type_: c.type_.clone(),
        status: c.status.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
        last_transition_time: c.last_transition_time.0.to_string(),
    }
}

fn daemonset_report(view: &PolicyView) -> Option<DaemonSetReport> {
    view.daemonset.as_ref().map(|d| DaemonSetReport {
        namespace: d.namespace.clone(),
        name: d.name.clone(),
        desired: d.desired,
        ready: d.ready,
        updated: d.updated,
    })
}

/// The describe document of one policy: `rows` are its node rows, `pods` its agent pods,
/// `events` its Events (any order), as `describe` renders them.
pub fn describe_report(
    view: &PolicyView,
    rows: &[NodeRow],
    pods: &[PodFacts],
    events: &[EventFacts],
) -> DescribeReport {
    let p = &view.policy;
    let status = p.status.as_ref();
    DescribeReport {
        api_version: API_VERSION,
        kind: "PolicyDescription",
        name: policy_name(p).to_owned(),
        created: p
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string()),
        generation: p.metadata.generation,
        observed_generation: status.and_then(|s| s.observed_generation),
        spec: p.spec.clone(),
        daemon_set: daemonset_report(view),
        summary: status
            .and_then(|s| s.summary.as_ref())
            .map(|s| SummaryReport {
                matched: s.matched,
                up_to_date: s.up_to_date,
                in_progress: s.in_progress,
                pending: s.pending,
                failed: s.failed,
                host_managed: s.host_managed,
                conflicts: s.conflicts,
                nodes_omitted: s.nodes_omitted,
            }),
        conditions: status
            .map(|s| s.conditions.iter().map(condition_report).collect())
            .unwrap_or_default(),
        nodes: nodes_report(rows).nodes,
        agent_pods: pods
            .iter()
            .map(|pod| AgentPodReport {
                node: Some(pod.node.clone()).filter(|n| !n.is_empty()),
                name: pod.name.clone(),
                ready_containers: pod.ready.0,
                containers: pod.ready.1,
                status: pod.status.clone(),
                restarts: pod.restarts,
                created: pod.created.map(|t| t.to_string()),
            })
            .collect(),
        events: recent_events(events)
            .into_iter()
            .map(|e| EventReport {
                type_: e.type_.clone(),
                reason: e.reason.clone(),
                last_seen: e.last_seen.map(|t| t.to_string()),
                count: e.count,
                from: e.from.clone(),
                message: e.message.clone(),
            })
            .collect(),
    }
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
                conditions: status.conditions.iter().map(condition_report).collect(),
                daemon_set: daemonset_report(view),
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
