//! The status of a `TenstorrentDriverPolicy` (`driver.tenstorrent.com/v1alpha1`), written by the
//! controller only: the summary, the rollout, each node's state and the condition types.
//! Re-exported from [`super::v1alpha1`], where the resource is.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::node_kernels::{NextKernels, NodeStartLoad};

/// Observed state, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenstorrentDriverPolicyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`, `Progressing`, `Degraded`, `Paused`, `InvalidSpec`, `Reconciled` and
    /// `KernelsReady`, merged by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<metav1::Condition>,

    /// Counts over every matched node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,

    /// Per-node state. Past 1,000 matched nodes, Done nodes and Pending nodes waiting for the
    /// rollout's sake (a slot, the pause, a maintenance window, the canary, a halt) are left out
    /// to keep the object small; at any size the entries take at most 224 KiB (Failed nodes
    /// first, then those in flight). `summary` counts every node and `summary.nodesOmitted` says
    /// how many are left out. `kubectl tt driver nodes` lists every node, each node in flight or
    /// Failed from its own upgrade record.
    //
    // Atomic, not a list map keyed by name: the controller is the status's only writer, and the
    // API server then tracks the list as one field instead of one per entry, which more than
    // halves the cost of each status write of a large fleet (docs/benchmarks.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub nodes: Vec<NodeStatus>,

    /// Where a rollout guarded by a canary or maintenance windows stands. Absent without them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

/// The phases of a guarded rollout (`status.rollout.phase`).
pub mod rollout_phase {
    /// The canary nodes upgrade; no other node starts.
    pub const CANARY: &str = "Canary";
    /// Every canary node is Done; nothing starts until `soakUntil`.
    pub const SOAKING: &str = "Soaking";
    /// The rest of the fleet follows under `maxUnavailable`.
    pub const ROLLING: &str = "Rolling";
    /// A canary node failed or went unready: nothing starts until the spec changes or the node
    /// is retried or skipped.
    pub const HALTED: &str = "Halted";
    /// Halted with `autoRollback`: the canary nodes go back to `fromVersion`.
    pub const ROLLING_BACK: &str = "RollingBack";
    /// Every canary node is back on `fromVersion`; nothing else starts until the spec changes.
    pub const ROLLED_BACK: &str = "RolledBack";
}

/// Where a guarded rollout stands: its canary, its soak, its halt and its windows.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The version this rollout goes to (`spec.version` when it began).
    pub target_version: String,
    /// The version the nodes ran before it began: where `autoRollback` takes the canary nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_version: Option<String>,
    /// `Canary`, `Soaking`, `Rolling`, `Halted`, `RollingBack` or `RolledBack`
    /// (see [`rollout_phase`]); empty without a canary.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// The canary nodes, chosen when the rollout began: the first nodes in name order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canary_nodes: Vec<String>,
    /// When the soak ends (set when every canary node is Done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_until: Option<metav1::Time>,
    /// Why the rollout halted: which canary node and what happened to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted_by: Option<String>,
    /// Outside every maintenance window: when the next one opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<metav1::Time>,
}

/// Counts of matched nodes by state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Nodes the policy selects (including host-managed and conflicting ones).
    #[serde(default)]
    pub matched: i32,
    /// Nodes running the target version (Done).
    #[serde(default)]
    pub up_to_date: i32,
    /// Nodes from Cordoning to Uncordoning. An Uncordoning node whose cordon is lifted counts
    /// here but no longer against `maxUnavailable`.
    #[serde(default)]
    pub in_progress: i32,
    /// Nodes waiting for their turn.
    #[serde(default)]
    pub pending: i32,
    /// Nodes whose upgrade failed.
    #[serde(default)]
    pub failed: i32,
    /// Nodes whose driver the host manages (DKMS).
    #[serde(default)]
    pub host_managed: i32,
    /// Nodes also selected by an older policy, left to it.
    #[serde(default)]
    pub conflicts: i32,
    /// Nodes left out of `status.nodes` to keep the object small: past 1,000 matched nodes the
    /// Done ones and those waiting for a slot, and at any size what passes its byte cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nodes_omitted: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// The most characters of a node entry's `message` (the CRD's `maxLength`).
pub const MAX_NODE_MESSAGE_CHARS: usize = 1024;

/// The reason of a Pending node waiting for a free `maxUnavailable` slot.
pub const WAITING_FOR_SLOT: &str = "WaitingForSlot";

/// The reasons of a Pending node that waits to start for the rollout's sake, not its own: for a
/// slot, for the pause to end, for a maintenance window, for the canary (or its soak), or
/// behind a halt. On a large fleet these are the many nodes `status.nodes` counts in the
/// summary instead of listing.
pub const WAITING_TO_START: [&str; 6] = [
    WAITING_FOR_SLOT,
    "Paused",
    "OutsideMaintenanceWindow",
    "WaitingForCanary",
    "CanarySoaking",
    "RolloutHalted",
];

/// One node's place in the rollout. Optional fields are omitted when empty to keep the status
/// small at fleet scale.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// The node's name.
    pub name: String,
    /// Where the node is in the rollout.
    pub state: NodeState,
    /// The version the node reports loaded (its `kmd-version` label); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// The version being installed, when it differs from `spec.version` or the node is not Done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    /// `container` or `host`, as the node's agent reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_mode: Option<String>,
    /// UpperCamelCase reason for the state (e.g. `DrainTimeout`, `UnsupportedCompiler`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What is happening or what went wrong, and what to do (at most
    /// [`MAX_NODE_MESSAGE_CHARS`] characters; a longer one is cut, with an ellipsis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_NODE_MESSAGE_CHARS))]
    pub message: Option<String>,
    /// When the node entered `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<metav1::Time>,
    /// When the node's current upgrade started (entered Cordoning, or Upgrading without drain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_start_time: Option<metav1::Time>,
    /// Failed attempts so far in this rollout (retries back off exponentially).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    /// The loaded module's parameters as the node's sysfs shows them
    /// (`/sys/module/tenstorrent/parameters/`), `name=value` space-separated; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded_parameters: Option<String>,
    /// The commit the loaded module was built from (its cache record); absent when unknown
    /// (not built by ttdp, or host-managed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_commit: Option<String>,
    /// tt-kmd's udev rule file on the node and whose it is, as its agent reports, e.g.
    /// `/etc/udev/rules.d/50-tenstorrent.rules (tt-kmd 2.8.0)`; absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udev_rule: Option<String>,
    /// The kernels installed on the node other than the running one, as its agent prepared
    /// them: how many have the module ready, and those that do not, with why. Absent when the
    /// agent reports none (one kernel installed, or not looked yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_kernels: Option<NextKernels>,
    /// Who signed the loaded module (its `signer`, as `modinfo` shows it); absent when the
    /// module is unsigned or nothing is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_signer: Option<String>,
    /// How the module came up when the node's agent last started: from the cache (a hit) or
    /// built or downloaded, and how long until the agent was Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_load: Option<NodeStartLoad>,
}

impl NodeStatus {
    /// Node `name` in `state`, with nothing else known about it yet.
    pub fn new(name: &str, state: NodeState) -> Self {
        Self {
            name: name.to_owned(),
            state,
            current_version: None,
            target_version: None,
            install_mode: None,
            reason: None,
            message: None,
            last_transition_time: None,
            phase_start_time: None,
            attempts: None,
            loaded_parameters: None,
            source_commit: None,
            udev_rule: None,
            next_kernels: None,
            module_signer: None,
            start_load: None,
        }
    }

    /// Whether the node is Pending only because no slot is free: the commonest entry of a large
    /// rollout, left out of `status.nodes` past 1,000 nodes.
    pub fn is_waiting_for_slot(&self) -> bool {
        self.state == NodeState::Pending && self.reason.as_deref() == Some(WAITING_FOR_SLOT)
    }

    /// Whether the node is Pending for the rollout's sake ([`WAITING_TO_START`]): a slot, the
    /// pause, a window, the canary or a halt.
    pub fn is_waiting_to_start(&self) -> bool {
        self.state == NodeState::Pending
            && self
                .reason
                .as_deref()
                .is_some_and(|r| WAITING_TO_START.contains(&r))
    }
}

/// The per-node upgrade state machine:
/// `Pending → Cordoning → Draining → Upgrading → Uncordoning → Done`, any step `→ Failed`,
/// plus `HostManaged` and `Conflict`.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum NodeState {
    /// Waiting for a slot (or for the policy to be unpaused).
    Pending,
    /// Being cordoned; deploy gates being closed.
    Cordoning,
    /// Pods that use the device (and, with fullNode, every other pod) being evicted.
    Draining,
    /// The agent pod is being replaced and the module swapped.
    Upgrading,
    /// Deploy gates being reopened; cordon being lifted.
    Uncordoning,
    /// Running the target version.
    Done,
    /// The upgrade failed; see reason and message. Retried with back-off.
    Failed,
    /// The host manages the driver (DKMS); ttdp only observes.
    HostManaged,
    /// Also selected by an older policy, which owns the node.
    Conflict,
}

impl NodeState {
    /// Every state, in rollout order.
    pub const ALL: [NodeState; 9] = [
        NodeState::Pending,
        NodeState::Cordoning,
        NodeState::Draining,
        NodeState::Upgrading,
        NodeState::Uncordoning,
        NodeState::Done,
        NodeState::Failed,
        NodeState::HostManaged,
        NodeState::Conflict,
    ];

    /// Whether the node holds one of the `maxUnavailable` slots (Cordoning to Uncordoning).
    pub fn is_in_flight(self) -> bool {
        matches!(
            self,
            NodeState::Cordoning
                | NodeState::Draining
                | NodeState::Upgrading
                | NodeState::Uncordoning
        )
    }

    /// The state's name as written in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Pending => "Pending",
            NodeState::Cordoning => "Cordoning",
            NodeState::Draining => "Draining",
            NodeState::Upgrading => "Upgrading",
            NodeState::Uncordoning => "Uncordoning",
            NodeState::Done => "Done",
            NodeState::Failed => "Failed",
            NodeState::HostManaged => "HostManaged",
            NodeState::Conflict => "Conflict",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Condition types and reasons of `status.conditions`.
pub mod condition {
    /// Every matched node is Done or HostManaged.
    pub const READY: &str = "Ready";
    /// A rollout is under way.
    pub const PROGRESSING: &str = "Progressing";
    /// Nodes failed; with more failures than `maxUnavailable` the rollout is halted.
    pub const DEGRADED: &str = "Degraded";
    /// `spec.paused` is true.
    pub const PAUSED: &str = "Paused";
    /// The spec cannot be acted on (e.g. `podSelectorLabel` does not parse).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The controller could apply the policy's DaemonSet and reach every object it needs;
    /// False carries what failed in the API server's words.
    pub const RECONCILED: &str = "Reconciled";
    /// Every kernel installed on the nodes (other than the running one) has the module ready,
    /// so a reboot into it finds the driver; False names the nodes that would boot without it.
    pub const KERNELS_READY: &str = "KernelsReady";
}
