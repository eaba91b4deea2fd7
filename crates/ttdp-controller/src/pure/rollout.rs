//! The rollout planner: runs the per-node [`transition::next`] for every matched node and hands
//! out the `maxUnavailable` slots. Pure.
//!
//! First every node is evaluated with its start gate closed; what is then in flight holds a
//! slot until its cordon is lifted (a node that just finished, or whose cordon the pass has
//! lifted, frees its slot at once, so the next node starts in the same round). Then nodes that
//! could start (Pending ones, and Failed ones whose back-off elapsed or that a user asked to
//! retry) are evaluated again in name order with the gate open while slots remain. With more
//! Failed nodes than `maxUnavailable` the rollout is halted: only a requested retry starts. A
//! [`Planner`] keeps the closed-gate transitions between the passes of a reconcile, so that a
//! pass evaluates again only the nodes whose observation changed.
//!
//! Fresh installs (nothing loaded, nothing of ours on the node: see
//! [`NodeObservation::is_fresh_install`]) disrupt nothing: they start without a slot and hold
//! none while they install, so a fleet of first installs, or of dead nodes that never run their
//! agent, never keeps the upgrades of running nodes waiting. A node that is not Ready stays
//! Pending (`NodeNotReady`) when offered a slot and does not use it up.

use std::time::Duration;

use ttdp_api::driver::v1alpha1::SpecError;
use ttdp_api::{NodeState, TenstorrentDriverPolicySpec};
use ttdp_kmd_types::KmdVersion;

use crate::pure::canary::CanaryVerdict;
use crate::pure::drain_plan;
use crate::pure::start_guard::Guards;
use crate::pure::status::is_halted;
use crate::pure::transition::{
    self, NodeObservation, NodeTransition, RetryGate, RolloutRules, StartGate,
};

/// Policy-wide inputs of the planner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutPlan {
    /// The per-node rules.
    pub rules: RolloutRules,
    /// The effective `maxUnavailable`.
    pub max_unavailable: usize,
    /// `spec.paused`.
    pub paused: bool,
}

impl RolloutPlan {
    /// The plan of `spec` towards `target` over `managed` nodes (`gates_configured`: whether
    /// the controller has deploy gates to close).
    pub fn of(
        spec: &TenstorrentDriverPolicySpec,
        target: &KmdVersion,
        managed: usize,
        gates_configured: bool,
    ) -> Result<Self, SpecError> {
        Ok(RolloutPlan {
            rules: RolloutRules {
                target_version: target.clone(),
                target_parameters: spec.kernel_parameters(),
                drain_enabled: spec.upgrade_policy.drain.enable,
                gates_configured,
                drain_timeout: drain_plan::drain_timeout(spec),
                node_timeout: Some(node_timeout(spec)),
                completion_wait: drain_plan::completion_wait(spec),
            },
            max_unavailable: spec.max_unavailable(managed)?,
            paused: spec.paused,
        })
    }
}

/// The planner across the passes of one reconcile: it remembers every node's transition with
/// its start gate closed, so that a pass plans again only the nodes whose observation changed,
/// and hands out the slots from those.
#[derive(Clone, Debug)]
pub struct Planner {
    plan: RolloutPlan,
    /// Each node's transition with its start gate closed.
    closed: Vec<NodeTransition>,
    /// The nodes given a start gate by the last call.
    gated: Vec<usize>,
    /// The nodes' indexes in name order, when they are not given so.
    order: Option<Vec<usize>>,
    /// The maintenance windows and the canary.
    guards: Guards,
    /// Where the canary stood at the last call.
    verdict: Option<CanaryVerdict>,
    /// Nodes outside the planned ones (they left the selection) that still hold something of
    /// ours: each keeps its slot until its release lands.
    held_outside: usize,
}

impl Planner {
    /// A planner that has planned nothing yet.
    pub fn new(plan: RolloutPlan) -> Self {
        Self {
            plan,
            closed: Vec::new(),
            gated: Vec::new(),
            order: None,
            guards: Guards::default(),
            verdict: None,
            held_outside: 0,
        }
    }

    /// The planner with `n` slots held by nodes that left the selection but still carry our
    /// cordon or grant.
    pub fn with_held_outside(mut self, n: usize) -> Self {
        self.held_outside = n;
        self
    }

    /// The planner with maintenance windows and a canary holding nodes back.
    pub fn with_guards(mut self, guards: Guards) -> Self {
        self.guards = guards;
        self
    }

    /// The guards it plans with.
    pub fn guards(&self) -> &Guards {
        &self.guards
    }

    /// Where the canary stood at the last call (None: no canary).
    pub fn verdict(&self) -> Option<&CanaryVerdict> {
        self.verdict.as_ref()
    }

    /// The per-node rules it plans with.
    pub fn rules(&self) -> &RolloutRules {
        &self.plan.rules
    }

    /// Plans `nodes`: every node the first time, then the nodes in `dirty` (indexes of the
    /// nodes whose observation changed since the last call; the same nodes in the same order).
    /// Returns, in index order, the transition of every node whose transition may differ from
    /// the last call's. Sets each planned observation's start gate.
    pub fn plan(
        &mut self,
        nodes: &mut [(String, NodeObservation)],
        dirty: &[usize],
    ) -> Vec<(usize, NodeTransition)> {
        let closed = if self.plan.paused {
            StartGate::Paused
        } else {
            StartGate::NoSlot
        };
        let mut redo: Vec<usize>;
        if self.closed.len() != nodes.len() {
            redo = (0..nodes.len()).collect();
            self.closed.clear();
            for (_, obs) in nodes.iter_mut() {
                obs.start = closed;
                self.closed.push(transition::next(obs, &self.plan.rules));
            }
            self.order = (!nodes.is_sorted_by(|a, b| a.0 <= b.0)).then(|| {
                let mut order: Vec<usize> = (0..nodes.len()).collect();
                order.sort_by(|a, b| nodes[*a].0.cmp(&nodes[*b].0));
                order
            });
        } else {
            redo = dirty.iter().chain(&self.gated).copied().collect();
            redo.sort_unstable();
            redo.dedup();
            for &i in &redo {
                let obs = &mut nodes[i].1;
                obs.start = closed;
                self.closed[i] = transition::next(obs, &self.plan.rules);
            }
        }
        self.verdict = self.guards.judge(nodes, &self.closed);
        // The next round goes on from this one's rollout, not from the status the reconcile
        // began with: a rollout begun in this round must not begin again with other canaries.
        if let Some(v) = &self.verdict {
            self.guards.previous = Some(v.status.clone());
        }
        let gated = if self.plan.paused {
            Vec::new()
        } else {
            self.hand_out_slots(nodes)
        };
        self.gated = gated.iter().map(|(i, _)| *i).collect();
        redo.extend(&self.gated);
        redo.sort_unstable();
        redo.dedup();
        let mut gated = gated.into_iter().peekable();
        redo.into_iter()
            .map(|i| match gated.next_if(|(g, _)| *g == i) {
                Some(given) => given,
                None => (i, self.closed[i].clone()),
            })
            .collect()
    }

    /// Evaluates again, in name order and while slots remain, the nodes that could start
    /// (Pending ones, and Failed ones whose back-off elapsed or that a user asked to retry)
    /// with their start gate open. With more Failed nodes than `maxUnavailable` the rollout is
    /// halted: only a requested retry starts. Returns those nodes' transitions, in index order.
    fn hand_out_slots(
        &self,
        nodes: &mut [(String, NodeObservation)],
    ) -> Vec<(usize, NodeTransition)> {
        let failed = self
            .closed
            .iter()
            .filter(|t| t.state == NodeState::Failed)
            .count();
        let halted = is_halted(failed, self.plan.max_unavailable);
        let in_flight = self
            .closed
            .iter()
            .zip(nodes.iter())
            .filter(|(t, (_, obs))| takes_slot(obs, t))
            .count()
            + self.held_outside;
        let mut slots = self.plan.max_unavailable.saturating_sub(in_flight);
        let mut gated = Vec::new();
        for k in 0..nodes.len() {
            let i = self.order.as_ref().map_or(k, |order| order[k]);
            let (name, obs) = &mut nodes[i];
            let candidate = match self.closed[i].state {
                NodeState::Pending => true,
                NodeState::Failed => obs.retry != RetryGate::NotYet,
                _ => false,
            };
            if !candidate {
                continue;
            }
            if let Some(gate) = self.guards.hold(self.verdict.as_ref(), name, obs) {
                obs.start = gate;
                gated.push((i, transition::next(obs, &self.plan.rules)));
                continue;
            }
            // A Failed node that still holds a slot (its cordon is not lifted yet) retries in it.
            let holds_slot =
                self.closed[i].state == NodeState::Failed && takes_slot(obs, &self.closed[i]);
            obs.start = if halted && obs.retry != RetryGate::Requested {
                StartGate::Halted
            } else if slots > 0 || obs.is_fresh_install() || holds_slot {
                StartGate::Allowed
            } else {
                continue;
            };
            let t = transition::next(obs, &self.plan.rules);
            if takes_slot(obs, &t) && !holds_slot {
                slots = slots.saturating_sub(1);
            }
            gated.push((i, t));
        }
        gated.sort_unstable_by_key(|(i, _)| *i);
        gated
    }
}

/// `upgradePolicy.nodeTimeoutSeconds` as a duration (below one second, which the schema
/// refuses, counts as one second).
pub fn node_timeout(spec: &TenstorrentDriverPolicySpec) -> Duration {
    Duration::from_secs(u64::try_from(spec.upgrade_policy.node_timeout_seconds).unwrap_or(1))
        .max(Duration::from_secs(1))
}

/// Whether a node going to `t` holds one of the `maxUnavailable` slots: every step from
/// Cordoning until its cordon is lifted (an Uncordoning node that holds nothing of ours is
/// schedulable again, only its Done is left to record), except a fresh install's (it disrupts
/// nothing); and whatever it goes to, a node that still carries our cordon, gates or grant,
/// until they are released: the release runs after this plan and may fail (it leaves the node
/// cordoned, or granted a swap its agent may still make), and a node whose jobs outlasted
/// their wait stays cordoned on purpose.
fn takes_slot(obs: &NodeObservation, t: &NodeTransition) -> bool {
    if !t.state.is_in_flight() || t.state == NodeState::Uncordoning {
        return obs.holds_ours();
    }
    !obs.is_fresh_install()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pure::transition::{Action, AgentCondition, AgentPod, DrainProgress, UpgradeGrant};
    use NodeState::*;

    /// Every node's transition, in the order given, from one planner's first call.
    fn plan(
        plan: &RolloutPlan,
        nodes: &mut [(String, NodeObservation)],
    ) -> Vec<(String, NodeTransition)> {
        Planner::new(plan.clone())
            .plan(nodes, &[])
            .into_iter()
            .map(|(i, t)| (nodes[i].0.clone(), t))
            .collect()
    }

    fn rules() -> RolloutRules {
        RolloutRules {
            target_version: "2.8.0".parse().unwrap(),
            target_parameters: String::new(),
            drain_enabled: true,
            gates_configured: true,
            drain_timeout: None,
            node_timeout: None,
            completion_wait: None,
        }
    }

    fn stale_node(recorded: NodeState) -> NodeObservation {
        NodeObservation {
            recorded: Some(recorded),
            conflict_with: None,
            host_managed: false,
            loaded_version: Some("2.7.0".into()),
            parameters_differ: false,
            agent: AgentPod::Stale,
            cordoned_by_us: false,
            externally_cordoned: false,
            gates_closed_by_us: false,
            grant: UpgradeGrant::Absent,
            drain: DrainProgress::NotStarted,
            retry: RetryGate::NotYet,
            start: StartGate::NoSlot,
            in_state_for: None,
            node_not_ready: None,
            held_for_jobs: false,
            failed_for_other_target: false,
            lifted_unrecorded: false,
            unsupported_compiler: None,
        }
    }

    fn fleet(states: &[NodeState]) -> Vec<(String, NodeObservation)> {
        states
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("n{i}"), stale_node(*s)))
            .collect()
    }

    fn states(p: &RolloutPlan, nodes: &[(String, NodeObservation)]) -> Vec<NodeState> {
        plan(p, &mut nodes.to_vec())
            .into_iter()
            .map(|(_, t)| t.state)
            .collect()
    }

    fn policy(max: usize, paused: bool) -> RolloutPlan {
        RolloutPlan {
            rules: rules(),
            max_unavailable: max,
            paused,
        }
    }

    #[test]
    fn at_most_max_unavailable_nodes_start() {
        let nodes = fleet(&[Pending; 5]);
        assert_eq!(
            states(&policy(1, false), &nodes),
            [Cordoning, Pending, Pending, Pending, Pending]
        );
        assert_eq!(
            states(&policy(2, false), &nodes),
            [Cordoning, Cordoning, Pending, Pending, Pending]
        );
        let mut busy = fleet(&[Draining, Pending, Pending]);
        // Draining, as Cordoning left it: cordoned with its gates closed.
        busy[0].1.cordoned_by_us = true;
        busy[0].1.gates_closed_by_us = true;
        assert_eq!(
            states(&policy(1, false), &busy),
            [Draining, Pending, Pending]
        );
        assert_eq!(
            states(&policy(2, false), &busy),
            [Draining, Cordoning, Pending]
        );
    }

    #[test]
    fn a_finishing_node_frees_its_slot_in_the_same_pass() {
        let mut nodes = fleet(&[Uncordoning, Pending]);
        nodes[0].1.agent = AgentPod::Current(AgentCondition::Ready);
        nodes[0].1.loaded_version = Some("2.8.0".into());
        assert_eq!(states(&policy(1, false), &nodes), [Done, Cordoning]);
    }

    /// The pass lifts a finishing node's cordon before it records its Uncordoning; once the
    /// cordon is lifted the slot is free, and the next node's Cordoning goes into the same write.
    #[test]
    fn a_lifted_cordon_frees_its_slot_before_the_node_is_done() {
        let mut nodes = fleet(&[Upgrading, Pending]);
        nodes[0].1.agent = AgentPod::Current(AgentCondition::Ready);
        nodes[0].1.loaded_version = Some("2.8.0".into());
        nodes[0].1.cordoned_by_us = true;
        nodes[0].1.gates_closed_by_us = true;
        let mut planner = Planner::new(policy(1, false));
        let first = planner.plan(&mut nodes, &[]);
        let first: Vec<NodeState> = first.iter().map(|(_, t)| t.state).collect();
        assert_eq!(
            first,
            [Uncordoning, Pending],
            "the cordon still holds the slot"
        );

        // The lift went through: the node holds nothing of ours; it is not planned again.
        nodes[0].1.cordoned_by_us = false;
        nodes[0].1.gates_closed_by_us = false;
        let again = planner.plan(&mut nodes, &[]);
        assert_eq!(
            again.len(),
            1,
            "only the waiting node is planned again: {again:?}"
        );
        assert_eq!((again[0].0, again[0].1.state), (1, Cordoning));
    }

    #[test]
    fn a_failed_lift_keeps_the_slot() {
        let mut nodes = fleet(&[Uncordoning, Pending]);
        nodes[0].1.agent = AgentPod::Current(AgentCondition::Ready);
        nodes[0].1.loaded_version = Some("2.8.0".into());
        nodes[0].1.cordoned_by_us = true;
        assert_eq!(states(&policy(1, false), &nodes), [Uncordoning, Pending]);
    }

    /// The fleet: a new policy over seven nodes, two of them already running 2.7.0
    /// from an earlier policy, every agent pod already on the current template. The fresh
    /// installs go ahead in parallel; each loaded node waits for a slot, is cordoned, and is
    /// granted its swap only after its drain.
    #[test]
    fn current_agents_on_loaded_nodes_wait_for_a_slot_and_a_grant() {
        let mut nodes = fleet(&[Pending; 7]);
        for (i, (_, obs)) in nodes.iter_mut().enumerate() {
            obs.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
            if i >= 2 {
                obs.loaded_version = None;
                obs.agent = AgentPod::Current(AgentCondition::Working);
            }
        }
        let out = plan(&policy(1, false), &mut nodes.clone());
        let got: Vec<NodeState> = out.iter().map(|(_, t)| t.state).collect();
        assert_eq!(
            got,
            [
                Cordoning, Pending, Upgrading, Upgrading, Upgrading, Upgrading, Upgrading
            ],
            "fresh installs need no slot and hold none; the loaded nodes take theirs one by one"
        );
        assert!(out.iter().all(|(_, t)| !t.actions.contains(&Action::Grant)));
        let loaded = &mut nodes[..2];
        assert_eq!(
            states(&policy(1, false), loaded),
            [Cordoning, Pending],
            "one slot: one loaded node starts, through the cordon"
        );
        loaded[0].1.recorded = Some(Draining);
        loaded[0].1.cordoned_by_us = true;
        loaded[0].1.gates_closed_by_us = true;
        loaded[0].1.drain = DrainProgress::Succeeded { skipped: vec![] };
        let out = plan(&policy(1, false), &mut loaded.to_vec());
        assert_eq!(out[0].1.state, Upgrading);
        assert_eq!(out[0].1.actions[0], Action::Grant, "granted once drained");
        assert_eq!(out[1].1.state, Pending);
        let mut no_drain = policy(1, false);
        no_drain.rules.drain_enabled = false;
        let out = plan(&no_drain, &mut nodes[..2].to_vec());
        assert_eq!(
            out.iter()
                .map(|(_, t)| (t.state, t.actions.contains(&Action::Grant)))
                .collect::<Vec<_>>(),
            [(Upgrading, true), (Pending, false)],
            "without drain the grant still waits for a slot"
        );
    }

    #[test]
    fn paused_starts_nothing_new() {
        let nodes = fleet(&[Pending, Pending]);
        assert_eq!(states(&policy(2, true), &nodes), [Pending, Pending]);
    }

    #[test]
    fn too_many_failures_halt_but_a_requested_retry_still_runs() {
        let mut nodes = fleet(&[Failed, Failed, Pending, Failed]);
        for n in &mut nodes {
            n.1.retry = RetryGate::Due;
        }
        nodes[2].1.retry = RetryGate::NotYet;
        nodes[3].1.retry = RetryGate::Requested;
        let out = plan(&policy(1, false), &mut nodes);
        let got: Vec<NodeState> = out.iter().map(|(_, t)| t.state).collect();
        assert_eq!(got, [Failed, Failed, Pending, Cordoning]);
        assert_eq!(
            out[2].1.reason.as_deref(),
            Some(transition::reasons::ROLLOUT_HALTED)
        );
        assert!(out[3].1.actions.contains(&Action::ClearRetry));
    }

    #[test]
    fn failed_nodes_retry_within_slots_once_their_back_off_elapsed() {
        let mut nodes = fleet(&[Failed, Pending]);
        assert_eq!(
            states(&policy(1, false), &nodes),
            [Failed, Cordoning],
            "Failed holds no slot"
        );
        nodes[0].1.retry = RetryGate::Due;
        assert_eq!(states(&policy(1, false), &nodes), [Cordoning, Pending]);
    }

    #[test]
    fn a_planner_given_the_changed_nodes_plans_as_planning_everything_would() {
        let p = policy(2, false);
        let mut nodes = fleet(&[Pending; 6]);
        nodes[4].1.recorded = Some(Failed);
        let mut planner = Planner::new(p.clone());
        let mut current: Vec<NodeTransition> = Vec::new();
        let mut pass = |nodes: &mut Vec<(String, NodeObservation)>, dirty: &[usize]| {
            for (i, t) in planner.plan(nodes, dirty) {
                if i == current.len() {
                    current.push(t);
                } else {
                    current[i] = t;
                }
            }
            let whole: Vec<NodeTransition> = plan(&p, &mut nodes.clone())
                .into_iter()
                .map(|(_, t)| t)
                .collect();
            assert_eq!(current, whole, "after dirty {dirty:?}");
            current.iter().map(|t| t.state).collect::<Vec<_>>()
        };
        assert_eq!(
            pass(&mut nodes, &[]),
            [Cordoning, Cordoning, Pending, Pending, Failed, Pending]
        );
        // Recorded as planned: nothing else moves.
        nodes[0].1.recorded = Some(Cordoning);
        nodes[1].1.recorded = Some(Cordoning);
        assert_eq!(
            pass(&mut nodes, &[0, 1]),
            [Cordoning, Cordoning, Pending, Pending, Failed, Pending]
        );
        // n0 finishes: its slot goes to n2 in the same pass.
        nodes[0].1 = stale_node(Uncordoning);
        nodes[0].1.agent = AgentPod::Current(AgentCondition::Ready);
        nodes[0].1.loaded_version = Some("2.8.0".into());
        assert_eq!(
            pass(&mut nodes, &[0]),
            [Done, Cordoning, Cordoning, Pending, Failed, Pending]
        );
        // The failed node's retry is asked for, unseen by a pass that changed nothing else.
        nodes[4].1.retry = RetryGate::Requested;
        assert_eq!(
            pass(&mut nodes, &[]),
            [Done, Cordoning, Cordoning, Pending, Failed, Pending]
        );
        nodes[1].1.recorded = Some(Done);
        nodes[1].1.agent = AgentPod::Current(AgentCondition::Ready);
        nodes[1].1.loaded_version = Some("2.8.0".into());
        nodes[2].1.recorded = Some(Cordoning);
        assert_eq!(
            pass(&mut nodes, &[1, 2, 4]),
            [Done, Done, Cordoning, Cordoning, Failed, Pending]
        );
    }

    const DOWN: &str = "Ready=Unknown: NodeStatusUnknown: Kubelet stopped posting node status.";

    fn reasons_of(out: &[(String, NodeTransition)]) -> Vec<(NodeState, Option<&str>)> {
        out.iter()
            .map(|(_, t)| (t.state, t.reason.as_deref()))
            .collect()
    }

    /// The incident: three dead fresh nodes (agent pods bound, never run) and three healthy
    /// loaded ones. The dead nodes stay Pending without a slot; the healthy ones start.
    #[test]
    fn dead_nodes_take_no_slot_and_healthy_nodes_start() {
        let mut nodes = fleet(&[Pending; 6]);
        for (_, obs) in &mut nodes[..3] {
            obs.loaded_version = None;
            obs.agent =
                AgentPod::Current(AgentCondition::Stuck(crate::pure::agent_blocker::Blocker {
                    reason: "NodeNotReady".into(),
                    message: "bound to a node that is not Ready".into(),
                }));
            obs.node_not_ready = Some(DOWN.into());
        }
        let out = plan(&policy(1, false), &mut nodes);
        let not_ready = (Pending, Some(transition::reasons::NODE_NOT_READY));
        assert_eq!(
            reasons_of(&out),
            [
                not_ready,
                not_ready,
                not_ready,
                (Cordoning, None),
                (Pending, Some(transition::reasons::WAITING_FOR_SLOT)),
                (Pending, Some(transition::reasons::WAITING_FOR_SLOT)),
            ]
        );
    }

    /// A loaded node that is not Ready is offered the slot and leaves it to the next node.
    #[test]
    fn a_node_that_is_not_ready_leaves_its_slot_to_the_next() {
        let mut nodes = fleet(&[Pending; 3]);
        nodes[0].1.node_not_ready = Some(DOWN.into());
        let out = plan(&policy(1, false), &mut nodes);
        assert_eq!(
            reasons_of(&out),
            [
                (Pending, Some(transition::reasons::NODE_NOT_READY)),
                (Cordoning, None),
                (Pending, Some(transition::reasons::WAITING_FOR_SLOT)),
            ]
        );
    }

    /// Fresh installs with stale agents start without a slot, and fresh installs in flight hold
    /// none: the loaded nodes still get theirs.
    #[test]
    fn fresh_installs_go_in_parallel_without_holding_slots() {
        let mut nodes = fleet(&[Pending, Pending, Upgrading, Pending, Pending]);
        for i in [0, 1, 2] {
            nodes[i].1.loaded_version = None;
        }
        nodes[2].1.agent = AgentPod::Current(AgentCondition::Working);
        assert_eq!(
            states(&policy(1, false), &nodes),
            [Upgrading, Upgrading, Upgrading, Cordoning, Pending]
        );
        // A running node's upgrade in flight does hold its slot.
        let mut busy = nodes.clone();
        busy[3].1.recorded = Some(Draining);
        busy[3].1.cordoned_by_us = true;
        busy[3].1.gates_closed_by_us = true;
        busy[3].1.drain = DrainProgress::Running {
            message: "evicting".into(),
        };
        assert_eq!(
            states(&policy(1, false), &busy),
            [Upgrading, Upgrading, Upgrading, Draining, Pending]
        );
    }

    /// A node stuck past the node timeout fails and frees its slot in the same pass; with more
    /// failures than `maxUnavailable` the rollout halts, saying so.
    #[test]
    fn a_timed_out_node_frees_its_slot_and_counts_against_the_budget() {
        let mut p = policy(1, false);
        p.rules.node_timeout = Some(std::time::Duration::from_secs(600));
        let stuck = |o: &mut NodeObservation| {
            o.recorded = Some(Upgrading);
            o.cordoned_by_us = true;
            o.gates_closed_by_us = true;
            o.grant = UpgradeGrant::Target;
            o.agent = AgentPod::Missing;
            o.in_state_for = Some(std::time::Duration::from_secs(601));
        };
        let mut nodes = fleet(&[Upgrading, Pending, Pending]);
        stuck(&mut nodes[0].1);
        let out = plan(&p, &mut nodes);
        assert_eq!(
            reasons_of(&out)[..2],
            [
                (Failed, Some(transition::reasons::NODE_TIMEOUT)),
                (Pending, Some(transition::reasons::WAITING_FOR_SLOT))
            ],
            "the slot is held until the cordon is lifted"
        );
        assert_eq!(out[0].1.actions, vec![Action::Release]);
        // Released (what the reconcile's lift does before it plans again): the rollout goes on.
        let released = &mut nodes[0].1;
        released.recorded = Some(Failed);
        released.cordoned_by_us = false;
        released.gates_closed_by_us = false;
        released.grant = UpgradeGrant::Absent;
        let out = plan(&p, &mut nodes);
        assert_eq!(
            reasons_of(&out)[..2],
            [(Failed, None), (Cordoning, None)],
            "the rollout continues"
        );
        let mut nodes = fleet(&[Failed, Upgrading, Pending]);
        stuck(&mut nodes[1].1);
        let out = plan(&p, &mut nodes);
        assert_eq!(
            reasons_of(&out)[1..],
            [
                (Failed, Some(transition::reasons::NODE_TIMEOUT)),
                (Pending, Some(transition::reasons::ROLLOUT_HALTED))
            ],
            "two failures with maxUnavailable 1: halted"
        );
    }

    /// A Failed node whose release did not land (the write failed) is still cordoned by us: it
    /// keeps its slot, so maxUnavailable holds.
    #[test]
    fn a_failed_node_still_cordoned_keeps_its_slot() {
        let p = policy(1, false);
        let mut nodes = fleet(&[Failed, Pending, Pending]);
        nodes[0].1.cordoned_by_us = true;
        nodes[0].1.gates_closed_by_us = true;
        let out = plan(&p, &mut nodes);
        assert_eq!(out[0].1.actions, vec![Action::Release]);
        assert_eq!(
            reasons_of(&out)[1..],
            [
                (Pending, Some(transition::reasons::WAITING_FOR_SLOT)),
                (Pending, Some(transition::reasons::WAITING_FOR_SLOT))
            ]
        );
    }

    /// A node whose jobs outlasted their wait (`onTimeout: Fail`) stays Failed and cordoned,
    /// holding its slot; a retry goes on from its own slot.
    #[test]
    fn a_node_failed_waiting_for_its_jobs_stays_cordoned_in_its_slot() {
        let p = policy(1, false);
        let mut nodes = fleet(&[Draining, Pending]);
        let draining = &mut nodes[0].1;
        draining.cordoned_by_us = true;
        draining.gates_closed_by_us = true;
        draining.drain = DrainProgress::Failed {
            reason: transition::reasons::WAIT_FOR_COMPLETION_TIMEOUT.into(),
            message: "2 pods still run".into(),
        };
        let out = plan(&p, &mut nodes);
        assert_eq!(
            reasons_of(&out),
            [
                (
                    Failed,
                    Some(transition::reasons::WAIT_FOR_COMPLETION_TIMEOUT)
                ),
                (Pending, Some(transition::reasons::WAITING_FOR_SLOT))
            ]
        );
        assert!(out[0].1.actions.is_empty(), "the cordon stays");
        let failed = &mut nodes[0].1;
        failed.recorded = Some(Failed);
        failed.held_for_jobs = true;
        failed.drain = DrainProgress::NotStarted;
        let out = plan(&p, &mut nodes);
        assert_eq!(
            reasons_of(&out)[1],
            (Pending, Some(transition::reasons::WAITING_FOR_SLOT))
        );
        assert!(out[0].1.actions.is_empty(), "still cordoned");
        nodes[0].1.retry = RetryGate::Due;
        let out = plan(&p, &mut nodes);
        assert_eq!(
            out[0].1.state, Failed,
            "no retry by back-off: it would only wait again"
        );
        nodes[0].1.retry = RetryGate::Requested;
        let out = plan(&p, &mut nodes);
        assert_eq!(out[0].1.state, Cordoning, "retried in its own slot");
        assert_eq!(out[1].1.state, Pending);
    }
}
