//! What the plugin shows, gathered from the cluster: the policies, the Nodes, the DaemonSets and
//! Events, as plain data the renderers read. Building it is [`crate::fetch`]'s job; everything
//! here is pure.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use ttdp_api::driver::v1alpha1::{NextKernels, WAITING_FOR_SLOT};
use ttdp_api::names::{annotations, labels};
use ttdp_api::node_record::NodeRecord;
use ttdp_api::node_selection::NodeSelection;
use ttdp_api::{NodeState, NodeStatus, TenstorrentDriverPolicy};

/// Everything one view needs.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    /// The policies shown, sorted by name.
    pub policies: Vec<PolicyView>,
    /// Every Node read, by name (empty when the view does not need Nodes).
    pub nodes: BTreeMap<String, NodeFacts>,
}

/// One policy and what belongs to it.
#[derive(Clone, Debug)]
pub struct PolicyView {
    /// The custom resource as read.
    pub policy: TenstorrentDriverPolicy,
    /// Its DaemonSet `ttdrv-<name>`, when found and readable.
    pub daemonset: Option<DaemonSetFacts>,
}

/// What the plugin uses of a Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// The owner recorded in the `driver.tenstorrent.com/cordoned-by` annotation.
    pub cordoned_by: Option<String>,
    /// The `driver.tenstorrent.com/retry` annotation: a retry was asked for and not yet taken.
    pub retry_requested: Option<String>,
    /// The `driver.tenstorrent.com/upgrade-record` annotation: the node's place in a policy's
    /// rollout, as the controller wrote it before acting on the node.
    pub upgrade_record: Option<String>,
}

impl NodeFacts {
    /// The node's upgrade record of `policy`, if it carries one.
    pub fn record_of(&self, policy: &str) -> Option<NodeRecord> {
        let value = self.upgrade_record.as_ref()?;
        let annotation = (annotations::UPGRADE_RECORD.to_owned(), value.clone());
        NodeRecord::of_policy([(&annotation.0, &annotation.1)], policy)
    }
}

impl From<&Node> for NodeFacts {
    fn from(node: &Node) -> Self {
        let annotations_of = node.metadata.annotations.as_ref();
        NodeFacts {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            unschedulable: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            cordoned_by: annotations_of.and_then(|a| a.get(annotations::CORDONED_BY).cloned()),
            retry_requested: annotations_of.and_then(|a| a.get(annotations::RETRY).cloned()),
            upgrade_record: annotations_of
                .and_then(|a| a.get(annotations::UPGRADE_RECORD).cloned()),
        }
    }
}

/// The rollout counters of a policy's DaemonSet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DaemonSetFacts {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Pods it should run.
    pub desired: i32,
    /// Pods ready.
    pub ready: i32,
    /// Pods running the current template.
    pub updated: i32,
}

impl From<&DaemonSet> for DaemonSetFacts {
    fn from(ds: &DaemonSet) -> Self {
        let status = ds.status.clone().unwrap_or_default();
        DaemonSetFacts {
            namespace: ds.metadata.namespace.clone().unwrap_or_default(),
            name: ds.metadata.name.clone().unwrap_or_default(),
            desired: status.desired_number_scheduled,
            ready: status.number_ready,
            updated: status.updated_number_scheduled.unwrap_or(0),
        }
    }
}

/// Where a node row came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowSource {
    /// The policy's `status.nodes`.
    Status,
    /// Node labels: a Done node the controller left out of `status.nodes` on a large fleet.
    NodeLabels,
    /// The node's upgrade record: written before each step, so newer than the status (a view
    /// the controller writes about once a second), and there for nodes the status leaves out.
    NodeRecord,
}

/// One node of one policy, as the `nodes` command lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRow {
    /// The policy.
    pub policy: String,
    /// The node's name.
    pub node: String,
    /// Where it is in the rollout.
    pub state: NodeState,
    /// Loaded version.
    pub current_version: Option<String>,
    /// Version being installed (the policy's version when the status does not say).
    pub target_version: String,
    /// `container` or `host`.
    pub install_mode: Option<String>,
    /// The loaded module's parameters (`name=value` ...), as the node's status entry says.
    pub loaded_parameters: Option<String>,
    /// The commit the loaded module was built from, as the node's status entry says.
    pub source_commit: Option<String>,
    /// tt-kmd's udev rule file on the node and whose it is, as the node's status entry says.
    pub udev_rule: Option<String>,
    /// The node's other installed kernels and whether their module is ready, as the node's
    /// status entry says.
    pub next_kernels: Option<NextKernels>,
    /// Who signed the loaded module, as the node's status entry says.
    pub module_signer: Option<String>,
    /// Who cordoned the node, from its annotation.
    pub cordoned_by: Option<String>,
    /// Whether the node is unschedulable (only known when Nodes were read).
    pub unschedulable: Option<bool>,
    /// When the node entered `state`.
    pub since: Option<Timestamp>,
    /// UpperCamelCase reason.
    pub reason: Option<String>,
    /// Human message.
    pub message: Option<String>,
    /// Failed attempts so far.
    pub attempts: Option<i32>,
    /// A retry was asked for and the controller has not taken it yet.
    pub retry_requested: bool,
    /// Where the row came from.
    pub source: RowSource,
}

impl NodeRow {
    /// The row as the node's upgrade `record` says, where it differs from what the row shows:
    /// the record is written before each step, the status after.
    fn take_record(&mut self, r: NodeRecord) {
        let since = Some(r.since.0);
        if self.state == r.state && self.since == since && self.attempts == r.attempts {
            return;
        }
        if self.state != r.state {
            self.message = None;
        }
        self.state = r.state;
        self.target_version = r.target;
        self.since = since;
        self.attempts = r.attempts;
        self.reason = r.reason;
        self.message = r.message.or(self.message.take());
        self.source = RowSource::NodeRecord;
    }

    /// `message` prefixed by `reason`, the "why" column.
    pub fn why(&self) -> String {
        match (&self.reason, &self.message) {
            (Some(r), Some(m)) if !m.is_empty() => format!("{r}: {m}"),
            (Some(r), _) => r.clone(),
            (None, Some(m)) => m.clone(),
            (None, None) => String::new(),
        }
    }
}

/// Orders names the way people count: `node-2` before `node-10` (runs of digits compare as
/// numbers), otherwise by character; ties (`node-01` and `node-1`) fall back to plain order.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    loop {
        match (x.first(), y.first()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(c), Some(d)) if c.is_ascii_digit() && d.is_ascii_digit() => {
                let (dx, rx) = split_digits(x);
                let (dy, ry) = split_digits(y);
                let (tx, ty) = (trim_zeros(dx), trim_zeros(dy));
                let order = tx.len().cmp(&ty.len()).then_with(|| tx.cmp(ty));
                if order != Ordering::Equal {
                    return order;
                }
                (x, y) = (rx, ry);
            }
            (Some(c), Some(d)) if c != d => return c.cmp(d),
            _ => (x, y) = (&x[1..], &y[1..]),
        }
    }
}

fn split_digits(s: &[u8]) -> (&[u8], &[u8]) {
    let end = s
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(s.len());
    s.split_at(end)
}

fn trim_zeros(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|c| *c != b'0').unwrap_or(s.len());
    &s[start..]
}

/// The name of a policy.
pub fn policy_name(policy: &TenstorrentDriverPolicy) -> &str {
    policy.metadata.name.as_deref().unwrap_or("")
}

/// The `status.nodes` of a policy, empty without a status.
pub fn listed_nodes(policy: &TenstorrentDriverPolicy) -> &[NodeStatus] {
    policy.status.as_ref().map_or(&[], |s| s.nodes.as_slice())
}

/// `summary.nodesOmitted` of a policy.
pub fn nodes_omitted(policy: &TenstorrentDriverPolicy) -> i32 {
    policy
        .status
        .as_ref()
        .and_then(|s| s.summary.as_ref())
        .map_or(0, |s| s.nodes_omitted)
}

impl Fleet {
    /// Every node named in any policy's `status.nodes`, in [`natural_cmp`] order: the columns
    /// of `status`.
    pub fn listed_node_names(&self) -> Vec<String> {
        let names: BTreeSet<&str> = self
            .policies
            .iter()
            .flat_map(|p| listed_nodes(&p.policy))
            .map(|n| n.name.as_str())
            .collect();
        let mut names: Vec<String> = names.into_iter().map(str::to_owned).collect();
        names.sort_by(|a, b| natural_cmp(a, b));
        names
    }

    /// The policy called `name`.
    pub fn policy(&self, name: &str) -> Option<&PolicyView> {
        self.policies
            .iter()
            .find(|p| policy_name(&p.policy) == name)
    }

    /// One row per node of each policy, sorted by policy then node ([`natural_cmp`]): the nodes in
    /// `status.nodes`, plus (when a large fleet's status omits nodes) the Nodes whose labels the
    /// policy selects that the status does not list: Done when their `kmd-version` is
    /// `spec.version`, else Pending waiting to start (the only nodes the controller omits, besides
    /// those past its byte bound); a node carrying its upgrade record shows what the record says.
    pub fn node_rows(&self) -> Vec<NodeRow> {
        let mut rows = Vec::new();
        for view in &self.policies {
            let policy = &view.policy;
            let name = policy_name(policy);
            let mut listed = BTreeSet::new();
            for n in listed_nodes(policy) {
                listed.insert(n.name.as_str());
                let facts = self.nodes.get(&n.name);
                rows.push(NodeRow {
                    policy: name.to_owned(),
                    node: n.name.clone(),
                    state: n.state,
                    current_version: n.current_version.clone(),
                    target_version: n
                        .target_version
                        .clone()
                        .unwrap_or_else(|| policy.spec.version.clone()),
                    install_mode: n.install_mode.clone(),
                    loaded_parameters: n.loaded_parameters.clone(),
                    source_commit: n.source_commit.clone(),
                    udev_rule: n.udev_rule.clone(),
                    next_kernels: n.next_kernels.clone(),
                    module_signer: n.module_signer.clone(),
                    cordoned_by: facts.and_then(|f| f.cordoned_by.clone()),
                    unschedulable: facts.map(|f| f.unschedulable),
                    since: n.last_transition_time.as_ref().map(|t| t.0),
                    reason: n.reason.clone(),
                    message: n.message.clone(),
                    attempts: n.attempts,
                    retry_requested: facts.is_some_and(|f| f.retry_requested.is_some()),
                    source: RowSource::Status,
                });
            }
            if nodes_omitted(policy) > 0 {
                rows.extend(self.omitted_rows(view, &listed));
            } else {
                rows.extend(self.unlisted_records(name, &listed));
            }
        }
        for row in &mut rows {
            let record = self
                .nodes
                .get(&row.node)
                .and_then(|f| f.record_of(&row.policy));
            if let Some(r) = record {
                row.take_record(r);
            }
        }
        rows.sort_by(|a, b| {
            a.policy
                .cmp(&b.policy)
                .then_with(|| natural_cmp(&a.node, &b.node))
        });
        rows
    }

    /// The nodes carrying an upgrade record of `policy` that its status does not list (yet, or
    /// any more: a status written moments ago, or wiped).
    fn unlisted_records(&self, policy: &str, listed: &BTreeSet<&str>) -> Vec<NodeRow> {
        self.nodes
            .values()
            .filter(|n| !listed.contains(n.name.as_str()))
            .filter_map(|n| {
                let r = n.record_of(policy)?;
                let row = labelled_row(policy, n, r.state, r.target.clone(), None);
                Some(NodeRow {
                    source: RowSource::NodeRecord,
                    ..row
                })
            })
            .collect()
    }

    /// The nodes of a large-fleet policy that its status leaves out, found by labels.
    fn omitted_rows(&self, view: &PolicyView, listed: &BTreeSet<&str>) -> Vec<NodeRow> {
        let policy = &view.policy;
        let Ok(selection) = NodeSelection::new(&policy.spec.user_selector()) else {
            return Vec::new();
        };
        self.nodes
            .values()
            .filter(|n| !listed.contains(n.name.as_str()) && selection.matches(&n.name, &n.labels))
            .map(|n| {
                let done = n.labels.get(labels::KMD_VERSION) == Some(&policy.spec.version);
                let state = if done {
                    NodeState::Done
                } else {
                    NodeState::Pending
                };
                // The omitted Pending nodes wait for the rollout's sake: for the pause when
                // there is one, else (most of them) for a slot.
                let reason = (!done).then(|| {
                    let paused = policy.spec.paused;
                    (if paused { "Paused" } else { WAITING_FOR_SLOT }).to_owned()
                });
                let name = policy_name(policy);
                labelled_row(name, n, state, policy.spec.version.clone(), reason)
            })
            .collect()
    }
}

/// A row of `policy` for node `n` from what the node's labels and annotations say.
fn labelled_row(
    policy: &str,
    n: &NodeFacts,
    state: NodeState,
    target_version: String,
    reason: Option<String>,
) -> NodeRow {
    NodeRow {
        policy: policy.to_owned(),
        node: n.name.clone(),
        state,
        current_version: n.labels.get(labels::KMD_VERSION).cloned(),
        target_version,
        install_mode: n.labels.get(labels::INSTALL_MODE).cloned(),
        loaded_parameters: None,
        source_commit: None,
        udev_rule: None,
        next_kernels: None,
        module_signer: None,
        cordoned_by: n.cordoned_by.clone(),
        unschedulable: Some(n.unschedulable),
        since: None,
        reason,
        message: None,
        attempts: None,
        retry_requested: n.retry_requested.is_some(),
        source: RowSource::NodeLabels,
    }
}

/// One agent pod of a policy's DaemonSet, as `describe` lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// The node it runs on (empty while unscheduled).
    pub node: String,
    /// The pod's name.
    pub name: String,
    /// Containers ready / containers.
    pub ready: (usize, usize),
    /// `status.phase`, or the reason a container is waiting (e.g. `CrashLoopBackOff`).
    pub status: String,
    /// Container restarts, summed.
    pub restarts: i32,
    /// When the pod was created.
    pub created: Option<Timestamp>,
}

impl From<&Pod> for PodFacts {
    fn from(pod: &Pod) -> Self {
        let status = pod.status.clone().unwrap_or_default();
        let containers = status.container_statuses.clone().unwrap_or_default();
        let waiting = containers
            .iter()
            .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
            .next();
        let terminating = pod.metadata.deletion_timestamp.is_some();
        PodFacts {
            node: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            ready: (
                containers.iter().filter(|c| c.ready).count(),
                pod.spec.as_ref().map_or(0, |s| s.containers.len()),
            ),
            status: if terminating {
                "Terminating".to_owned()
            } else {
                waiting
                    .or(status.phase)
                    .unwrap_or_else(|| "Unknown".to_owned())
            },
            restarts: containers.iter().map(|c| c.restart_count).sum(),
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }
}

/// One Event about a policy, as `describe` lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventFacts {
    /// `Normal` or `Warning`.
    pub type_: String,
    /// UpperCamelCase reason.
    pub reason: String,
    /// When it was last seen.
    pub last_seen: Option<Timestamp>,
    /// How many times it happened.
    pub count: i32,
    /// The reporting component.
    pub from: String,
    /// The message.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_counts_numbers() {
        let mut names = vec![
            "node-10", "node-2", "node-1", "gpu", "node-02", "node-1a", "node",
        ];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            [
                "gpu", "node", "node-1", "node-1a", "node-02", "node-2", "node-10"
            ]
        );
    }

    fn policy_with(nodes: serde_json::Value) -> TenstorrentDriverPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": {"name": "fleet"},
            "spec": {"version": "2.8.0"},
            "status": {"nodes": nodes},
        }))
        .unwrap()
    }

    fn carrying(name: &str, record: &str) -> NodeFacts {
        NodeFacts {
            name: name.to_owned(),
            unschedulable: true,
            upgrade_record: Some(record.to_owned()),
            ..NodeFacts::default()
        }
    }

    #[test]
    fn the_nodes_record_is_newer_than_a_status_that_lags() {
        let policy = policy_with(serde_json::json!([
            {"name": "n1", "state": "Pending", "reason": "WaitingForSlot"},
            {"name": "n2", "state": "Done", "currentVersion": "2.8.0"},
        ]));
        let record = r#"{"policy":"fleet","state":"Draining","target":"2.8.0","since":"2026-12-07T06:00:00Z"}"#;
        let fleet = Fleet {
            policies: vec![PolicyView {
                policy,
                daemonset: None,
            }],
            nodes: BTreeMap::from([("n1".to_owned(), carrying("n1", record))]),
        };
        let rows = fleet.node_rows();
        assert_eq!(rows[0].state, NodeState::Draining);
        assert_eq!(rows[0].reason, None, "the old state's reason is gone");
        assert_eq!(rows[0].source, RowSource::NodeRecord);
        assert_eq!(
            (rows[1].state, rows[1].source),
            (NodeState::Done, RowSource::Status)
        );
    }

    #[test]
    fn a_failed_node_the_status_lost_is_shown_from_its_record() {
        let record = r#"{"policy":"fleet","state":"Failed","target":"2.8.0","since":"2026-12-07T06:00:00Z","attempts":2,"reason":"NodeTimeout","message":"no progress in Upgrading"}"#;
        let other = r#"{"policy":"other","state":"Failed","target":"2.8.0","since":"2026-12-07T06:00:00Z"}"#;
        let fleet = Fleet {
            policies: vec![PolicyView {
                policy: policy_with(serde_json::json!([])),
                daemonset: None,
            }],
            nodes: BTreeMap::from([
                ("n1".to_owned(), carrying("n1", record)),
                ("n2".to_owned(), carrying("n2", other)),
            ]),
        };
        let rows = fleet.node_rows();
        assert_eq!(rows.len(), 1, "another policy's record is not this one's");
        let r = &rows[0];
        assert_eq!((r.state, r.attempts), (NodeState::Failed, Some(2)));
        assert_eq!(r.why(), "NodeTimeout: no progress in Upgrading");
    }
}
