//! The per-node upgrade state machine, as one pure function: [`next`] maps what the controller
//! knows about a node ([`NodeObservation`]) to where the node goes and what to do there
//! ([`NodeTransition`]).
//!
//! `Pending → Cordoning → Draining → Upgrading → Uncordoning → Done`, `→ Failed` from any step,
//! plus `HostManaged` (the host's DKMS manages the module) and `Conflict` (an older policy owns
//! the node).
//!
//! Durability: the recorded state (from `status.nodes[]`) is only a hint. The node's own
//! annotations (who cordoned it, which deploy gates we closed), the agent pod (template hash,
//! readiness, report) and the node's `kmd-version` label decide. A node we cordoned but whose
//! recorded state was lost resumes in Draining (draining again evicts nothing new) or later; it is
//! never left cordoned. Every action is idempotent ("make it so"), so the reconciler can record
//! the new state first and act second: a crash in between repeats the action, never skips it.
//!
//! Pausing stops nodes from *starting*: no node leaves Pending (or Done, see
//! [`crate::pure::pause`]). A node already cordoned for its upgrade goes on to Done, drained,
//! swapped and uncordoned, so a pause never keeps a node out of service.
//!
//! The upgrade grant: the agent swaps a loaded module of another version only when the node
//! carries this policy's grant for the target ([`Action::Grant`], the node annotation
//! `driver.tenstorrent.com/upgrade-grant`). The grant is given only on entering Upgrading through
//! the gate (a slot, and with drain enabled after the drain), so an agent pod that runs the
//! current template on a node it has not reached yet (recreated after a deletion or an eviction,
//! or on a node that joined with a module loaded) waits for its turn instead of swapping at
//! once. A node in Upgrading that needs a grant and has none, and did not come through the
//! drain, goes back through the gate. A fresh install (nothing loaded) and a template-only
//! change need no grant. [`Action::Release`] removes it.
//!
//! Dead nodes never stall the fleet: a node that is not Ready when its turn comes stays Pending
//! (`NodeNotReady`) and takes no slot, and a node that stays in one step (Cordoning, Draining,
//! Upgrading) past [`RolloutRules::step_deadline`] fails (`NodeTimeout`), freeing its slot and
//! counting against the failure budget. The deadline counts from the step's recorded
//! `lastTransitionTime`, so it survives a controller restart.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use ttdp_api::NodeState;
use ttdp_kmd_types::KmdVersion;

use crate::pure::agent_blocker::Blocker;

mod decide;
#[cfg(test)]
mod tests;

/// The agent pod on a node, as far as the state machine cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentPod {
    /// No agent pod on the node (not scheduled yet, or just deleted).
    Missing,
    /// No agent pod on the node, and the DaemonSet controller says why it cannot create one
    /// (its `FailedCreate` Event).
    NotCreated(Blocker),
    /// The agent pod is being deleted.
    Terminating,
    /// The agent pod runs an older pod template.
    Stale,
    /// The agent pod runs the DaemonSet's current template.
    Current(AgentCondition),
}

/// How an agent pod on the current template is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentCondition {
    /// Running but it has not reported yet: what the node has loaded may not be known yet.
    Starting,
    /// Building or swapping.
    Working,
    /// Kubernetes does not run it, and says why: unschedulable, a container that cannot be
    /// created, a node that is not Ready. Kubernetes keeps retrying, so the node waits.
    Stuck(Blocker),
    /// Ready: its readiness probe passes.
    Ready,
    /// Waiting for the controller's upgrade grant before it swaps the loaded module.
    WaitingForGrant,
    /// Waiting for processes holding `/dev/tenstorrent` (without forceUnload).
    WaitingForHolders {
        /// e.g. "held by pid 1234 (python3)".
        message: String,
    },
    /// Failed: image pull error, crash loop, build failure, ...
    Failed {
        /// UpperCamelCase reason.
        reason: String,
        /// What failed and what to do.
        message: String,
    },
}

/// Progress of the node's drain (run in the background by the reconciler).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainProgress {
    /// No drain has run since the controller started (or since the node entered Draining).
    NotStarted,
    /// A drain is running.
    Running {
        /// Progress, e.g. "evicting 3 pods".
        message: String,
    },
    /// Every pod to evict is gone.
    Succeeded {
        /// Pods the drain left because they have no controller and `drain.force` is off
        /// (`namespace/name`, "(uses /dev/tenstorrent)" after those that declare the device).
        skipped: Vec<String>,
    },
    /// The drain failed, e.g. timed out with blockers.
    Failed {
        /// UpperCamelCase reason (e.g. `DrainTimeout`).
        reason: String,
        /// The blockers and what to do.
        message: String,
    },
}

/// This policy's upgrade grant on the node (annotation `driver.tenstorrent.com/upgrade-grant`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpgradeGrant {
    /// The node carries no grant of this policy.
    Absent,
    /// A grant of this policy for another version (the target changed since it was given).
    OtherVersion,
    /// A grant of this policy for the target version.
    Target,
}

/// Whether a Failed node may be retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryGate {
    /// Its back-off has not elapsed.
    NotYet,
    /// Its back-off has elapsed.
    Due,
    /// A user asked for a retry (`kubectl tt driver retry`, the retry annotation).
    Requested,
}

/// Whether this node may start a new step that takes a slot or moves the rollout forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartGate {
    /// Yes: a slot is free and the rollout is neither paused nor halted.
    Allowed,
    /// No: `maxUnavailable` nodes are in flight.
    NoSlot,
    /// No: the policy is paused.
    Paused,
    /// No: more nodes failed than `maxUnavailable` (Degraded).
    Halted,
    /// No: outside every maintenance window; the next opens then.
    OutsideWindow(Timestamp),
    /// No: the canary nodes go first.
    WaitingForCanary,
    /// No: the canary nodes soak until then.
    Soaking(Timestamp),
    /// No: a canary node halted the rollout (`status.rollout.haltedBy`).
    CanaryHalted,
}

/// Everything the controller knows about one matched node at one reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeObservation {
    /// The state recorded in `status.nodes[]` (`None`: never recorded).
    pub recorded: Option<NodeState>,
    /// The older policy that owns this node, if another policy also selects it.
    pub conflict_with: Option<String>,
    /// The node's agent reported (or labelled) `install-mode=host`.
    pub host_managed: bool,
    /// The node's `kmd-version` label (the loaded module's version), if any.
    pub loaded_version: Option<String>,
    /// The agent reports the module loaded with other parameters than `spec.module.parameters`
    /// (false when it has not reported): the module is not at target even at the target version.
    pub parameters_differ: bool,
    /// The agent pod.
    pub agent: AgentPod,
    /// The node carries our cordon annotation (we cordoned it).
    pub cordoned_by_us: bool,
    /// The node is unschedulable and someone else cordoned it.
    pub externally_cordoned: bool,
    /// The node carries our deploy-gates annotation (we closed its gates).
    pub gates_closed_by_us: bool,
    /// This policy's upgrade grant on the node.
    pub grant: UpgradeGrant,
    /// The node's drain.
    pub drain: DrainProgress,
    /// Whether a Failed node may be retried (ignored in other states, except that a request is
    /// cleared).
    pub retry: RetryGate,
    /// Whether the node may start a new step.
    pub start: StartGate,
    /// How long the node has been in its recorded state (its `lastTransitionTime` to the
    /// reconcile's `now`); `None` when unknown.
    pub in_state_for: Option<Duration>,
    /// Why the node is not Ready (its Ready condition, or the unreachable taint), e.g.
    /// `Ready=Unknown: NodeStatusUnknown: Kubelet stopped posting node status.`; `None` when
    /// Ready.
    pub node_not_ready: Option<String>,
    /// The node failed because its jobs outlasted `waitForCompletion` (`onTimeout: Fail`):
    /// they still run there, so it stays cordoned, and keeps its slot, until it is retried.
    pub held_for_jobs: bool,
    /// The node is recorded Failed for another target than today's: a new `spec.version` (or
    /// a rollback) puts it back in line instead of counting it against the new rollout's
    /// failure budget.
    pub failed_for_other_target: bool,
    /// Our cordon was lifted by a reconcile whose status write then failed: the node counts as
    /// cordoned by us (it keeps its slot) until its Uncordoning is recorded, but it is neither
    /// cordoned nor drained any more.
    pub lifted_unrecorded: bool,
    /// No builder image serves the compiler that built the node's kernel (and the policy needs
    /// one): what to do about it. Such a node never starts an upgrade.
    pub unsupported_compiler: Option<String>,
}

impl NodeObservation {
    /// The node carries something of this policy's: our cordon, the deploy gates we closed, or
    /// our upgrade grant.
    pub fn holds_ours(&self) -> bool {
        self.cordoned_by_us || self.gates_closed_by_us || self.grant != UpgradeGrant::Absent
    }

    /// A module is loaded: its version is known, or the agent waits for a grant to swap it
    /// (a module that declares no version, which the node opted to replace without a rollback
    /// path, shows no version at all).
    pub fn module_loaded(&self) -> bool {
        self.loaded_version.is_some()
            || self.agent == AgentPod::Current(AgentCondition::WaitingForGrant)
    }

    /// A first install: no module known to be loaded and nothing of ours on the node. It
    /// disrupts nothing, so it goes on beside the rollout without holding a slot.
    pub fn is_fresh_install(&self) -> bool {
        !self.module_loaded() && !self.holds_ours() && !self.host_managed
    }
}

/// What holds for every node of a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutRules {
    /// `spec.version`, parsed.
    pub target_version: KmdVersion,
    /// `spec.module.parameters` as the kernel takes them (space-separated; empty for none).
    pub target_parameters: String,
    /// `upgradePolicy.drain.enable`.
    pub drain_enabled: bool,
    /// Whether any deploy gate is configured (otherwise there is nothing to close).
    pub gates_configured: bool,
    /// `upgradePolicy.drain.timeoutSeconds`: also how long a drained node may wait in
    /// Upgrading for the processes holding the device before it fails.
    pub drain_timeout: Option<Duration>,
    /// `upgradePolicy.nodeTimeoutSeconds`: how long a node may stay in one step
    /// ([`RolloutRules::step_deadline`]); `None`: no deadline.
    pub node_timeout: Option<Duration>,
    /// `upgradePolicy.waitForCompletion.timeoutSeconds`: how long a Draining node may first
    /// wait for its jobs (`Duration::MAX`: as long as they run); None without the wait.
    pub completion_wait: Option<Duration>,
}

impl RolloutRules {
    /// How long a node may stay in `step` before it fails with `NodeTimeout`: the node timeout
    /// in Cordoning and Upgrading; in Draining the longer of it and the drain timeout (the
    /// drain's own timeout, which names the pods that blocked it, fires first), after the wait
    /// for jobs (`waitForCompletion`) when there is one. None elsewhere:
    /// Pending and Failed nodes hold no slot, and an Uncordoning node already runs the target
    /// (lifting the cordon is retried, and its errors show on the `Reconciled` condition).
    pub fn step_deadline(&self, step: NodeState) -> Option<Duration> {
        let node = self.node_timeout?;
        match step {
            NodeState::Cordoning | NodeState::Upgrading => Some(node),
            NodeState::Draining => {
                let wait = self.completion_wait.unwrap_or_default();
                let drain = self.drain_timeout.unwrap_or_default().saturating_add(wait);
                Some(drain.max(node))
            }
            _ => None,
        }
    }
}

/// Something to make true on the cluster for a node. Every action is idempotent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Cordon (claiming it unless someone else cordoned first) and close the deploy gates.
    Cordon,
    /// Make sure a drain of the node is running or has finished.
    Drain,
    /// Delete the node's agent pod if it runs an older template; with `even_current`, also if it
    /// runs the current template but is not ready (a fresh attempt).
    ReplaceAgent {
        /// Also replace a current-template pod that is not ready.
        even_current: bool,
    },
    /// Grant the node the upgrade to the target: the agent may now swap the loaded module
    /// (and, with forceUnload, kill its holders).
    Grant,
    /// Reopen the deploy gates we closed, lift the cordon we placed and remove our grant.
    Release,
    /// Remove the node's retry annotation.
    ClearRetry,
}

/// Where a node goes and what to do there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeTransition {
    /// The node's new state.
    pub state: NodeState,
    /// UpperCamelCase reason, `None` for the plain case.
    pub reason: Option<String>,
    /// What is happening and what to do, `None` for the plain case.
    pub message: Option<String>,
    /// What the reconciler makes true for this node, in order.
    pub actions: Vec<Action>,
}

/// Reasons the state machine gives.
pub mod reasons {
    /// Waiting for a free slot.
    pub const WAITING_FOR_SLOT: &str = ttdp_api::driver::v1alpha1::WAITING_FOR_SLOT;
    /// The policy is paused.
    pub const PAUSED: &str = "Paused";
    /// The rollout is halted: too many failures.
    pub const ROLLOUT_HALTED: &str = "RolloutHalted";
    /// No agent pod on the node yet.
    pub const WAITING_FOR_AGENT: &str = "WaitingForAgentPod";
    /// An older policy owns the node.
    pub const OWNED_BY_OLDER_POLICY: &str = "OwnedByOlderPolicy";
    /// DKMS on the host manages the module.
    pub const HOST_MANAGED: &str = "HostManaged";
    /// No builder image carries the compiler that built the node's kernel.
    pub const UNSUPPORTED_COMPILER: &str = "UnsupportedCompiler";
    /// The device is held by processes (agent report).
    pub const DEVICE_HELD: &str = "DeviceHeld";
    /// Someone else cordoned the node; it stays cordoned.
    pub const CORDONED_BY_OTHER: &str = "CordonedByOther";
    /// A Failed node is retried.
    pub const RETRYING: &str = "Retrying";
    /// The node is granted its upgrade; its agent has not read the grant yet.
    pub const WAITING_FOR_GRANT: &str = "WaitingForGrant";
    /// The drain left pods without a controller because `drain.force` is off.
    pub const BARE_PODS_SKIPPED: &str = "BarePodsSkipped";
    /// The drain, or the wait for the device's holders after it, outlasted
    /// `upgradePolicy.drain.timeoutSeconds`.
    pub const DRAIN_TIMEOUT: &str = "DrainTimeout";
    /// The node is not Ready (or unreachable): it does not start a step and takes no slot.
    pub const NODE_NOT_READY: &str = crate::pure::agent_blocker::NODE_NOT_READY;
    /// The node stayed in one step past `upgradePolicy.nodeTimeoutSeconds`.
    pub const NODE_TIMEOUT: &str = "NodeTimeout";
    /// Outside every maintenance window (`upgradePolicy.schedule`).
    pub const OUTSIDE_WINDOW: &str = "OutsideMaintenanceWindow";
    /// The canary nodes go first (`upgradePolicy.canary`).
    pub const WAITING_FOR_CANARY: &str = "WaitingForCanary";
    /// The canary nodes are Done and soak.
    pub const CANARY_SOAKING: &str = "CanarySoaking";
    /// The node's jobs outlasted `waitForCompletion.timeoutSeconds` with `onTimeout: Fail`.
    pub const WAIT_FOR_COMPLETION_TIMEOUT: &str = "WaitForCompletionTimeout";
}

impl AgentPod {
    /// Whether `ReplaceAgent { even_current }` deletes this pod: a stale one always; one on the
    /// current template that failed or waits on the device's holders only with `even_current`.
    pub fn replaced_by(&self, even_current: bool) -> bool {
        match self {
            AgentPod::Stale => true,
            AgentPod::Current(
                AgentCondition::Failed { .. } | AgentCondition::WaitingForHolders { .. },
            ) => even_current,
            _ => false,
        }
    }
}

impl NodeTransition {
    pub(super) fn to(state: NodeState) -> Self {
        Self {
            state,
            reason: None,
            message: None,
            actions: Vec::new(),
        }
    }

    pub(super) fn because(mut self, reason: &str, message: impl Into<String>) -> Self {
        self.reason = Some(reason.to_owned());
        self.message = Some(message.into());
        self
    }

    pub(super) fn doing(mut self, action: Action) -> Self {
        self.actions.push(action);
        self
    }
}

/// The node's next state and actions.
pub fn next(obs: &NodeObservation, rules: &RolloutRules) -> NodeTransition {
    let mut t = decide::decide(obs, rules);
    if obs.retry == RetryGate::Requested && t.state != NodeState::Failed {
        t.actions.push(Action::ClearRetry);
    }
    t
}
