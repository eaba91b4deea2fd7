//! The cluster after the rollout, as the user would check it: the policy's per-node states, the
//! node labels, cordons and deploy gates, and which workloads are still running. Also what the
//! demo writes with `--report`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;
use ttdp_api::names::{DEFAULT_DEPLOY_GATE, annotations, install_mode, labels};
use ttdp_api::{NodeState, TenstorrentDriverPolicy};

use crate::scenario::Demo;
use crate::timings::{Phase, RolloutTimes};

/// One node as the rollout left it: its state and loaded version in the policy's status (absent
/// for nodes the policy does not list), its `kmd-version` and `install-mode` labels,
/// `spec.unschedulable`, its `cordoned-by` annotation and its deploy-gate label.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeOutcome {
    pub name: String,
    /// `tenstorrent`, `host-managed` or `plain`.
    pub kind: String,
    pub state: Option<String>,
    pub status_version: Option<String>,
    pub kmd_version_label: Option<String>,
    pub install_mode_label: Option<String>,
    pub cordoned: bool,
    pub cordoned_by: Option<String>,
    pub deploy_gate: Option<String>,
}

/// A workload, whether the upgrade had to evict it, and whether its first pod still runs.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadOutcome {
    pub name: String,
    pub node: String,
    pub expected_evicted: bool,
    pub running: bool,
}

/// What `--report` writes.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub policy: String,
    /// The cluster the demo ran on, as `ClusterSource::kind` names it.
    pub cluster: &'static str,
    pub from: String,
    pub to: String,
    /// Whether the upgrade reached Ready and every check passed.
    pub success: bool,
    /// Checks that failed (empty on success), or why the demo stopped early.
    pub problems: Vec<String>,
    pub phases: Vec<Phase>,
    pub upgrade: RolloutTimes,
    pub nodes: Vec<NodeOutcome>,
    pub workloads: Vec<WorkloadOutcome>,
}

impl Demo {
    /// Reads the cluster's final state into `outcome` and checks it: every container node Done
    /// at `--to` with the label to match, the host-managed node HostManaged and still on its own
    /// version, plain nodes without any driver label, no node cordoned and no deploy gate left
    /// closed, workloads evicted exactly where the upgrade had to drain. The failed checks count
    /// unless something failed before.
    pub async fn inspect(&self, outcome: &mut Outcome) {
        let Some(policy) = self.watch.as_ref().and_then(|w| w.policy()) else {
            if outcome.problems.is_empty() {
                let policy = &self.names.policy;
                let never_seen = format!("TenstorrentDriverPolicy {policy} was never seen");
                outcome.problems.push(never_seen);
            }
            return;
        };
        let read = tokio::try_join!(self.node_outcomes(&policy), self.workload_outcomes());
        let (nodes, workloads) = match read {
            Ok(read) => read,
            Err(e) => {
                let error = format!("cannot read the cluster's final state: {e}");
                outcome.problems.push(error);
                return;
            }
        };
        if outcome.problems.is_empty() {
            let to = &self.args.to;
            let node_checks = nodes.iter().flat_map(|n| node_problems(n, to));
            let workload_checks = workloads.iter().filter_map(workload_problem);
            outcome.problems = node_checks.chain(workload_checks).collect();
        }
        outcome.nodes = nodes;
        outcome.workloads = workloads;
    }

    /// The fleet's nodes as the policy's status and the nodes themselves show them.
    async fn node_outcomes(
        &self,
        policy: &TenstorrentDriverPolicy,
    ) -> Result<Vec<NodeOutcome>, kube::Error> {
        let status: BTreeMap<&str, _> = policy
            .status
            .iter()
            .flat_map(|s| s.nodes.iter())
            .map(|n| (n.name.as_str(), n))
            .collect();
        let container = self.fleet.container_nodes();
        let host_managed = self.fleet.host_managed_node();
        let plain = self.fleet.plain_nodes();
        let mut outcomes = Vec::new();
        let nodes: Api<Node> = Api::all(self.client.clone());
        for node in nodes.list(&ListParams::default()).await?.items {
            let name = node.name_any();
            let kind = if container.contains(&name) {
                "tenstorrent"
            } else if host_managed.as_deref() == Some(name.as_str()) {
                "host-managed"
            } else if plain.contains(&name) {
                "plain"
            } else {
                // Someone else's node on a shared cluster.
                continue;
            };
            let label = |key: &str| node.labels().get(key).cloned();
            let entry = status.get(name.as_str());
            outcomes.push(NodeOutcome {
                kind: kind.to_owned(),
                state: entry.map(|n| n.state.to_string()),
                status_version: entry.and_then(|n| n.current_version.clone()),
                kmd_version_label: label(labels::KMD_VERSION),
                install_mode_label: label(labels::INSTALL_MODE),
                cordoned: node
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                cordoned_by: node.annotations().get(annotations::CORDONED_BY).cloned(),
                deploy_gate: label(DEFAULT_DEPLOY_GATE),
                name,
            });
        }
        Ok(outcomes)
    }

    /// Which workloads still run. On a real control plane a ReplicaSet replaces an evicted pod
    /// under the same labels, so a workload runs while the pod first placed for it (by uid,
    /// `Demo::placed`) does.
    async fn workload_outcomes(&self) -> Result<Vec<WorkloadOutcome>, kube::Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.cluster.namespace());
        let present: Vec<String> = pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.uid())
            .collect();
        let outcomes = self.fleet.workloads().into_iter().map(|workload| {
            let uid = self.placed.get(&workload.name);
            WorkloadOutcome {
                running: uid.is_some_and(|uid| present.contains(uid)),
                expected_evicted: self.fleet.is_drained(&workload),
                name: workload.name,
                node: workload.node,
            }
        });
        Ok(outcomes.collect())
    }
}

/// A workload evicted where the upgrade does not drain, or left where it does.
fn workload_problem(workload: &WorkloadOutcome) -> Option<String> {
    let (name, node) = (&workload.name, &workload.node);
    match (workload.expected_evicted, workload.running) {
        (true, true) => Some(format!(
            "workload {name} on {node} was not evicted by the drain"
        )),
        (false, false) => Some(format!(
            "workload {name} on {node} was evicted but that node is not upgraded by ttdp"
        )),
        _ => None,
    }
}

fn node_problems(node: &NodeOutcome, to: &str) -> Vec<String> {
    let name = &node.name;
    let state = node.state.as_deref();
    let label = node.kmd_version_label.as_deref();
    let listed_as = |expected: NodeState| {
        (state != Some(expected.as_str())).then(|| {
            let actual = state.unwrap_or("not listed");
            format!("node {name} is {actual} instead of {expected}")
        })
    };
    let mut problems = vec![
        node.cordoned
            .then(|| format!("node {name} is still cordoned")),
        node.cordoned_by
            .as_ref()
            .map(|owner| format!("node {name} still carries the cordoned-by annotation ({owner})")),
        node.deploy_gate
            .is_some()
            .then(|| format!("node {name} still carries the deploy gate {DEFAULT_DEPLOY_GATE}")),
    ];
    match node.kind.as_str() {
        "tenstorrent" => problems.extend([
            listed_as(NodeState::Done),
            (node.status_version.as_deref() != Some(to) || label != Some(to)).then(|| {
                format!(
                    "node {name} reports {} (status) and {} (label) instead of {to}",
                    node.status_version.as_deref().unwrap_or("nothing"),
                    label.unwrap_or("nothing"),
                )
            }),
        ]),
        "host-managed" => problems.extend([
            listed_as(NodeState::HostManaged),
            (node.install_mode_label.as_deref() != Some(install_mode::HOST))
                .then(|| format!("node {name} is not labelled install-mode=host")),
            (label == Some(to)).then(|| format!("node {name} is host-managed but now runs {to}")),
        ]),
        _ => problems.extend([
            state
                .is_some()
                .then(|| format!("plain node {name} appears in the policy's status")),
            (label.is_some() || node.install_mode_label.is_some())
                .then(|| format!("plain node {name} carries driver labels")),
        ]),
    }
    problems.into_iter().flatten().collect()
}
