//! Where a node goes next, state by state ([`super::next`] without the retry clearing). A
//! [`Deciding`] holds one node's observation and the rollout's rules while each state's rule
//! reads them.

use std::time::Duration;

use ttdp_api::NodeState;

use super::{
    Action, AgentCondition, AgentPod, DrainProgress, NodeObservation, NodeTransition, RetryGate,
    RolloutRules, StartGate, UpgradeGrant, reasons,
};

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

pub(super) fn decide(obs: &NodeObservation, rules: &RolloutRules) -> NodeTransition {
    let holds_ours = obs.holds_ours();
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
    let deciding = Deciding {
        obs,
        rules,
        holds_ours,
    };
    let t = match obs.recorded.unwrap_or(NodeState::Pending) {
        NodeState::Cordoning => deciding.cordoning(),
        NodeState::Draining => deciding.draining(),
        NodeState::Upgrading => deciding.upgrading(false),
        NodeState::Uncordoning => deciding.uncordoning(),
        NodeState::Failed if obs.failed_for_other_target => deciding.settled(),
        NodeState::Failed => deciding.failed(),
        NodeState::Pending | NodeState::Done | NodeState::HostManaged | NodeState::Conflict => {
            deciding.settled()
        }
    };
    let t = deciding.within_deadline(t);
    // Back in line (no slot, not Ready, a new version or canary): a grant left from before
    // must not stay behind, or an agent that still asks for it could swap out of turn.
    if t.state == NodeState::Pending && holds_ours && !t.actions.contains(&Action::Release) {
        return t.doing(Action::Release);
    }
    t
}

/// `d` as people read it: `45s`, `30m0s`, `2h5m0s`.
fn readable(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, min, sec) => format!("{min}m{sec}s"),
        (h, min, sec) => format!("{h}h{min}m{sec}s"),
    }
}

/// One node's decision in the making.
struct Deciding<'a> {
    obs: &'a NodeObservation,
    rules: &'a RolloutRules,
    holds_ours: bool,
}

impl Deciding<'_> {
    fn target(&self) -> &str {
        self.rules.target_version.as_str()
    }

    /// The node reports the target version loaded with the target parameters.
    fn at_target(&self) -> bool {
        self.obs.loaded_version.as_deref() == Some(self.target()) && !self.obs.parameters_differ
    }

    /// The agent on the current template is ready and the node reports the target loaded.
    fn up_to_date(&self) -> bool {
        self.obs.agent == AgentPod::Current(AgentCondition::Ready) && self.at_target()
    }

    /// A different version, or the target with other parameters, is loaded: the agent reloads
    /// it only with a grant (a parameter change disrupts workloads as a version change does).
    fn needs_grant(&self) -> bool {
        self.obs.module_loaded() && !self.at_target()
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
        (self.obs.cordoned_by_us && !self.obs.lifted_unrecorded)
            || (self.obs.externally_cordoned && self.obs.gates_closed_by_us)
    }

    /// The node is cordoned (by us, or by someone else) with its gates closed, as Cordoning
    /// leaves it for the drain.
    fn held_for_drain(&self) -> bool {
        let cordoned = (self.obs.cordoned_by_us && !self.obs.lifted_unrecorded)
            || self.obs.externally_cordoned;
        cordoned && (self.obs.gates_closed_by_us || !self.rules.gates_configured)
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
        if let Some(why) = &self.obs.unsupported_compiler {
            // cordoning a node for a build that cannot happen would only disrupt it
            return NodeTransition::to(NodeState::Pending)
                .because(reasons::UNSUPPORTED_COMPILER, why.clone());
        }
        match self.obs.start {
            StartGate::Allowed | StartGate::NoSlot if self.obs.node_not_ready.is_some() => {
                self.not_ready()
            }
            StartGate::Allowed if self.needs_drain() => {
                NodeTransition::to(NodeState::Cordoning).doing(Action::Cordon)
            }
            StartGate::Allowed => self.enter_upgrading(),
            gate => self.pending(gate),
        }
    }

    /// Held back while the node is not Ready: a step started on a node whose kubelet runs no
    /// pod would hold its slot for nothing. No minimum duration either way: the node takes its
    /// turn as soon as it is Ready again (the node watch wakes the policy).
    fn not_ready(&self) -> NodeTransition {
        let why = self
            .obs
            .node_not_ready
            .as_deref()
            .unwrap_or("no Ready condition");
        NodeTransition::to(NodeState::Pending).because(
            reasons::NODE_NOT_READY,
            format!(
                "the node is not Ready ({why}); it takes no slot and starts once it is Ready again"
            ),
        )
    }

    /// A node that stays in its step (`t` keeps the recorded state) past the step's deadline
    /// fails with `NodeTimeout`, saying what it waited for; it then frees its slot and counts
    /// against the failure budget. A node held at a step boundary by a pause is not stuck.
    fn within_deadline(&self, t: NodeTransition) -> NodeTransition {
        let Some(step) = self.obs.recorded.filter(|s| *s == t.state) else {
            return t;
        };
        let Some(limit) = self.rules.step_deadline(step) else {
            return t;
        };
        let Some(waited) = self.obs.in_state_for.filter(|w| *w >= limit) else {
            return t;
        };
        if t.reason.as_deref() == Some(reasons::PAUSED) {
            return t;
        }
        let waiting_on = match (&t.reason, &t.message) {
            (Some(reason), Some(message)) => format!("{message} ({reason})"),
            (Some(reason), None) => reason.clone(),
            (None, _) => "the step to finish".to_owned(),
        };
        let failed = NodeTransition::to(NodeState::Failed).because(
            reasons::NODE_TIMEOUT,
            format!(
                "no progress in {step} for {}, past upgradePolicy.nodeTimeoutSeconds ({}s); it was waiting on: {waiting_on}. Fix that, then run kubectl tt driver retry (or wait for the retry with back-off)",
                readable(waited),
                limit.as_secs()
            ),
        );
        if self.holds_ours {
            failed.doing(Action::Release)
        } else {
            failed
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
            StartGate::CanaryHalted => t.because(
                reasons::ROLLOUT_HALTED,
                "the rollout is halted by its canary (status.rollout.haltedBy); retry or skip that node, or change spec.version",
            ),
            StartGate::OutsideWindow(opens) => t.because(
                reasons::OUTSIDE_WINDOW,
                format!("outside the maintenance windows; the next opens at {opens}"),
            ),
            StartGate::WaitingForCanary => t.because(
                reasons::WAITING_FOR_CANARY,
                "the canary nodes upgrade first (status.rollout.canaryNodes)",
            ),
            StartGate::Soaking(until) => t.because(
                reasons::CANARY_SOAKING,
                format!("the canary nodes soak until {until}"),
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
            } else if !self.rules.drain_enabled || self.obs.grant == UpgradeGrant::Target {
                // with drain, a grant is given only after the drain: it says it was drained
                self.upgrading(true)
            } else {
                // recorded Upgrading stands for drained, and nothing here says it was: drain
                // again (it evicts nothing new) before any grant
                NodeTransition::to(NodeState::Draining).doing(Action::Drain)
            };
        }
        if self.up_to_date() {
            return self.finish();
        }
        if let Some(why) = &self.obs.node_not_ready {
            // A Done node whose kubelet is down keeps its module: it stays Done, saying so.
            return if self.obs.recorded == Some(NodeState::Done) && self.at_target() {
                NodeTransition::to(NodeState::Done).because(
                    reasons::NODE_NOT_READY,
                    format!(
                        "the node is not Ready ({why}); it ran tt-kmd {} when last seen",
                        self.target()
                    ),
                )
            } else {
                match self.obs.start {
                    gate @ (StartGate::Paused
                    | StartGate::Halted
                    | StartGate::CanaryHalted
                    | StartGate::OutsideWindow(_)
                    | StartGate::WaitingForCanary
                    | StartGate::Soaking(_)) => self.pending(gate),
                    StartGate::Allowed | StartGate::NoSlot => self.not_ready(),
                }
            };
        }
        self.by_agent()
    }

    /// A settled node that holds nothing of ours and is Ready: what its agent pod says.
    fn by_agent(&self) -> NodeTransition {
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
            // A node on the target whose agent is briefly not Ready (its kubelet came back, the
            // pod restarted, the node rejoined) runs the target: it keeps its state, and takes
            // no step (nor a slot) for an install that is not happening.
            AgentPod::Current(AgentCondition::Starting | AgentCondition::Working)
                if self.at_target() =>
            {
                if self.obs.recorded == Some(NodeState::Done) {
                    NodeTransition::to(NodeState::Done)
                } else {
                    NodeTransition::to(NodeState::Pending).because(
                        reasons::WAITING_FOR_AGENT,
                        format!(
                            "tt-kmd {} is loaded; waiting for the agent to report Ready",
                            self.target()
                        ),
                    )
                }
            }
            AgentPod::Current(_) => self.upgrading(true),
            AgentPod::Stale => self.start(),
            AgentPod::Missing | AgentPod::Terminating | AgentPod::NotCreated(_) => {
                if self.obs.recorded == Some(NodeState::Done) && self.at_target() {
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
        NodeTransition::to(NodeState::Draining).doing(Action::Drain)
    }

    fn draining(&self) -> NodeTransition {
        if self.up_to_date() {
            return self.finish();
        }
        // The cordon was lifted meanwhile (a round that lifted it could not record that): what
        // was drained may be back, so the node is cordoned and drained again.
        if !self.held_for_drain() {
            return NodeTransition::to(NodeState::Cordoning).doing(Action::Cordon);
        }
        match &self.obs.drain {
            DrainProgress::Succeeded { skipped } if !skipped.is_empty() => self
                .enter_upgrading()
                .because(reasons::BARE_PODS_SKIPPED, skipped_message(skipped)),
            DrainProgress::Succeeded { .. } => self.enter_upgrading(),
            // The jobs still run there: the node stays cordoned, so nothing new lands on it
            // and the next node does not start beside it.
            DrainProgress::Failed { reason, message }
                if reason == reasons::WAIT_FOR_COMPLETION_TIMEOUT =>
            {
                NodeTransition::to(NodeState::Failed).because(reason, message.clone())
            }
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
        // The back-off does not retry a node that is not Ready: it stays Failed and keeps
        // counting against the failure budget (the upgrade may be what took it down). A retry
        // asked for by hand puts it back in line (Pending, NodeNotReady).
        // A node whose jobs outlasted their wait is retried only when asked: the admin chose
        // to fail rather than drain them, and a retry by back-off would only wait again.
        let may_retry = match self.obs.retry {
            RetryGate::Requested => true,
            RetryGate::Due => self.obs.node_not_ready.is_none() && !self.obs.held_for_jobs,
            RetryGate::NotYet => false,
        };
        if may_retry && self.obs.start == StartGate::Allowed {
            let mut t = self.start();
            if t.reason.as_deref() == Some(reasons::NODE_NOT_READY) {
                return t;
            }
            t.reason = Some(reasons::RETRYING.to_owned());
            t.message = Some(format!("retrying the install of {}", self.target()));
            return t;
        }
        let mut t = NodeTransition::to(NodeState::Failed);
        if let AgentPod::Current(AgentCondition::Failed { reason, message }) = &self.obs.agent {
            t = t.because(reason, message.clone());
        }
        if self.holds_ours && !self.obs.held_for_jobs {
            t.doing(Action::Release)
        } else {
            t
        }
    }
}
