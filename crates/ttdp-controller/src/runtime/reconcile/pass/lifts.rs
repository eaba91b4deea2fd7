//! The lifts of a round's cordons: sent on their way together, each freed slot handed on as
//! soon as its lift lands, and the nodes that change meanwhile taken up while they are on
//! their way.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ttdp_api::NodeState;
use ttdp_drain::UncordonOutcome;

use super::{FOLLOW_FOR, Pass};
use crate::pure::transition::{Action, NodeTransition, UpgradeGrant};
use crate::runtime::node_work::act::{self, NodeOutcome, NodeWork};
use crate::runtime::reconcile::follow;

impl Pass {
    /// Sends on their way the lifts of the cordons planned to be lifted, adding their nodes to
    /// `lifted`: until their Uncordoning is recorded, the context notes them as lifted.
    pub(super) fn send_lifts(&mut self, lifts: &mut act::LiftsInFlight, lifted: &mut Vec<String>) {
        let lifting = self.cordons_to_lift();
        let nodes: Vec<String> = lifting.iter().map(|w| w.node.clone()).collect();
        self.ctx.note_lifted(&self.name, &nodes, true);
        act::send_lifts(lifts, &self.ctx, &self.policy, lifting, &self.now);
        lifted.extend(nodes);
    }

    /// The next lifts landed, or None when the fleet changed first. With no lift on its way,
    /// nothing has landed; after a wait as long as a pass follows the fleet, nothing either.
    pub(super) async fn landed_or_changed(
        &self,
        lifts: &mut act::LiftsInFlight,
    ) -> Option<Vec<NodeOutcome>> {
        // A stopping controller keeps saying something changed: only the lifts are awaited.
        if lifts.is_empty() || self.watched.closed() {
            return Some(act::landed(lifts).await);
        }
        tokio::select! {
            landed = act::landed(lifts) => Some(landed),
            woken = self.watched.changed_within(FOLLOW_FOR) => (!woken).then(Vec::new),
        }
    }

    /// Observes again, while lifts are on their way, the nodes that changed, and adds their
    /// planned steps to `transitions`, with the deferred nodes whose task ended to `deferred`.
    /// False when the fleet changed too much to follow (the next reconcile observes it whole).
    pub(super) fn take_up_changes(
        &mut self,
        transitions: &mut Vec<(usize, NodeTransition)>,
        deferred: &mut BTreeSet<usize>,
    ) -> bool {
        let Some(changed) = self.changed_since() else {
            return false;
        };
        deferred.append(&mut self.deferred);
        self.observe_again(changed);
        let planned = self.plan_nodes();
        merge(transitions, planned);
        true
    }

    /// Hands out again the slots that landed lifts freed, adding the nodes that take them to
    /// `transitions`. A lifted cordon is lifted before its node's Uncordoning is recorded
    /// (lifting is harmless to repeat, and after a crash in between the node, seen uncordoned
    /// with its agent Ready, goes the same way to Done); the next node's Cordoning is recorded
    /// only once the slot is free, so a failed lift keeps its slot.
    pub(super) fn hand_on_slots(&mut self, transitions: &mut Vec<(usize, NodeTransition)>) {
        self.apply_uncordoned();
        // The lifted nodes are not planned again: they would go to Done before their
        // Uncordoning is written.
        self.reobserved.clear();
        let planned = self.plan_nodes();
        merge(transitions, planned);
    }

    /// The cordons to lift now, noted as taken (see [`Pass::hand_on_slots`]).
    pub(super) fn cordons_to_lift(&mut self) -> Vec<NodeWork> {
        let mut lifting = Vec::new();
        let planned = self.observations.iter().zip(&self.planned).enumerate();
        for (i, ((node, _), (state, actions))) in planned {
            // A Failed node's release waits for its Failed to be recorded.
            if *state != NodeState::Uncordoning || actions.as_slice() != [Action::Release] {
                continue;
            }
            if self.ctx.node_tasks.busy(&self.name, node) {
                self.deferred.insert(i);
                continue;
            }
            let taken = self.actions_taken.entry(node.clone()).or_default();
            if !taken.contains(&Action::Release) {
                taken.push(Action::Release);
                let record = self.uncordoning_record(node);
                if record.is_some() {
                    self.written.insert(node.clone(), record.clone());
                }
                lifting.push(NodeWork::lift(node, record));
            }
        }
        lifting
    }

    /// Keeps the first failure and the cordons lifted; returns how many were lifted.
    pub(super) fn take_outcomes(&mut self, outcomes: Vec<NodeOutcome>) -> usize {
        let mut released = 0;
        for (node, results) in outcomes {
            for (action, result) in results {
                match result {
                    Ok(Some(outcome)) => {
                        released += 1;
                        if let Some(i) = follow::position(&self.matched, &node) {
                            self.uncordoned
                                .insert(node.clone(), (self.matched[i].clone(), outcome));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => act::keep_failure(&node, action, e, &mut self.first_error),
                }
            }
        }
        released
    }

    /// Until the cache shows a lifted cordon, the observation says what the lifting did.
    pub(super) fn apply_uncordoned(&mut self) {
        let (matched, observations, reobserved) =
            (&self.matched, &mut self.observations, &mut self.reobserved);
        self.uncordoned.retain(|node, (before, outcome)| {
            let Some(i) = follow::position(matched, node) else {
                return false;
            };
            if !Arc::ptr_eq(before, &matched[i]) {
                return false;
            }
            reobserved.push(i);
            let obs = &mut observations[i].1;
            obs.cordoned_by_us = false;
            obs.gates_closed_by_us = false;
            obs.grant = UpgradeGrant::Absent;
            obs.externally_cordoned = matches!(outcome, UncordonOutcome::External { .. });
            true
        });
    }
}

/// `transitions` with `later` ones laid over, a node's later transition winning, in node order.
fn merge(transitions: &mut Vec<(usize, NodeTransition)>, later: Vec<(usize, NodeTransition)>) {
    let by_node: BTreeMap<_, _> = std::mem::take(transitions)
        .into_iter()
        .chain(later)
        .collect();
    *transitions = by_node.into_iter().collect();
}
