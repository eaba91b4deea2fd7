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

/// Reads the cluster and checks it: every container node Done at `--to` with the label to
/// match, the host-managed node HostManaged and still on its own version, plain nodes without
/// any driver label, no node cordoned and no deploy gate left closed, workloads evicted exactly
/// where the upgrade had to drain. Returns the nodes, the workloads and the failed checks.
pub async fn inspect(
    demo: &Demo,
    policy: &TenstorrentDriverPolicy,
) -> Result<(Vec<NodeOutcome>, Vec<WorkloadOutcome>, Vec<String>), kube::Error> {
    let status: BTreeMap<&str, _> = policy
        .status
        .iter()
        .flat_map(|s| s.nodes.iter())
        .map(|n| (n.name.as_str(), n))
        .collect();
    let nodes: Api<Node> = Api::all(demo.client.clone());
    let mut problems = Vec::new();
    let mut outcomes = Vec::new();
    let fleet = &demo.fleet;
    let container = fleet.container_nodes();
    let host_managed = fleet.host_managed_node();
    let plain = fleet.plain_nodes();
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
        let outcome = NodeOutcome {
            name: name.clone(),
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
        };
        problems.extend(node_problems(&outcome, &demo.args.to));
        outcomes.push(outcome);
    }
    let workloads = workload_outcomes(demo, &mut problems).await?;
    Ok((outcomes, workloads, problems))
}

/// Which workloads still run, against where the upgrade had to drain. On a real control plane a
/// ReplicaSet replaces an evicted pod under the same labels, so a workload runs while the pod
/// first placed for it (by uid, `Demo::placed`) does.
async fn workload_outcomes(
    demo: &Demo,
    problems: &mut Vec<String>,
) -> Result<Vec<WorkloadOutcome>, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(demo.client.clone(), demo.cluster.namespace());
    let present: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.uid())
        .collect();
    let mut workloads = Vec::new();
    for workload in demo.fleet.workloads() {
        let running = demo
            .placed
            .get(&workload.name)
            .is_some_and(|uid| present.contains(uid));
        let expected_evicted = demo.fleet.is_drained(&workload);
        let (name, node) = (workload.name, workload.node);
        if expected_evicted && running {
            problems.push(format!(
                "workload {name} on {node} was not evicted by the drain"
            ));
        }
        if !expected_evicted && !running {
            problems.push(format!(
                "workload {name} on {node} was evicted but that node is not upgraded by ttdp"
            ));
        }
        workloads.push(WorkloadOutcome {
            name,
            node,
            expected_evicted,
            running,
        });
    }
    Ok(workloads)
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
