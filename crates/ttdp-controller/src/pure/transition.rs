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
//! Pausing stops nodes from *entering* Cordoning, Draining or Upgrading; steps in flight finish
//! (a drain runs to its end, a swapping agent completes, Uncordoning proceeds), and a node then
//! waits at the next step boundary.
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

use std::time::Duration;

use crate::pure::agent_blocker::Blocker;
use ttdp_api::NodeState;

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
}

/// What holds for every node of a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutRules {
    /// `spec.version`.
    pub target_version: String,
    /// `upgradePolicy.drain.enable`.
    pub drain_enabled: bool,
    /// Whether any deploy gate is configured (otherwise there is nothing to close).
    pub gates_configured: bool,
    /// `upgradePolicy.drain.timeoutSeconds`: also how long a drained node may wait in
    /// Upgrading for the processes holding the device before it fails.
    pub drain_timeout: Option<Duration>,
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
}

/// The suffix the drain tracker puts after skipped pods that declare the device.
const USES_DEVICE: &str = " (uses /dev/tenstorrent)";

/// What the node's message (and so its Upgrading Event) says of the pods a drain skipped.
fn skipped_message(skipped: &[String]) -> String {
    format!(
        "drained; left {} pod(s) without a controller because upgradePolicy.drain.force is off: \
         {}; set force: true to evict them",
        skipped.len(),
        skipped.join(", ")
    )
}

impl NodeTransition {
    fn to(state: NodeState) -> Self {
        Self {
            state,
            reason: None,
            message: None,
            actions: Vec::new(),
        }
    }

    fn because(mut self, reason: &str, message: impl Into<String>) -> Self {
        self.reason = Some(reason.to_owned());
        self.message = Some(message.into());
        self
    }

    fn doing(mut self, action: Action) -> Self {
        self.actions.push(action);
        self
    }
}

/// The node's next state and actions.
pub fn next(obs: &NodeObservation, rules: &RolloutRules) -> NodeTransition {
    let mut t = decide(obs, rules);
    if obs.retry == RetryGate::Requested && t.state != NodeState::Failed {
        t.actions.push(Action::ClearRetry);
    }
    t
}

fn decide(obs: &NodeObservation, rules: &RolloutRules) -> NodeTransition {
    let holds_ours =
        obs.cordoned_by_us || obs.gates_closed_by_us || obs.grant != UpgradeGrant::Absent;
    let release = |t: NodeTransition| {
        if holds_ours {
            t.doing(Action::Release)
        } else {
            t
        }
    };
    if let Some(owner) = &obs.conflict_with {
        return release(NodeTransition::to(NodeState::Conflict).because(
            reasons::OWNED_BY_OLDER_POLICY,
            format!(
                "also selected by policy {owner}, which is older and manages this node; make the selectors disjoint"
            ),
        ));
    }
    if obs.host_managed {
        return release(NodeTransition::to(NodeState::HostManaged).because(
            reasons::HOST_MANAGED,
            "the host manages tt-kmd (DKMS); ttdp only observes. Remove the host's DKMS install to hand the node to ttdp",
        ));
    }
    let ctx = Ctx {
        obs,
        rules,
        holds_ours,
    };
    match obs.recorded.unwrap_or(NodeState::Pending) {
        NodeState::Cordoning => ctx.cordoning(),
        NodeState::Draining => ctx.draining(),
        NodeState::Upgrading => ctx.upgrading(false),
        NodeState::Uncordoning => ctx.uncordoning(),
        NodeState::Failed => ctx.failed(),
        NodeState::Pending | NodeState::Done | NodeState::HostManaged | NodeState::Conflict => {
            ctx.settled()
        }
    }
}

struct Ctx<'a> {
    obs: &'a NodeObservation,
    rules: &'a RolloutRules,
    holds_ours: bool,
}

impl Ctx<'_> {
    fn target(&self) -> &str {
        &self.rules.target_version
    }

    /// The agent on the current template is ready and the node reports the target loaded.
    fn up_to_date(&self) -> bool {
        self.obs.agent == AgentPod::Current(AgentCondition::Ready)
            && self.obs.loaded_version.as_deref() == Some(self.target())
    }

    /// A different version is loaded: the agent swaps it only with a grant.
    fn needs_grant(&self) -> bool {
        self.obs
            .loaded_version
            .as_deref()
            .is_some_and(|v| v != self.target())
    }

    /// A different version is loaded: swapping it disrupts workloads, so drain first.
    fn needs_drain(&self) -> bool {
        self.rules.drain_enabled && self.needs_grant()
    }

    /// The agent pod runs (or is to be replaced) and has neither finished (Ready) nor failed:
    /// given a grant, it would swap the loaded module.
    fn agent_would_swap(&self) -> bool {
        matches!(
            self.obs.agent,
            AgentPod::Stale
                | AgentPod::Current(
                    AgentCondition::Starting
                        | AgentCondition::Working
                        | AgentCondition::WaitingForGrant
                        | AgentCondition::WaitingForHolders { .. }
                )
        )
    }

    /// With drain enabled, the node went through Cordoning (it carries our cordon, or someone
    /// else's and the gates we closed), so being recorded in Upgrading means it was drained.
    fn cordoned_for_us(&self) -> bool {
        self.obs.cordoned_by_us || (self.obs.externally_cordoned && self.obs.gates_closed_by_us)
    }

    fn paused(&self) -> bool {
        self.obs.start == StartGate::Paused
    }

    /// Finished: release what we hold first, else Done.
    fn finish(&self) -> NodeTransition {
        if self.holds_ours {
            NodeTransition::to(NodeState::Uncordoning).doing(Action::Release)
        } else if self.obs.externally_cordoned {
            NodeTransition::to(NodeState::Done).because(
                reasons::CORDONED_BY_OTHER,
                "upgraded; left cordoned because someone else cordoned it before the upgrade (kubectl uncordon when done)",
            )
        } else {
            NodeTransition::to(NodeState::Done)
        }
    }

    /// A node that may start an upgrade: Cordoning when a loaded module must be swapped,
    /// straight to Upgrading otherwise; Pending while the gate is closed.
    fn start(&self) -> NodeTransition {
        match self.obs.start {
            StartGate::Allowed if self.needs_drain() => {
                NodeTransition::to(NodeState::Cordoning).doing(Action::Cordon)
            }
            StartGate::Allowed => self.enter_upgrading(),
            gate => self.pending(gate),
        }
    }

    fn pending(&self, gate: StartGate) -> NodeTransition {
        let t = NodeTransition::to(NodeState::Pending);
        match gate {
            StartGate::Paused => t.because(reasons::PAUSED, "the policy is paused; set spec.paused=false to continue"),
            StartGate::Halted => t.because(
                reasons::ROLLOUT_HALTED,
                "the rollout is halted: more nodes failed than maxUnavailable allows; fix them or run kubectl tt driver retry",
            ),
            // The most common state of a large rollout: kept to the reason alone (status size).
            StartGate::NoSlot | StartGate::Allowed => NodeTransition {
                reason: Some(reasons::WAITING_FOR_SLOT.to_owned()),
                ..t
            },
        }
    }

    /// Entering Upgrading through the gate: grant the swap when one is needed (before the
    /// agent is replaced, so the new pod finds it), then give the agent a fresh start.
    fn enter_upgrading(&self) -> NodeTransition {
        let t = NodeTransition::to(NodeState::Upgrading);
        let t = if self.needs_grant() {
            t.doing(Action::Grant)
        } else {
            t
        };
        t.doing(Action::ReplaceAgent { even_current: true })
    }

    /// In (or found in) Upgrading with a loaded module to swap and no grant for it: grant it
    /// when the node came through the gate (recorded in Upgrading after its drain; a crash lost
    /// the grant), drain again when it holds our cordon but the drain is not known to be done,
    /// else start it through the gate (Pending while no slot, Cordoning, or Upgrading granted).
    fn grant_or_gate(&self, observed: bool) -> NodeTransition {
        if self.rules.drain_enabled && self.cordoned_for_us() {
            return if observed {
                NodeTransition::to(NodeState::Draining).doing(Action::Drain)
            } else {
                let t = NodeTransition::to(NodeState::Upgrading).doing(Action::Grant);
                match self.obs.agent {
                    AgentPod::Stale => t.doing(Action::ReplaceAgent {
                        even_current: false,
                    }),
                    _ => t,
                }
            };
        }
        self.start()
    }

    fn settled(&self) -> NodeTransition {
        if self.holds_ours {
            // We cordoned it but the recorded state was lost: resume, never cordon twice.
            return if self.up_to_date() {
                self.finish()
            } else if matches!(self.obs.agent, AgentPod::Current(_)) || !self.rules.drain_enabled {
                self.upgrading(true)
            } else {
                NodeTransition::to(NodeState::Draining).doing(Action::Drain)
            };
        }
        if self.up_to_date() {
            return self.finish();
        }
        match &self.obs.agent {
            AgentPod::Current(AgentCondition::Failed { reason, message }) => {
                NodeTransition::to(NodeState::Failed).because(reason, message.clone())
            }
            // The DaemonSet already runs the current template here (a fresh install, a recreated
            // pod, a node that joined): with a different version loaded, `upgrading` sends the
            // node through the gate, as a stale pod would be.
            // Until its first report the node may not have labelled the module it has loaded:
            // a node with nothing known loaded waits rather than taking it for a fresh install.
            AgentPod::Current(AgentCondition::Starting) if self.obs.loaded_version.is_none() => {
                NodeTransition::to(NodeState::Pending).because(
                    reasons::WAITING_FOR_AGENT,
                    "waiting for the agent's first report",
                )
            }
            AgentPod::Current(_) => self.upgrading(true),
            AgentPod::Stale => self.start(),
            AgentPod::Missing | AgentPod::Terminating | AgentPod::NotCreated(_) => {
                if self.obs.recorded == Some(NodeState::Done)
                    && self.obs.loaded_version.as_deref() == Some(self.target())
                {
                    NodeTransition::to(NodeState::Done)
                } else if let AgentPod::NotCreated(b) = &self.obs.agent {
                    NodeTransition::to(NodeState::Pending).because(&b.reason, b.message.clone())
                } else {
                    NodeTransition::to(NodeState::Pending).because(
                        reasons::WAITING_FOR_AGENT,
                        "waiting for the DaemonSet to run an agent pod on this node",
                    )
                }
            }
        }
    }

    fn cordoning(&self) -> NodeTransition {
        if self.up_to_date() {
            return self.finish();
        }
        if !self.rules.drain_enabled {
            return self.upgrading(false);
        }
        let cordoned = self.obs.cordoned_by_us || self.obs.externally_cordoned;
        let gates_closed = self.obs.gates_closed_by_us || !self.rules.gates_configured;
        if !(cordoned && gates_closed) {
            return NodeTransition::to(NodeState::Cordoning).doing(Action::Cordon);
        }
        if self.paused() {
            return NodeTransition::to(NodeState::Cordoning).because(
                reasons::PAUSED,
                "cordoned; the policy is paused before the drain",
            );
        }
        NodeTransition::to(NodeState::Draining).doing(Action::Drain)
    }

    fn draining(&self) -> NodeTransition {
        if self.up_to_date() {
            return self.finish();
        }
        match &self.obs.drain {
            DrainProgress::Succeeded { .. } if self.paused() => {
                NodeTransition::to(NodeState::Draining).because(
                    reasons::PAUSED,
                    "drained; the policy is paused before the module swap",
                )
            }
            DrainProgress::Succeeded { skipped } if !skipped.is_empty() => self
                .enter_upgrading()
                .because(reasons::BARE_PODS_SKIPPED, skipped_message(skipped)),
            DrainProgress::Succeeded { .. } => self.enter_upgrading(),
            DrainProgress::Failed { reason, message } => NodeTransition::to(NodeState::Failed)
                .because(reason, message.clone())
                .doing(Action::Release),
            DrainProgress::Running { message } => NodeTransition::to(NodeState::Draining)
                .because("Draining", message.clone())
                .doing(Action::Drain),
            DrainProgress::NotStarted => {
                NodeTransition::to(NodeState::Draining).doing(Action::Drain)
            }
        }
    }

    /// In Upgrading (or found there): wait for the agent on the current template.
    /// `observed`: the node is in Upgrading because the DaemonSet put a current pod there, not
    /// because we entered the step (nothing to replace then).
    fn upgrading(&self, observed: bool) -> NodeTransition {
        if self.up_to_date() {
            return self.finish();
        }
        if self.agent_would_swap() && self.needs_grant() && self.obs.grant != UpgradeGrant::Target {
            return self.grant_or_gate(observed);
        }
        let t = NodeTransition::to(NodeState::Upgrading);
        match &self.obs.agent {
            AgentPod::Stale if observed && self.paused() => self.pending(StartGate::Paused),
            AgentPod::Stale => t.doing(Action::ReplaceAgent {
                even_current: false,
            }),
            AgentPod::Missing | AgentPod::Terminating => t.because(
                reasons::WAITING_FOR_AGENT,
                format!(
                    "waiting for the DaemonSet to start the agent for {}",
                    self.target()
                ),
            ),
            AgentPod::NotCreated(b) | AgentPod::Current(AgentCondition::Stuck(b)) => {
                t.because(&b.reason, b.message.clone())
            }
            AgentPod::Current(AgentCondition::Ready) => t.because(
                "WaitingForVersionLabel",
                format!(
                    "agent ready; waiting for the node to report {} loaded",
                    self.target()
                ),
            ),
            AgentPod::Current(AgentCondition::Starting | AgentCondition::Working) => t.because(
                "Installing",
                format!("agent installing tt-kmd {}", self.target()),
            ),
            AgentPod::Current(AgentCondition::WaitingForGrant) => t.because(
                reasons::WAITING_FOR_GRANT,
                format!(
                    "upgrade to {} granted; waiting for the agent to read the grant",
                    self.target()
                ),
            ),
            AgentPod::Current(AgentCondition::WaitingForHolders { message }) => self.held(message),
            AgentPod::Current(AgentCondition::Failed { reason, message }) => {
                let failed = NodeTransition::to(NodeState::Failed).because(reason, message.clone());
                if self.holds_ours {
                    failed.doing(Action::Release)
                } else {
                    failed
                }
            }
        }
    }

    /// The bare pods the node's drain skipped that declare the device (`namespace/name`);
    /// empty when the drain is not known (e.g. after a controller restart).
    fn skipped_device_pods(&self) -> Vec<&str> {
        match &self.obs.drain {
            DrainProgress::Succeeded { skipped } => skipped
                .iter()
                .filter_map(|p| p.strip_suffix(USES_DEVICE))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Recorded in Upgrading after a drain for longer than the drain timeout.
    fn past_holders_deadline(&self) -> bool {
        let limit = self
            .rules
            .drain_timeout
            .filter(|_| self.rules.drain_enabled);
        self.obs.recorded == Some(NodeState::Upgrading)
            && limit
                .zip(self.obs.in_state_for)
                .is_some_and(|(limit, waited)| waited >= limit)
    }

    /// The agent waits for the device's holders (`holders`, e.g. "held by pid 1234 (python3)"):
    /// name them and the device pods the drain skipped; Failed once the drain timeout passed.
    fn held(&self, holders: &str) -> NodeTransition {
        let pods = self.skipped_device_pods();
        let pods = if pods.is_empty() {
            String::new()
        } else {
            format!(
                "; bare pod(s) the drain skipped that use the device: {}",
                pods.join(", ")
            )
        };
        if !self.past_holders_deadline() {
            return NodeTransition::to(NodeState::Upgrading).because(
                reasons::DEVICE_HELD,
                format!(
                    "{holders}{pods}; stop those processes, drain them (upgradePolicy.drain.fullNode), or set upgradePolicy.forceUnload"
                ),
            );
        }
        let failed = NodeTransition::to(NodeState::Failed).because(
            reasons::DRAIN_TIMEOUT,
            format!(
                "the device is still in use after upgradePolicy.drain.timeoutSeconds in Upgrading; blockers: {holders}{pods}; stop them or set upgradePolicy.drain.force: true (or upgradePolicy.forceUnload: true), then retry"
            ),
        );
        if self.holds_ours {
            failed.doing(Action::Release)
        } else {
            failed
        }
    }

    fn uncordoning(&self) -> NodeTransition {
        if self.holds_ours {
            return NodeTransition::to(NodeState::Uncordoning).doing(Action::Release);
        }
        self.finish()
    }

    fn failed(&self) -> NodeTransition {
        if self.up_to_date() {
            return self.finish();
        }
        let may_retry = match self.obs.retry {
            RetryGate::Requested => true,
            RetryGate::Due => true,
            RetryGate::NotYet => false,
        };
        if may_retry && self.obs.start == StartGate::Allowed {
            let mut t = self.start();
            t.reason = Some(reasons::RETRYING.to_owned());
            t.message = Some(format!("retrying the install of {}", self.target()));
            return t;
        }
        let mut t = NodeTransition::to(NodeState::Failed);
        if let AgentPod::Current(AgentCondition::Failed { reason, message }) = &self.obs.agent {
            t = t.because(reason, message.clone());
        }
        if self.holds_ours {
            t.doing(Action::Release)
        } else {
            t
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeState::*;

    fn rules() -> RolloutRules {
        RolloutRules {
            target_version: "2.8.0".into(),
            drain_enabled: true,
            gates_configured: true,
            drain_timeout: None,
        }
    }

    fn base() -> NodeObservation {
        NodeObservation {
            recorded: None,
            conflict_with: None,
            host_managed: false,
            loaded_version: None,
            agent: AgentPod::Missing,
            cordoned_by_us: false,
            externally_cordoned: false,
            gates_closed_by_us: false,
            grant: UpgradeGrant::Absent,
            drain: DrainProgress::NotStarted,
            retry: RetryGate::NotYet,
            start: StartGate::Allowed,
            in_state_for: None,
        }
    }

    fn with(f: impl FnOnce(&mut NodeObservation)) -> NodeObservation {
        let mut o = base();
        f(&mut o);
        o
    }

    fn old(o: &mut NodeObservation) {
        o.loaded_version = Some("2.7.0".into());
    }

    fn ours(o: &mut NodeObservation) {
        o.cordoned_by_us = true;
        o.gates_closed_by_us = true;
    }

    #[test]
    fn a_drain_that_skipped_bare_pods_names_them_and_goes_on() {
        let t = next(
            &with(|o| {
                o.recorded = Some(Draining);
                ours(o);
                o.agent = AgentPod::Stale;
                old(o);
                o.drain = DrainProgress::Succeeded {
                    skipped: vec![
                        "jobs/notebook (uses /dev/tenstorrent)".into(),
                        "default/debug".into(),
                    ],
                }
            }),
            &rules(),
        );
        assert_eq!(
            (t.state, t.reason.as_deref()),
            (Upgrading, Some(reasons::BARE_PODS_SKIPPED))
        );
        let message = t.message.unwrap_or_default();
        assert!(
            message.contains("left 2 pod(s)")
                && message.contains("jobs/notebook (uses /dev/tenstorrent), default/debug")
                && message.contains("drain.force is off"),
            "{message}"
        );
        assert_eq!(
            t.actions,
            vec![Action::Grant, Action::ReplaceAgent { even_current: true }],
            "the swap goes on: skipped pods do not hold the node back"
        );
    }

    fn ready_on_target(o: &mut NodeObservation) {
        o.agent = AgentPod::Current(AgentCondition::Ready);
        o.loaded_version = Some("2.8.0".into());
    }

    /// Columns in the order of `NodeState::ALL`:
    /// Pending, Cordoning, Draining, Upgrading, Uncordoning, Done, Failed, HostManaged, Conflict.
    fn table() -> Vec<(&'static str, NodeObservation, [NodeState; 9])> {
        vec![
            (
                "no agent pod, no module",
                base(),
                [
                    Pending, Cordoning, Draining, Upgrading, Done, Pending, Failed, Pending,
                    Pending,
                ],
            ),
            (
                // Found in Upgrading without our cordon or grant: it never went through the
                // drain, so it goes through the gate again.
                "stale agent, old module loaded",
                with(|o| {
                    o.agent = AgentPod::Stale;
                    old(o)
                }),
                [
                    Cordoning, Cordoning, Draining, Cordoning, Done, Cordoning, Failed, Cordoning,
                    Cordoning,
                ],
            ),
            (
                "stale agent, no module loaded",
                with(|o| o.agent = AgentPod::Stale),
                [
                    Upgrading, Cordoning, Draining, Upgrading, Done, Upgrading, Failed, Upgrading,
                    Upgrading,
                ],
            ),
            (
                "stale agent, target already loaded (template-only change)",
                with(|o| {
                    o.agent = AgentPod::Stale;
                    o.loaded_version = Some("2.8.0".into())
                }),
                [
                    Upgrading, Cordoning, Draining, Upgrading, Done, Upgrading, Failed, Upgrading,
                    Upgrading,
                ],
            ),
            (
                // A recreated pod, or a node that joined with a module loaded: it takes the
                // gate like a stale pod, never straight to Upgrading.
                "current agent working, old module",
                with(|o| {
                    o.agent = AgentPod::Current(AgentCondition::Working);
                    old(o)
                }),
                [
                    Cordoning, Cordoning, Draining, Cordoning, Done, Cordoning, Failed, Cordoning,
                    Cordoning,
                ],
            ),
            (
                "current agent waiting for the grant, old module",
                with(|o| {
                    o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
                    old(o)
                }),
                [
                    Cordoning, Cordoning, Draining, Cordoning, Done, Cordoning, Failed, Cordoning,
                    Cordoning,
                ],
            ),
            (
                "current agent working, no module (fresh install)",
                with(|o| o.agent = AgentPod::Current(AgentCondition::Working)),
                [
                    Upgrading, Cordoning, Draining, Upgrading, Done, Upgrading, Failed, Upgrading,
                    Upgrading,
                ],
            ),
            (
                "cordoned by us, current agent waiting for the grant, old module",
                with(|o| {
                    ours(o);
                    o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
                    old(o)
                }),
                [
                    Draining,
                    Draining,
                    Draining,
                    Upgrading,
                    Uncordoning,
                    Draining,
                    Failed,
                    Draining,
                    Draining,
                ],
            ),
            (
                "cordoned by us and granted, current agent working, old module",
                with(|o| {
                    ours(o);
                    o.grant = UpgradeGrant::Target;
                    o.agent = AgentPod::Current(AgentCondition::Working);
                    old(o)
                }),
                [
                    Upgrading,
                    Draining,
                    Draining,
                    Upgrading,
                    Uncordoning,
                    Upgrading,
                    Failed,
                    Upgrading,
                    Upgrading,
                ],
            ),
            (
                "up to date",
                with(ready_on_target),
                [Done, Done, Done, Done, Done, Done, Done, Done, Done],
            ),
            (
                "current agent ready, label not yet flipped",
                with(|o| {
                    o.agent = AgentPod::Current(AgentCondition::Ready);
                    old(o)
                }),
                [
                    Upgrading, Cordoning, Draining, Upgrading, Done, Upgrading, Failed, Upgrading,
                    Upgrading,
                ],
            ),
            (
                "current agent waiting for holders of the old module",
                with(|o| {
                    o.agent = AgentPod::Current(AgentCondition::WaitingForHolders {
                        message: "held by pid 7 (python3)".into(),
                    });
                    old(o)
                }),
                [
                    Cordoning, Cordoning, Draining, Cordoning, Done, Cordoning, Failed, Cordoning,
                    Cordoning,
                ],
            ),
            (
                "current agent failed",
                with(|o| {
                    o.agent = AgentPod::Current(AgentCondition::Failed {
                        reason: "BuildFailed".into(),
                        message: "make failed".into(),
                    });
                    old(o)
                }),
                [
                    Failed, Cordoning, Draining, Failed, Done, Failed, Failed, Failed, Failed,
                ],
            ),
            (
                "agent pod terminating",
                with(|o| {
                    o.agent = AgentPod::Terminating;
                    old(o)
                }),
                [
                    Pending, Cordoning, Draining, Upgrading, Done, Pending, Failed, Pending,
                    Pending,
                ],
            ),
            (
                "cordoned by us, stale agent, old module",
                with(|o| {
                    ours(o);
                    o.agent = AgentPod::Stale;
                    old(o)
                }),
                [
                    Draining,
                    Draining,
                    Draining,
                    Upgrading,
                    Uncordoning,
                    Draining,
                    Failed,
                    Draining,
                    Draining,
                ],
            ),
            (
                "cordoned by us, up to date",
                with(|o| {
                    ours(o);
                    ready_on_target(o)
                }),
                [Uncordoning; 9],
            ),
            (
                "cordoned by us, drain finished",
                with(|o| {
                    ours(o);
                    o.agent = AgentPod::Stale;
                    old(o);
                    o.drain = DrainProgress::Succeeded { skipped: vec![] }
                }),
                [
                    Draining,
                    Draining,
                    Upgrading,
                    Upgrading,
                    Uncordoning,
                    Draining,
                    Failed,
                    Draining,
                    Draining,
                ],
            ),
            (
                "cordoned by us, drain failed",
                with(|o| {
                    ours(o);
                    o.agent = AgentPod::Stale;
                    old(o);
                    o.drain = DrainProgress::Failed {
                        reason: "DrainTimeout".into(),
                        message: "web-0 blocked".into(),
                    }
                }),
                [
                    Draining,
                    Draining,
                    Failed,
                    Upgrading,
                    Uncordoning,
                    Draining,
                    Failed,
                    Draining,
                    Draining,
                ],
            ),
            (
                "host-managed",
                with(|o| {
                    o.host_managed = true;
                    old(o)
                }),
                [HostManaged; 9],
            ),
            (
                "selected by an older policy",
                with(|o| {
                    o.conflict_with = Some("prod".into());
                    o.agent = AgentPod::Stale
                }),
                [Conflict; 9],
            ),
            (
                "cordoned by someone else, up to date",
                with(|o| {
                    o.externally_cordoned = true;
                    ready_on_target(o)
                }),
                [Done; 9],
            ),
            (
                "retry requested, stale agent, old module",
                with(|o| {
                    o.retry = RetryGate::Requested;
                    o.agent = AgentPod::Stale;
                    old(o)
                }),
                [
                    Cordoning, Cordoning, Draining, Cordoning, Done, Cordoning, Cordoning,
                    Cordoning, Cordoning,
                ],
            ),
            (
                "retry due, stale agent, no module",
                with(|o| {
                    o.retry = RetryGate::Due;
                    o.agent = AgentPod::Stale
                }),
                [
                    Upgrading, Cordoning, Draining, Upgrading, Done, Upgrading, Upgrading,
                    Upgrading, Upgrading,
                ],
            ),
        ]
    }

    #[test]
    fn every_state_times_every_observation() {
        let mut checked = 0;
        for (name, obs, expected) in table() {
            for (from, want) in NodeState::ALL.iter().zip(expected) {
                let o = NodeObservation {
                    recorded: Some(*from),
                    ..obs.clone()
                };
                let got = next(&o, &rules());
                assert_eq!(got.state, want, "{from} + {name}: {got:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, 23 * 9);
    }

    /// What Kubernetes says about an agent it does not run becomes the node's reason and
    /// message, and the node waits (Kubernetes keeps retrying) instead of failing.
    #[test]
    fn agents_kubernetes_does_not_run_wait_with_kubernetes_words() {
        let blocker = |reason: &str| Blocker {
            reason: reason.into(),
            message: format!("{reason}: what Kubernetes says"),
        };
        let not_created = with(|o| o.agent = AgentPod::NotCreated(blocker("FailedCreate")));
        for recorded in [None, Some(Pending)] {
            let mut obs = not_created.clone();
            obs.recorded = recorded;
            let t = next(&obs, &rules());
            assert_eq!(t.state, Pending, "{recorded:?}");
            assert_eq!(t.reason.as_deref(), Some("FailedCreate"));
            assert_eq!(
                t.message.as_deref(),
                Some("FailedCreate: what Kubernetes says")
            );
        }
        let mut upgrading = not_created.clone();
        upgrading.recorded = Some(Upgrading);
        let t = next(&upgrading, &rules());
        assert_eq!(
            (t.state, t.reason.as_deref()),
            (Upgrading, Some("FailedCreate"))
        );
        for reason in [
            "Unschedulable",
            "NodeNotReady",
            "CreateContainerConfigError",
        ] {
            let stuck = with(|o| {
                o.agent = AgentPod::Current(AgentCondition::Stuck(blocker(reason)));
                old(o)
            });
            for recorded in [None, Some(Upgrading)] {
                let mut obs = stuck.clone();
                obs.recorded = recorded;
                let t = next(&obs, &rules());
                assert_eq!(t.state, Upgrading, "{reason} {recorded:?}");
                assert_eq!(t.reason.as_deref(), Some(reason));
                assert!(
                    t.message
                        .as_deref()
                        .is_some_and(|m| m.contains("what Kubernetes says"))
                );
                assert!(t.actions.is_empty(), "nothing to replace: {t:?}");
            }
        }
    }

    #[test]
    fn a_never_seen_node_is_treated_as_pending() {
        for (name, obs, expected) in table() {
            assert_eq!(next(&obs, &rules()).state, expected[0], "{name}");
        }
    }

    #[test]
    fn closed_gates_keep_new_nodes_waiting_with_a_reason() {
        let stale_old = with(|o| {
            o.agent = AgentPod::Stale;
            old(o)
        });
        for (gate, reason) in [
            (StartGate::NoSlot, reasons::WAITING_FOR_SLOT),
            (StartGate::Paused, reasons::PAUSED),
            (StartGate::Halted, reasons::ROLLOUT_HALTED),
        ] {
            let o = NodeObservation {
                start: gate,
                recorded: Some(Pending),
                ..stale_old.clone()
            };
            let t = next(&o, &rules());
            assert_eq!(t.state, Pending);
            assert_eq!(t.reason.as_deref(), Some(reason));
            assert!(t.actions.is_empty());
            let failed = NodeObservation {
                start: gate,
                recorded: Some(Failed),
                retry: RetryGate::Due,
                ..stale_old.clone()
            };
            assert_eq!(
                next(&failed, &rules()).state,
                Failed,
                "{gate:?}: a retry needs a slot too"
            );
        }
    }

    #[test]
    fn pause_stops_at_step_boundaries_but_lets_steps_in_flight_finish() {
        let paused = |f: &dyn Fn(&mut NodeObservation)| {
            let mut o = base();
            o.start = StartGate::Paused;
            f(&mut o);
            next(&o, &rules())
        };
        let t = paused(&|o| {
            o.recorded = Some(Cordoning);
            ours(o);
            o.agent = AgentPod::Stale;
            old(o)
        });
        assert_eq!(
            (t.state, t.reason.as_deref()),
            (Cordoning, Some(reasons::PAUSED))
        );
        let t = paused(&|o| {
            o.recorded = Some(Cordoning);
            o.agent = AgentPod::Stale;
            old(o)
        });
        assert_eq!(
            t.actions,
            vec![Action::Cordon],
            "a cordon in flight completes"
        );
        let t = paused(&|o| {
            o.recorded = Some(Draining);
            ours(o);
            o.agent = AgentPod::Stale;
            old(o)
        });
        assert_eq!(
            t.actions,
            vec![Action::Drain],
            "a drain in flight runs to its end"
        );
        let t = paused(&|o| {
            o.recorded = Some(Draining);
            ours(o);
            o.agent = AgentPod::Stale;
            old(o);
            o.drain = DrainProgress::Succeeded { skipped: vec![] }
        });
        assert_eq!(
            (t.state, t.reason.as_deref()),
            (Draining, Some(reasons::PAUSED))
        );
        let t = paused(&|o| {
            o.recorded = Some(Upgrading);
            ours(o);
            ready_on_target(o)
        });
        assert_eq!(t.state, Uncordoning);
        let t = paused(&|o| o.recorded = Some(Uncordoning));
        assert_eq!(t.state, Done);
    }

    #[test]
    fn actions_follow_the_step() {
        let t = next(
            &with(|o| {
                o.agent = AgentPod::Stale;
                old(o)
            }),
            &rules(),
        );
        assert_eq!(t.actions, vec![Action::Cordon]);
        let t = next(
            &with(|o| {
                o.recorded = Some(Cordoning);
                ours(o);
                o.agent = AgentPod::Stale;
                old(o)
            }),
            &rules(),
        );
        assert_eq!(t.actions, vec![Action::Drain]);
        let t = next(
            &with(|o| {
                o.recorded = Some(Draining);
                ours(o);
                o.agent = AgentPod::Stale;
                old(o);
                o.drain = DrainProgress::Succeeded { skipped: vec![] }
            }),
            &rules(),
        );
        assert_eq!(
            t.actions,
            vec![Action::Grant, Action::ReplaceAgent { even_current: true }],
            "entering Upgrading grants the swap, then gives the agent a fresh start"
        );
        let t = next(
            &with(|o| {
                o.recorded = Some(Upgrading);
                ours(o);
                o.grant = UpgradeGrant::Target;
                o.agent = AgentPod::Stale;
                old(o)
            }),
            &rules(),
        );
        assert_eq!(
            t.actions,
            vec![Action::ReplaceAgent {
                even_current: false
            }]
        );
        let t = next(
            &with(|o| {
                o.recorded = Some(Upgrading);
                ours(o);
                o.agent = AgentPod::Stale;
                old(o)
            }),
            &rules(),
        );
        assert_eq!(
            (t.state, t.actions),
            (
                Upgrading,
                vec![
                    Action::Grant,
                    Action::ReplaceAgent {
                        even_current: false
                    }
                ]
            ),
            "drained, but a crash lost the grant: grant it again"
        );
        let t = next(
            &with(|o| {
                o.recorded = Some(Upgrading);
                ours(o);
                ready_on_target(o)
            }),
            &rules(),
        );
        assert_eq!((t.state, t.actions), (Uncordoning, vec![Action::Release]));
        let t = next(
            &with(|o| {
                o.recorded = Some(Upgrading);
                ready_on_target(o)
            }),
            &rules(),
        );
        assert_eq!(t.state, Done, "nothing to release: straight to Done");
        let t = next(
            &with(|o| {
                o.recorded = Some(Failed);
                ours(o);
                o.agent = AgentPod::Stale;
                old(o)
            }),
            &rules(),
        );
        assert_eq!(
            t.actions,
            vec![Action::Release],
            "a Failed node does not keep its cordon or slot"
        );
        let t = next(
            &with(|o| {
                o.recorded = Some(Conflict);
                ours(o);
                o.conflict_with = Some("prod".into())
            }),
            &rules(),
        );
        assert_eq!(t.actions, vec![Action::Release]);
    }

    #[test]
    fn grants_are_given_only_through_the_gate_and_released_at_the_end() {
        let recreated = with(|o| {
            o.recorded = Some(Pending);
            o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
            old(o)
        });
        for gate in [StartGate::NoSlot, StartGate::Paused, StartGate::Halted] {
            let t = next(
                &NodeObservation {
                    start: gate,
                    ..recreated.clone()
                },
                &rules(),
            );
            assert_eq!((t.state, t.actions), (Pending, vec![]), "{gate:?}");
        }
        let t = next(&recreated, &rules());
        assert_eq!((t.state, t.actions), (Cordoning, vec![Action::Cordon]));
        let starting = with(|o| o.agent = AgentPod::Current(AgentCondition::Starting));
        assert_eq!(
            next(&starting, &rules()).state,
            Pending,
            "nothing known loaded before the agent's first report: no fresh install assumed"
        );
        let fresh = with(|o| o.agent = AgentPod::Current(AgentCondition::Working));
        let t = next(
            &NodeObservation {
                start: StartGate::NoSlot,
                ..fresh
            },
            &rules(),
        );
        assert_eq!(
            (t.state, t.actions),
            (Upgrading, vec![]),
            "a fresh install needs neither slot nor grant"
        );
        let granted = with(|o| {
            o.recorded = Some(Upgrading);
            ours(o);
            o.grant = UpgradeGrant::Target;
            o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
            old(o)
        });
        let t = next(&granted, &rules());
        assert_eq!(
            (t.state, t.reason.as_deref(), t.actions),
            (Upgrading, Some(reasons::WAITING_FOR_GRANT), vec![])
        );
        let done_but_granted = with(|o| {
            o.recorded = Some(Upgrading);
            o.grant = UpgradeGrant::Target;
            ready_on_target(o)
        });
        let t = next(&done_but_granted, &rules());
        assert_eq!(
            (t.state, t.actions),
            (Uncordoning, vec![Action::Release]),
            "the grant goes with the release"
        );
        let stale_grant = with(|o| {
            o.recorded = Some(Upgrading);
            ours(o);
            o.grant = UpgradeGrant::OtherVersion;
            o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
            old(o)
        });
        assert_eq!(
            next(&stale_grant, &rules()).actions,
            vec![Action::Grant],
            "the target changed: grant the new one"
        );
    }

    #[test]
    fn retry_requests_are_cleared_once_acted_on() {
        let requested = with(|o| {
            o.recorded = Some(Failed);
            o.retry = RetryGate::Requested;
            o.agent = AgentPod::Stale;
            old(o)
        });
        let t = next(&requested, &rules());
        assert_eq!(t.state, Cordoning);
        assert_eq!(t.reason.as_deref(), Some(reasons::RETRYING));
        assert!(t.actions.contains(&Action::ClearRetry));
        let waiting = NodeObservation {
            start: StartGate::NoSlot,
            ..requested.clone()
        };
        let t = next(&waiting, &rules());
        assert_eq!(t.state, Failed);
        assert!(
            !t.actions.contains(&Action::ClearRetry),
            "kept until it can act"
        );
        let stray = with(|o| {
            o.recorded = Some(Done);
            o.retry = RetryGate::Requested;
            ready_on_target(o)
        });
        assert_eq!(next(&stray, &rules()).actions, vec![Action::ClearRetry]);
    }

    #[test]
    fn messages_say_what_is_happening() {
        let t = next(
            &with(|o| {
                o.recorded = Some(Upgrading);
                ours(o);
                old(o);
                o.grant = UpgradeGrant::Target;
                o.agent = AgentPod::Current(AgentCondition::WaitingForHolders {
                    message: "held by pid 1234 (python3)".into(),
                });
            }),
            &rules(),
        );
        assert_eq!(t.reason.as_deref(), Some(reasons::DEVICE_HELD));
        assert!(
            t.message
                .as_deref()
                .unwrap()
                .starts_with("held by pid 1234 (python3)")
        );
        let t = next(
            &with(|o| {
                o.recorded = Some(Draining);
                ours(o);
                old(o);
                o.agent = AgentPod::Stale;
                o.drain = DrainProgress::Failed {
                    reason: "DrainTimeout".into(),
                    message: "default/web-0: eviction blocked by PodDisruptionBudget default/web"
                        .into(),
                };
            }),
            &rules(),
        );
        assert_eq!(
            (t.state, t.reason.as_deref()),
            (Failed, Some("DrainTimeout"))
        );
        assert!(t.message.as_deref().unwrap().contains("default/web-0"));
        assert_eq!(t.actions, vec![Action::Release]);
        let t = next(&with(|o| o.conflict_with = Some("prod".into())), &rules());
        assert!(t.message.as_deref().unwrap().contains("prod"));
        let t = next(
            &with(|o| {
                o.recorded = Some(Uncordoning);
                o.externally_cordoned = true;
                ready_on_target(o)
            }),
            &rules(),
        );
        assert_eq!(
            (t.state, t.reason.as_deref()),
            (Done, Some(reasons::CORDONED_BY_OTHER))
        );
    }

    #[test]
    fn without_drain_a_version_change_goes_straight_to_upgrading() {
        let mut r = rules();
        r.drain_enabled = false;
        let t = next(
            &with(|o| {
                o.agent = AgentPod::Stale;
                old(o)
            }),
            &r,
        );
        assert_eq!(t.state, Upgrading);
        assert_eq!(
            t.actions,
            vec![Action::Grant, Action::ReplaceAgent { even_current: true }]
        );
        let t = next(
            &with(|o| {
                o.recorded = Some(Upgrading);
                ready_on_target(o)
            }),
            &r,
        );
        assert_eq!(t.state, Done);
    }

    #[test]
    fn an_externally_cordoned_node_is_drained_without_claiming_it() {
        let o = with(|o| {
            o.recorded = Some(Cordoning);
            o.externally_cordoned = true;
            o.gates_closed_by_us = true;
            o.agent = AgentPod::Stale;
            old(o);
        });
        assert_eq!(next(&o, &rules()).state, Draining);
        let no_gates = RolloutRules {
            gates_configured: false,
            ..rules()
        };
        let o = with(|o| {
            o.recorded = Some(Cordoning);
            o.externally_cordoned = true;
            o.agent = AgentPod::Stale;
            old(o)
        });
        assert_eq!(
            next(&o, &no_gates).state,
            Draining,
            "no gates configured: nothing to close"
        );
        assert_eq!(next(&o, &rules()).state, Cordoning, "gates still to close");
    }

    /// A drained node in Upgrading whose agent waits for a skipped bare pod holding the
    /// device, `waited` after it entered Upgrading.
    fn held_by_bare_pod(waited: u64) -> NodeObservation {
        with(|o| {
            o.recorded = Some(Upgrading);
            ours(o);
            o.grant = UpgradeGrant::Target;
            old(o);
            o.agent = AgentPod::Current(AgentCondition::WaitingForHolders {
                message: "held by pid 1234 (python3)".into(),
            });
            o.drain = DrainProgress::Succeeded {
                skipped: vec![
                    "jobs/notebook (uses /dev/tenstorrent)".into(),
                    "default/debug".into(),
                ],
            };
            o.in_state_for = Some(Duration::from_secs(waited));
        })
    }

    fn timed(secs: u64) -> RolloutRules {
        RolloutRules {
            drain_timeout: Some(Duration::from_secs(secs)),
            ..rules()
        }
    }

    #[test]
    fn holders_are_waited_for_until_the_drain_timeout_naming_skipped_device_pods() {
        let t = next(&held_by_bare_pod(599), &timed(600));
        assert_eq!(
            (t.state, t.reason.as_deref()),
            (Upgrading, Some(reasons::DEVICE_HELD))
        );
        let message = t.message.unwrap_or_default();
        assert!(
            message.contains("held by pid 1234 (python3)")
                && message.contains("drain skipped that use the device: jobs/notebook;")
                && !message.contains("default/debug"),
            "{message}"
        );
        assert!(t.actions.is_empty());
    }

    #[test]
    fn holders_past_the_drain_timeout_fail_the_node_naming_the_blockers() {
        let t = next(&held_by_bare_pod(600), &timed(600));
        assert_eq!(
            (t.state, t.reason.as_deref()),
            (Failed, Some(reasons::DRAIN_TIMEOUT))
        );
        assert_eq!(t.actions, vec![Action::Release]);
        let message = t.message.unwrap_or_default();
        assert!(
            message.contains("held by pid 1234 (python3)")
                && message.contains("jobs/notebook")
                && message.contains("stop them or set upgradePolicy.drain.force: true"),
            "{message}"
        );
        // After a controller restart the drain's skipped pods are unknown: the pids alone.
        let restarted = NodeObservation {
            drain: DrainProgress::NotStarted,
            ..held_by_bare_pod(600)
        };
        let t = next(&restarted, &timed(600));
        assert_eq!(t.state, Failed);
        let message = t.message.unwrap_or_default();
        assert!(
            message.contains("held by pid 1234 (python3)") && !message.contains("bare pod"),
            "{message}"
        );
    }

    #[test]
    fn holders_have_no_deadline_without_a_drain_timeout() {
        let long = held_by_bare_pod(86_400);
        let t = next(&long, &rules());
        assert_eq!(
            (t.state, t.reason.as_deref()),
            (Upgrading, Some(reasons::DEVICE_HELD)),
            "no drain timeout"
        );
        let no_drain = RolloutRules {
            drain_enabled: false,
            ..timed(600)
        };
        assert_eq!(next(&long, &no_drain).state, Upgrading, "drain disabled");
        let unknown = NodeObservation {
            in_state_for: None,
            ..long.clone()
        };
        assert_eq!(
            next(&unknown, &timed(600)).state,
            Upgrading,
            "entry time unknown"
        );
    }
}
