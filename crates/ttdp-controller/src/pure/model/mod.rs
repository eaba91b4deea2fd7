//! A model-based test of the pure core: a small simulated cluster (the [`World`]) on which
//! random sequences of events run ([`events`]), with the controller's reconcile driven through
//! the same pure entry points the runtime uses ([`controller`]), and the safety invariants
//! checked after every event ([`invariants`]).
//!
//! The world holds what the API server would: the nodes (labels, ttdp's annotations,
//! `unschedulable`, readiness), one agent pod per node at most (template hash, readiness, the
//! agent's report), the policy's spec and recorded status, and a clock. It also holds what the
//! controller keeps in memory (the drain tracker, the cordons lifted but not yet recorded),
//! which a restart loses, and the host's truth (the module loaded), which only the simulated
//! agent changes ([`agent`]).
//!
//! Shrunk counterexamples live on as ordinary tests in [`regressions`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use ttdp_api::agent_report::AgentReport;
use ttdp_api::names::{self, annotations, labels};
use ttdp_api::{TenstorrentDriverPolicySpec, TenstorrentDriverPolicyStatus};

use crate::pure::status::NodeEntries;
use crate::pure::transition::DrainProgress;

mod agent;
mod controller;
mod events;
mod invariants;
mod other;
mod property;
mod regressions;
mod scenarios;
mod writes;

/// The policy under test.
pub(super) const POLICY: &str = "fleet";
/// The other policy, which may overlap ours.
pub(super) const OTHER: &str = "other";
/// The deploy gate the controller closes on a cordoned node.
pub(super) const GATE: &str = names::DEFAULT_DEPLOY_GATE;
/// The label (on the even-numbered nodes) that the other policy selects.
pub(super) const POOL: (&str, &str) = ("pool", "shared");
/// The versions a policy may ask for.
pub(super) const VERSIONS: [&str; 3] = ["2.7.0", "2.8.0", "2.9.0"];
/// The signing Secrets `spec.module.signing` may name.
pub(super) const SIGNING_SECRETS: [&str; 2] = ["tt-kmd-signing", "tt-kmd-signing-rotated"];
/// `upgradePolicy.nodeTimeoutSeconds` in the model.
pub(super) const NODE_TIMEOUT_SECS: i64 = 600;

/// The model's fixed choices, drawn once per case.
#[derive(Clone, Debug)]
pub(super) struct Setup {
    /// How many nodes (`n0`, `n1`, ...).
    pub nodes: usize,
    /// `upgradePolicy.maxUnavailable`.
    pub max_unavailable: usize,
    /// `upgradePolicy.drain.enable`.
    pub drain: bool,
    /// `upgradePolicy.canary`: (nodes, soakSeconds, autoRollback).
    pub canary: Option<(usize, i64, bool)>,
    /// A maintenance schedule is set (its windows open and close by events).
    pub schedule: bool,
    /// `upgradePolicy.waitForCompletion` with `onTimeout: Fail`.
    pub wait_fail: bool,
    /// The nodes with nothing loaded at the start (first installs), by index.
    pub fresh: Vec<usize>,
    /// Another policy selecting the even-numbered nodes exists from the start; `true`: it is
    /// older than ours.
    pub other_older: Option<bool>,
}

/// An agent pod, and the agent in it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct AgentSim {
    /// The pod's uid (the controller deletes a pod by uid).
    pub uid: u64,
    /// The template hash it was created from.
    pub hash: String,
    /// The version its template asks for (`TT_KMD_VERSION`).
    pub target: String,
    /// Being deleted.
    pub terminating: bool,
    /// Its readiness probe passes.
    pub ready: bool,
    /// Its latest report (None: not reported yet).
    pub report: Option<AgentReport>,
}

/// A node, with its agent pod and the module loaded on its host.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct ModelNode {
    /// `n0`, `n1`, ...
    pub name: String,
    /// Its labels (the agent's `kmd-version`, the skip label, the deploy gates, the pool).
    pub labels: BTreeMap<String, String>,
    /// Its annotations (the cordon owner, the closed gates, the grant, a retry request).
    pub annotations: BTreeMap<String, String>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Its kubelet is down.
    pub not_ready: bool,
    /// The host's truth: the tt-kmd version loaded, if any.
    pub loaded: Option<String>,
    /// Its agent pod.
    pub pod: Option<AgentSim>,
    /// The next write to this node fails (an API error).
    pub fail_next_write: bool,
    /// A drain finished since the node was last cordoned: its workloads are gone.
    pub drained: bool,
}

impl ModelNode {
    /// Who cordoned it (`ttdp/<policy>` for a policy), if anyone recorded it.
    pub fn cordon_owner(&self) -> Option<&str> {
        self.annotations
            .get(annotations::CORDONED_BY)
            .map(String::as_str)
    }

    /// Whether `policy` cordoned it.
    pub fn cordoned_by(&self, policy: &str) -> bool {
        self.unschedulable && self.cordon_owner() == Some(names::cordon_owner(policy).as_str())
    }

    /// `policy`'s grant on it: the version granted.
    pub fn grant_of(&self, policy: &str) -> Option<String> {
        let value = self.annotations.get(annotations::UPGRADE_GRANT)?;
        let (p, v) = names::parse_upgrade_grant(value)?;
        (p == policy).then(|| v.to_owned())
    }

    /// Whether its deploy gate is closed (label `false` and listed in the annotation).
    pub fn gates_closed(&self) -> bool {
        self.labels.get(GATE).map(String::as_str) == Some(names::DEPLOY_GATE_CLOSED)
            && self.annotations.contains_key(annotations::DEPLOY_GATES)
    }

    /// Whether it carries the skip label.
    pub fn skipped(&self) -> bool {
        self.labels.contains_key(labels::SKIP)
    }
}

/// The other policy.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct OtherPolicy {
    /// Created before ours (it then owns the nodes both select).
    pub older: bool,
}

/// The simulated cluster and the controller's memory.
#[derive(Clone, Debug)]
pub(super) struct World {
    /// The fixed choices.
    pub setup: Setup,
    /// Our policy's spec.
    pub spec: TenstorrentDriverPolicySpec,
    /// The status as the API server has it (written by the status writer, which may lag or
    /// have failed): what a restarted controller reads.
    pub view: (TenstorrentDriverPolicyStatus, NodeEntries),
    /// Our policy's status as the controller decided it, without node entries.
    pub status: TenstorrentDriverPolicyStatus,
    /// Our policy's node entries as the controller decided them.
    pub entries: NodeEntries,
    /// The nodes, in name order.
    pub nodes: Vec<ModelNode>,
    /// The agent DaemonSet: its template hash and the version it asks for.
    pub daemonset: Option<(String, String)>,
    /// The signing Secret the agent DaemonSet names (`None`: no signing).
    pub daemonset_signing: Option<String>,
    /// The nodes the DaemonSet runs on (its node affinity).
    pub daemonset_nodes: BTreeSet<String>,
    /// The controller's drain tracker (lost on restart).
    pub drains: BTreeMap<String, DrainProgress>,
    /// Cordons lifted before a status write that has not succeeded yet (lost on restart).
    pub lifted_unrecorded: BTreeSet<String>,
    /// The next status write fails.
    pub fail_next_status_write: bool,
    /// Each node's failed attempts and whether it was Failed, as the controller last decided
    /// before acting on the node (a record written, or found already there); a node let go is
    /// removed. What a restart must not forget.
    pub decided_failures: BTreeMap<String, (i32, bool)>,
    /// The maintenance window is open (only with a schedule).
    pub window_open: bool,
    /// The other policy, if it exists.
    pub other: Option<OtherPolicy>,
    /// The clock.
    pub now: Timestamp,
    /// Every version any node of ours ever had loaded.
    pub ever_loaded: BTreeSet<String>,
    /// The next pod uid.
    pub next_uid: u64,
}

/// The model's epoch.
fn epoch() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The spec of a policy of `setup` at `version`.
pub(super) fn spec_of(setup: &Setup, version: &str) -> TenstorrentDriverPolicySpec {
    let mut upgrade = serde_json::json!({
        "maxUnavailable": setup.max_unavailable,
        "drain": {"enable": setup.drain, "timeoutSeconds": 300},
        "nodeTimeoutSeconds": NODE_TIMEOUT_SECS,
    });
    if let Some((nodes, soak, auto_rollback)) = setup.canary {
        upgrade["canary"] =
            serde_json::json!({"nodes": nodes, "soakSeconds": soak, "autoRollback": auto_rollback});
    }
    if setup.wait_fail {
        upgrade["waitForCompletion"] = serde_json::json!(
            {"podSelector": "job-name", "timeoutSeconds": 120, "onTimeout": "Fail"}
        );
    }
    let spec = serde_json::json!({"version": version, "upgradePolicy": upgrade});
    serde_json::from_value(spec).unwrap_or_else(|e| panic!("the model's spec: {e}"))
}

impl World {
    /// The world of `setup`: every node but the fresh ones runs the first version with a Ready
    /// agent, and the controller has reconciled once.
    pub(super) fn new(setup: &Setup) -> Self {
        let nodes = (0..setup.nodes)
            .map(|i| {
                let loaded = (!setup.fresh.contains(&i)).then(|| VERSIONS[0].to_owned());
                let mut node_labels = BTreeMap::new();
                if i % 2 == 0 {
                    node_labels.insert(POOL.0.to_owned(), POOL.1.to_owned());
                }
                ModelNode {
                    name: format!("n{i}"),
                    labels: node_labels,
                    annotations: BTreeMap::new(),
                    unschedulable: false,
                    not_ready: false,
                    loaded,
                    pod: None,
                    fail_next_write: false,
                    drained: false,
                }
            })
            .collect();
        let mut world = World {
            setup: setup.clone(),
            spec: spec_of(setup, VERSIONS[0]),
            status: TenstorrentDriverPolicyStatus::default(),
            entries: NodeEntries::new(),
            view: Default::default(),
            nodes,
            daemonset: None,
            daemonset_signing: None,
            daemonset_nodes: BTreeSet::new(),
            drains: BTreeMap::new(),
            lifted_unrecorded: BTreeSet::new(),
            fail_next_status_write: false,
            decided_failures: BTreeMap::new(),
            window_open: true,
            other: setup.other_older.map(|older| OtherPolicy { older }),
            now: epoch(),
            ever_loaded: BTreeSet::new(),
            next_uid: 1,
        };
        world.settle();
        world
    }

    /// Reconciles and lets every agent act, twice: the steady state of the first version.
    fn settle(&mut self) {
        for _ in 0..3 {
            controller::reconcile(self);
            for i in 0..self.nodes.len() {
                agent::act(self, i);
            }
        }
        controller::reconcile(self);
    }

    /// The node named `name`.
    pub(super) fn node(&self, name: &str) -> Option<&ModelNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The world in a few lines, for a violation's message.
    pub(super) fn brief(&self) -> String {
        let rollout = self.status.rollout.as_ref().map(|r| {
            format!(
                "rollout {} to {} from {:?} canaries {:?}",
                r.phase, r.target_version, r.from_version, r.canary_nodes
            )
        });
        let mut out = format!(
            "spec.version={} paused={} maxUnavailable={} drain={} canary={:?} window_open={} other={:?} t={}s {}\n",
            self.spec.version,
            self.spec.paused,
            self.setup.max_unavailable,
            self.setup.drain,
            self.setup.canary,
            self.window_open,
            self.other,
            self.now.as_second() - epoch().as_second(),
            rollout.unwrap_or_default(),
        );
        for n in &self.nodes {
            out.push_str(&self.node_line(n));
            out.push('\n');
        }
        out
    }

    fn node_line(&self, n: &ModelNode) -> String {
        let entry = self
            .entries
            .get(n.name.as_str())
            .map(|e| format!("{:?}({})", e.state, e.reason.as_deref().unwrap_or("")));
        let pod = n.pod.as_ref().map(|p| {
            let phase = p.report.as_ref().map(|r| format!("{:?}", r.phase));
            format!(
                "pod[{} ready={} term={} {}]",
                p.target,
                p.ready,
                p.terminating,
                phase.unwrap_or_else(|| "-".into())
            )
        });
        format!(
            "  {}: {} loaded={:?} {} cordon={:?} unsched={} gates={} grant={:?} notready={} skip={} drain={:?}",
            n.name,
            entry.unwrap_or_else(|| "-".into()),
            n.loaded,
            pod.unwrap_or_else(|| "no pod".into()),
            n.cordon_owner(),
            n.unschedulable,
            n.gates_closed(),
            n.annotations.get(annotations::UPGRADE_GRANT),
            n.not_ready,
            n.skipped(),
            self.drains.get(&n.name),
        )
    }
}
