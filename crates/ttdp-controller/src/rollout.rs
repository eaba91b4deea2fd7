//! The rollout planner: runs the per-node [`transition::next`] for every matched node and hands
//! out the `maxUnavailable` slots. Pure.
//!
//! First every node is evaluated with its start gate closed; what is then in flight holds a
//! slot (a node that just finished frees its slot at once, so the next node starts in the same
//! reconcile). Then nodes that could start (Pending ones, and Failed ones whose back-off elapsed
//! or that a user asked to retry) are evaluated again in name order with the gate open while
//! slots remain. With more Failed nodes than `maxUnavailable` the rollout is halted: only a
//! requested retry starts.

use ttdp_api::NodeState;

use crate::status::is_halted;
use crate::transition::{
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

/// Every node's transition, in the order given. Sets each observation's start gate (the
/// planner's to decide).
pub fn plan(
    plan: &RolloutPlan,
    nodes: &mut [(String, NodeObservation)],
) -> Vec<(String, NodeTransition)> {
    let closed = if plan.paused {
        StartGate::Paused
    } else {
        StartGate::NoSlot
    };
    let mut out: Vec<(String, NodeTransition)> = nodes
        .iter_mut()
        .map(|(name, obs)| {
            obs.start = closed;
            (name.clone(), transition::next(obs, &plan.rules))
        })
        .collect();
    if plan.paused {
        return out;
    }
    let failed = out
        .iter()
        .filter(|(_, t)| t.state == NodeState::Failed)
        .count();
    let halted = is_halted(failed, plan.max_unavailable);
    let in_flight = out.iter().filter(|(_, t)| t.state.is_in_flight()).count();
    let mut slots = plan.max_unavailable.saturating_sub(in_flight);
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    if !nodes.is_sorted_by(|a, b| a.0 <= b.0) {
        order.sort_by(|a, b| nodes[*a].0.cmp(&nodes[*b].0));
    }
    for i in order {
        let (_, obs) = &mut nodes[i];
        let candidate = match out[i].1.state {
            NodeState::Pending => true,
            NodeState::Failed => obs.retry != RetryGate::NotYet,
            _ => false,
        };
        if !candidate {
            continue;
        }
        let gate = if halted && obs.retry != RetryGate::Requested {
            StartGate::Halted
        } else if slots > 0 {
            StartGate::Allowed
        } else {
            continue;
        };
        obs.start = gate;
        let t = transition::next(obs, &plan.rules);
        if t.state.is_in_flight() {
            slots -= 1;
        }
        out[i].1 = t;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transition::{Action, AgentCondition, AgentPod, DrainProgress};
    use NodeState::*;

    fn rules() -> RolloutRules {
        RolloutRules {
            target_version: "2.8.0".into(),
            drain_enabled: true,
            gates_configured: true,
        }
    }

    fn stale_node(recorded: NodeState) -> NodeObservation {
        NodeObservation {
            recorded: Some(recorded),
            conflict_with: None,
            host_managed: false,
            loaded_version: Some("2.7.0".into()),
            agent: AgentPod::Stale,
            cordoned_by_us: false,
            externally_cordoned: false,
            gates_closed_by_us: false,
            drain: DrainProgress::NotStarted,
            retry: RetryGate::NotYet,
            start: StartGate::NoSlot,
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
        let busy = fleet(&[Draining, Pending, Pending]);
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
}
