//! What a round records: the status entries it builds from the planned nodes, the nodes'
//! upgrade records brought to them, the canary's verdict and the state changes reported.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{info, warn};

use super::Pass;
use crate::pure::next_kernels;
use crate::pure::node_record;
use crate::pure::observe;
use crate::pure::status::{BuiltStatus, NodeReport, StateChange, build_status, update_status};
use crate::pure::transition::Action;
use crate::pure::transition::{NodeTransition, reasons};
use crate::runtime::reconcile::follow;
use ttdp_api::NodeState;
use ttdp_api::node_record::NodeRecord;

/// What one round planned and recorded, for following the fleet after it.
pub(super) struct Planned {
    pub built: BuiltStatus,
    /// The matched nodes whose entry changed.
    pub changed_entries: Vec<usize>,
    pub changes: Vec<StateChange>,
}

impl Pass {
    /// Builds the status entries of the planned nodes.
    pub(super) fn build(&mut self, transitions: Vec<(usize, NodeTransition)>) -> Planned {
        let reports: Vec<NodeReport> = transitions
            .into_iter()
            .map(|(i, t)| {
                let (node, obs) = &self.observations[i];
                let pod = observe::pick_agent_pod(self.agent_pods[i].iter().map(|p| p.as_ref()));
                NodeReport {
                    current_version: obs.loaded_version.clone(),
                    loaded_parameters: observe::loaded_parameters(pod),
                    source_commit: observe::loaded_commit(pod),
                    udev_rule: observe::udev_rule(pod),
                    next_kernels: observe::next_kernels(pod),
                    module_signer: observe::module_signer(pod),
                    start_load: observe::start_load(pod),
                    install_mode: observe::install_mode_label(&self.matched[i].metadata),
                    name: node.clone(),
                    transition: t,
                }
            })
            .collect();
        self.note_canary();
        let (facts, last) = (&self.facts, &self.recorded);
        let mut built = if std::mem::take(&mut self.first_round) {
            build_status(facts, &last.status, &last.nodes, reports, &self.now)
        } else {
            update_status(facts, &last.status, &last.nodes, reports, &self.now)
        };
        self.note_agent_reports(&built);
        let changed_entries = built
            .changed
            .iter()
            .filter_map(|name| follow::position(&self.matched, name))
            .collect();
        built.status.rollout = self.planner.guards().rollout_status(self.planner.verdict());
        Planned {
            changes: std::mem::take(&mut built.changes),
            built,
            changed_entries,
        }
    }

    /// Brings the metrics of what the agents report up to the entries of `built`: observes
    /// the start loads the recorded entries did not have (so each start counts once however
    /// often its entry is rebuilt), and counts the nodes with a kernel not ready again when a
    /// node's kernels changed (a pass follows the fleet for minutes between its gauge updates).
    fn note_agent_reports(&self, built: &BuiltStatus) {
        let mut kernels_changed = false;
        for name in &built.changed {
            let Some(entry) = built.all_nodes.get(name) else {
                continue;
            };
            let before = self.recorded.nodes.get(name).map(|e| &**e);
            if let Some(load) = next_kernels::new_start_load(before, entry) {
                self.ctx.metrics.observe_start_load(load);
            }
            kernels_changed |= before.map(|b| &b.next_kernels) != Some(&entry.next_kernels);
        }
        if kernels_changed {
            (self.ctx.metrics).set_kernels_not_ready(&self.name, &built.all_nodes);
        }
    }

    /// The node patches (by index) that bring the upgrade records of the nodes whose entry
    /// changed, that have actions to take or were `deferred` (in a pass's `whole` first round:
    /// of every node) to their new entries; but for the nodes whose record rides on a cordon or
    /// a grant they are about to take, or that a cordon `lifted` this round carries.
    ///
    /// A node carries the record the last round decided (written by then, or the pass has
    /// ended); in the first round, and for a node whose work was deferred, the node's copy in
    /// the cache says what it carries (a process killed after its status said Done, before the
    /// node's record was removed, left that record for the next one to remove), unless a task
    /// of this pass wrote the node's record ([`Pass::written_by_task`]).
    pub(super) fn record_patches(
        &self,
        planned: &Planned,
        lifted: &[String],
        whole: bool,
        deferred: &BTreeSet<usize>,
    ) -> BTreeMap<usize, serde_json::Value> {
        let with_actions = (self.planned.iter().enumerate())
            .filter(|(_, (_, actions))| !actions.is_empty())
            .map(|(i, _)| i);
        let every = whole.then_some(0..self.matched.len()).into_iter().flatten();
        let nodes: BTreeSet<usize> = (planned.changed_entries.iter().copied())
            .chain(with_actions)
            .chain(deferred.iter().copied())
            .chain(every)
            .collect();
        let target = self.facts.target_version.as_str();
        nodes
            .into_iter()
            .filter_map(|i| {
                let n = &self.matched[i];
                let (state, actions) = &self.planned[i];
                let todo = self.not_taken(n.name(), actions);
                // A lift carries the Uncordoning record; a lifted node that went on from there
                // (to Done, later in the round) needs its record brought along as any other.
                let lift_carries =
                    *state == NodeState::Uncordoning && lifted.iter().any(|l| l == n.name());
                if rides_along(&todo) || lift_carries {
                    return None;
                }
                let entry = planned.built.all_nodes.get(n.name())?;
                let want = node_record::desired(&self.name, target, entry);
                let patch = if let Some(written) = self.written_by_task(i, deferred) {
                    node_record::patch_from(written, want.as_ref())
                } else if whole || deferred.contains(&i) {
                    node_record::patch(&n.metadata, &self.name, want.as_ref())
                } else {
                    let decided = (self.recorded.nodes.get(n.name()))
                        .and_then(|e| node_record::desired(&self.name, target, e));
                    node_record::patch_from(decided.as_ref(), want.as_ref())
                };
                Some((i, patch?))
            })
            .collect()
    }

    /// For a `deferred` node, the record its last task of this pass wrote, if it wrote one:
    /// that task has just ended, and the cache may not show its write yet (compared with the
    /// cache, a record the node already left would stay on it).
    fn written_by_task(&self, i: usize, deferred: &BTreeSet<usize>) -> Option<Option<&NodeRecord>> {
        if !deferred.contains(&i) {
            return None;
        }
        let written = self.written.get(self.matched[i].name())?;
        Some(written.as_ref())
    }

    /// Those of `actions` not taken yet on `node` in its current state.
    pub(super) fn not_taken(&self, node: &str, actions: &[Action]) -> Vec<Action> {
        let taken = self.actions_taken.get(node);
        (actions.iter())
            .filter(|a| taken.is_none_or(|t| !t.contains(a)))
            .copied()
            .collect()
    }

    /// The record of `node` entering Uncordoning now, which its lifted cordon writes.
    pub(super) fn uncordoning_record(&self, node: &str) -> Option<NodeRecord> {
        let mut entry = self.recorded.nodes.get(node)?.as_ref().clone();
        entry.state = NodeState::Uncordoning;
        entry.last_transition_time = Some(self.now.clone());
        (entry.reason, entry.message) = (None, None);
        node_record::desired(&self.name, &self.facts.target_version, &entry)
    }

    /// The upgrade record `node` carries after this round's status.
    pub(super) fn record_of(&self, node: &str) -> Option<NodeRecord> {
        let entry = self.recorded.nodes.get(node)?;
        node_record::desired(&self.name, &self.facts.target_version, entry)
    }

    /// Puts the canary's halt into the conditions' facts and, the first time, announces it.
    fn note_canary(&mut self) {
        let Some(verdict) = self.planner.verdict() else {
            return;
        };
        self.facts.canary_halt = verdict.halt();
        if let Some(note) = verdict.halt_news()
            && !self.halt_reported
        {
            self.halt_reported = true;
            warn!(policy = %self.name, %note, "rollout halted by its canary");
            self.ctx
                .events
                .policy_event(&self.policy, true, reasons::ROLLOUT_HALTED, note);
        }
    }

    pub(super) fn report(&self, changes: &[StateChange]) {
        for c in changes {
            info!(node = %c.node, from = ?c.from, to = %c.to, reason = ?c.reason, message = ?c.message, "node state changed");
        }
        self.ctx.events.nodes_changed(&self.policy, changes);
        self.ctx.metrics.record_changes(&self.name, changes);
    }
}

/// Whether `todo` writes the node's record itself: a cordon or a grant carries it.
pub(super) fn rides_along(todo: &[Action]) -> bool {
    todo.iter()
        .any(|a| matches!(a, Action::Cordon | Action::Grant))
}
