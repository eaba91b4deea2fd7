//! The controller's reconcile of our policy on the [`World`], as `runtime::reconcile` and
//! `runtime::reconcile::pass` run it, through the same pure entry points: the rolled-back target, the
//! selection and overlap ([`overlap`]), the DaemonSet's template hash ([`daemonset`]), each
//! node's observation ([`observe::observe`]), the [`Planner`] with its guards, the lifting of
//! cordons before the status write, the status ([`build_status`]), then the actions, and at the
//! end the drains kept and the nodes that left the selection released; and what the other
//! policy's reconcile decides for our nodes. This file is the one place the model is coupled
//! to the core's signatures.
//!
//! One reconcile here is one round of a pass: a reconcile that follows the fleet for several
//! rounds is, to the nodes, the same as several reconciles one after the other. Actions run at
//! once and in order (in the runtime some run in the background, which is one of the orders
//! here). What the model does not take from the core: a maintenance schedule's window is the
//! world's open/closed switch rather than a weekly calendar read at `now`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use ttdp_api::driver::v1alpha1::WindowState;
use ttdp_api::names::{annotations, labels};
use ttdp_api::{NodeState, TenstorrentDriverPolicy, TenstorrentDriverPolicySpec};
use ttdp_drain::UncordonOutcome;
use ttdp_kmd_types::KmdVersion;

use super::{ModelNode, OTHER, POLICY, POOL, World, writes};
use crate::pure::cached::{CachedNode, CachedPod};
use crate::pure::canary;
use crate::pure::daemonset::{daemonset_template_hash, desired_daemonset};
use crate::pure::node_record;
use crate::pure::observe::{self, ObserveInput};
use crate::pure::overlap::{self, OlderPolicies};
use crate::pure::pause::{self, AppliedTarget};
use crate::pure::rollout::{Planner, RolloutPlan};
use crate::pure::start_guard::guards_of;
use crate::pure::status::{BuiltStatus, NodeReport, PolicyFacts, build_status};
use crate::pure::transition::{
    self, Action, DrainProgress, NodeObservation, NodeTransition, RetryGate, UpgradeGrant, reasons,
};
use crate::settings::Settings;
use ttdp_api::node_record::NodeRecord;

/// Why a node is not Ready, as the node cache says it.
const NOT_READY: &str = "Ready=Unknown: NodeStatusUnknown: Kubelet stopped posting node status.";

/// The policy object of `name` with `spec`; ours was created before the other when it is
/// newer, after it when it is older.
pub(super) fn policy_object(
    name: &str,
    spec: TenstorrentDriverPolicySpec,
    created: i64,
) -> TenstorrentDriverPolicy {
    let mut p = TenstorrentDriverPolicy::new(name, spec);
    p.metadata.uid = Some(format!("uid-{name}"));
    p.metadata.generation = Some(1);
    p.metadata.creation_timestamp = Some(Time(
        Timestamp::from_second(1_700_000_000 + created).unwrap_or(Timestamp::UNIX_EPOCH),
    ));
    p
}

/// Every policy in the cluster: ours with `spec`, and the other (selecting the pool).
pub(super) fn policies(
    w: &World,
    spec: &TenstorrentDriverPolicySpec,
) -> Vec<Arc<TenstorrentDriverPolicy>> {
    let mut all = vec![Arc::new(policy_object(POLICY, spec.clone(), 10))];
    if let Some(other) = &w.other {
        let mut other_spec = spec.clone();
        other_spec.node_affinity = Some(
            serde_json::from_value(serde_json::json!(
                {"matchLabels": {POOL.0: POOL.1}}
            ))
            .unwrap_or_default(),
        );
        let created = if other.older { 0 } else { 20 };
        all.push(Arc::new(policy_object(OTHER, other_spec, created)));
    }
    all
}

/// A node as the node cache holds it.
pub(super) fn cached_node(n: &ModelNode) -> CachedNode {
    CachedNode {
        metadata: ObjectMeta {
            name: Some(n.name.clone()),
            labels: Some(n.labels.clone()),
            annotations: Some(n.annotations.clone()),
            ..ObjectMeta::default()
        },
        unschedulable: n.unschedulable,
        not_ready: n.not_ready.then(|| NOT_READY.to_owned()),
        deleted: false,
    }
}

/// The node's agent pods as the pod cache holds them.
pub(super) fn cached_pods(n: &ModelNode, now: Timestamp) -> Vec<Arc<CachedPod>> {
    let Some(pod) = &n.pod else {
        return Vec::new();
    };
    let meta = ObjectMeta {
        name: Some(format!("ttdrv-{POLICY}-{}", pod.uid)),
        namespace: Some("ttdp".into()),
        uid: Some(pod.uid.to_string()),
        labels: Some(BTreeMap::from([(labels::POLICY.into(), POLICY.into())])),
        annotations: Some(BTreeMap::from([(
            annotations::TEMPLATE_HASH.into(),
            pod.hash.clone(),
        )])),
        deletion_timestamp: pod.terminating.then_some(Time(now)),
        ..ObjectMeta::default()
    };
    vec![Arc::new(CachedPod {
        metadata: meta,
        node_name: Some(n.name.clone()),
        unschedulable: None,
        image: Some("agent".into()),
        ready: pod.ready,
        agent: None,
        report: pod.report.clone(),
    })]
}

/// The spec as acted on while paused (`runtime::reconcile::held_while_paused`), then while the
/// canary rolls back as if it asked for the version it rolls back to
/// (`runtime::reconcile::rolled_back`), and the version whose rollout the canary follows.
fn rolled_back(w: &World) -> (TenstorrentDriverPolicySpec, String) {
    let applied = w.daemonset.as_ref().map(|(_, version)| AppliedTarget {
        version: version.clone(),
        parameters: w
            .spec
            .module
            .as_ref()
            .map(|m| m.parameters.clone())
            .unwrap_or_default(),
        signing_secret: w.daemonset_signing.clone(),
    });
    let (mut spec, rollout_target) = pause::acted_on(&w.spec, applied, w.status.rollout.as_ref());
    let from = canary::rolling_back_to(w.status.rollout.as_ref(), &spec);
    if let Some(from) = from.filter(|f| f.parse::<KmdVersion>().is_ok()) {
        spec.version = from.to_owned();
    }
    (spec, rollout_target)
}

/// One pass in the making: what `runtime::reconcile::pass::Pass` holds.
struct ModelPass {
    target: KmdVersion,
    facts: PolicyFacts,
    /// The matched nodes' indexes in the world, in name order.
    matched: Vec<usize>,
    unmatched: Vec<usize>,
    observations: Vec<(String, NodeObservation)>,
    planned: Vec<(NodeState, Vec<Action>)>,
    /// The actions already taken per matched node (the lifted cordons).
    taken: Vec<Vec<Action>>,
    /// The matched nodes whose record was not written this round: not acted on.
    unrecorded: Vec<usize>,
    planner: Planner,
}

/// One reconcile of our policy.
pub(super) fn reconcile(w: &mut World) {
    let Some(mut pass) = observe_all(w) else {
        return;
    };
    let mut transitions = pass.plan(&[]);
    let lifting = pass.cordons_to_lift(w);
    let tried: Vec<String> = (lifting.iter())
        .map(|&k| w.nodes[pass.matched[k]].name.clone())
        .collect();
    // As `Pass::round`: the first part records everything planned while the lifts are on their
    // way; then each landed lift hands its slot on at once. The model lands the lifts in name
    // order.
    let mut lifts = lifting.into_iter();
    let mut first_part = true;
    loop {
        let next = if first_part { None } else { lifts.next() };
        let last = !first_part && next.is_none();
        if let Some(k) = next
            && pass.lift(w, k)
        {
            pass.hand_on_slots(&mut transitions);
        }
        if first_part || !transitions.is_empty() {
            if !pass.record(w, std::mem::take(&mut transitions), &tried) {
                // The lifts on their way land before the reconcile ends.
                lifts.for_each(|k| {
                    pass.lift(w, k);
                });
                return;
            }
            pass.act(w);
            first_part = false;
        }
        if last {
            break;
        }
    }
    for name in &tried {
        w.lifted_unrecorded.remove(name);
    }
    pass.finish(w);
}

/// Applies the DaemonSet and observes every matched node (`Pass::observe`).
fn observe_all(w: &mut World) -> Option<ModelPass> {
    w.spec.validate().ok()?;
    let (spec, rollout_target) = rolled_back(w);
    spec.validate().ok()?;
    let target: KmdVersion = spec.version.parse().ok()?;
    let all = policies(w, &spec);
    let ours = all[0].clone();
    let selection = overlap::selection_of(&ours, false)?;
    let older = OlderPolicies::of(&ours, &all, false);
    let cached: Vec<Arc<CachedNode>> = w.nodes.iter().map(|n| Arc::new(cached_node(n))).collect();
    let (matched, unmatched) = overlap::split_by_selection(cached, &selection);
    let conflicts = overlap::conflicts_of(&matched, &older);
    let mut selection = selection;
    selection.excluded = conflicts.keys().cloned().collect();
    apply_daemonset(w, &ours, &selection);
    let hash = w.daemonset.clone().map(|(h, _)| h).unwrap_or_default();
    let managed = matched.len().saturating_sub(conflicts.len());
    let plan = RolloutPlan::of(&spec, &target, managed, true).ok()?;
    let facts = PolicyFacts {
        generation: Some(1),
        target_version: rollout_target.clone(),
        paused: spec.paused,
        invalid_spec: None,
        max_unavailable: plan.max_unavailable,
        failure: None,
        canary_halt: None,
    };
    let mut guards = guards_of(
        &spec,
        &rollout_target,
        w.status.rollout.as_ref(),
        managed,
        w.now,
    );
    if w.setup.schedule {
        let hour = w.now + SignedDuration::from_hours(1);
        guards.window = Some(if w.window_open {
            WindowState::Open { closes: hour }
        } else {
            WindowState::Closed { opens: hour }
        });
    }
    let index = |n: &Arc<CachedNode>| w.nodes.iter().position(|m| m.name == n.name());
    let matched: Vec<usize> = matched.iter().filter_map(index).collect();
    let unmatched: Vec<usize> = unmatched.iter().filter_map(index).collect();
    let observations = matched
        .iter()
        .map(|&i| observe_node(w, i, &plan, &hash, conflicts.get(&w.nodes[i].name).cloned()))
        .collect();
    let held_outside = unmatched
        .iter()
        .filter(|&&i| {
            let was_ours = || w.entries.contains_key(w.nodes[i].name.as_str());
            observe::holds_ours(&cached_node(&w.nodes[i]).metadata, POLICY, was_ours)
        })
        .count();
    Some(ModelPass {
        taken: vec![Vec::new(); matched.len()],
        unrecorded: Vec::new(),
        planned: vec![(NodeState::Pending, Vec::new()); matched.len()],
        planner: Planner::new(plan)
            .with_guards(guards)
            .with_held_outside(held_outside),
        target,
        facts,
        matched,
        unmatched,
        observations,
    })
}

/// The DaemonSet's template and node affinity; a paused policy keeps the template it has
/// (`runtime::writes::agent_daemonset::ensure`).
fn apply_daemonset(
    w: &mut World,
    policy: &TenstorrentDriverPolicy,
    selection: &ttdp_api::node_selection::NodeSelection,
) {
    let settings = Settings::default();
    let Ok(desired) = desired_daemonset(policy, &settings, selection) else {
        return;
    };
    let hash = daemonset_template_hash(&desired)
        .unwrap_or_default()
        .to_owned();
    if !(policy.spec.paused && w.daemonset.is_some()) {
        w.daemonset = Some((hash, policy.spec.version.clone()));
        w.daemonset_signing = (policy.spec.module.as_ref())
            .and_then(|m| m.signing.as_ref())
            .map(|s| s.secret_name.clone());
    }
    w.daemonset_nodes = w
        .nodes
        .iter()
        .filter(|n| selection.matches(&n.name, &n.labels))
        .map(|n| n.name.clone())
        .collect();
}

/// Node `i`'s observation (`Pass::observe_node`).
fn observe_node(
    w: &World,
    i: usize,
    plan: &RolloutPlan,
    hash: &str,
    conflict_with: Option<String>,
) -> (String, NodeObservation) {
    let n = &w.nodes[i];
    let cached = cached_node(n);
    let pods = cached_pods(n, w.now);
    let settings = Settings::default();
    let entry = w.entries.get(n.name.as_str()).map(Arc::as_ref);
    let now = Time(w.now);
    let (retry, _) = observe::retry_gate(
        &cached.metadata,
        entry,
        &now,
        settings.retry_base,
        settings.retry_max,
    );
    let in_flight = entry.is_some_and(|r| {
        r.state.is_in_flight() || r.reason.as_deref() == Some(reasons::CORDONED_BY_OTHER)
    });
    let unschedulable = (in_flight || observe::cordoned_by(&cached.metadata, POLICY))
        .then_some(cached.unschedulable);
    let mut observation = observe::observe(ObserveInput {
        policy: POLICY,
        target_version: &plan.rules.target_version,
        target_parameters: &plan.rules.target_parameters,
        meta: &cached.metadata,
        unschedulable,
        pod: observe::pick_agent_pod(pods.iter().map(|p| p.as_ref())),
        current_hash: hash,
        recorded: entry,
        conflict_with,
        drain: w
            .drains
            .get(&n.name)
            .cloned()
            .unwrap_or(DrainProgress::NotStarted),
        retry,
        node_not_ready: cached.not_ready.as_deref(),
        not_created: None,
        now: &now,
    });
    observation.lifted_unrecorded =
        observation.recorded == Some(NodeState::Upgrading) && w.lifted_unrecorded.contains(&n.name);
    observation.cordoned_by_us |= observation.lifted_unrecorded;
    (n.name.clone(), observation)
}

impl ModelPass {
    /// Plans the nodes in `dirty` (`Pass::plan_nodes`) and keeps their actions.
    fn plan(&mut self, dirty: &[usize]) -> Vec<(usize, NodeTransition)> {
        let mut transitions = self.planner.plan(&mut self.observations, dirty);
        for (i, t) in &mut transitions {
            self.planned[*i] = (t.state, std::mem::take(&mut t.actions));
        }
        transitions
    }

    /// The nodes whose only action is a release, noted as lifted before their Uncordoning is
    /// recorded (`Pass::cordons_to_lift`).
    fn cordons_to_lift(&mut self, w: &mut World) -> Vec<usize> {
        let lifting: Vec<usize> = (0..self.planned.len())
            .filter(|&k| {
                let (state, actions) = &self.planned[k];
                *state == NodeState::Uncordoning && actions.as_slice() == [Action::Release]
            })
            .collect();
        for &k in &lifting {
            w.lifted_unrecorded
                .insert(w.nodes[self.matched[k]].name.clone());
            self.taken[k].push(Action::Release);
        }
        lifting
    }

    /// Lifts node `k`'s cordon with its Uncordoning record; true when it was lifted, with the
    /// node's observation saying so.
    fn lift(&mut self, w: &mut World, k: usize) -> bool {
        let node = &mut w.nodes[self.matched[k]];
        // The lift writes the node's Uncordoning record (`Pass::uncordoning_record`).
        let record = w.entries.get(node.name.as_str()).and_then(|e| {
            let mut e = e.as_ref().clone();
            e.state = NodeState::Uncordoning;
            e.last_transition_time = Some(Time(w.now));
            (e.reason, e.message) = (None, None);
            node_record::desired(POLICY, &self.facts.target_version, &e)
        });
        let Ok(outcome) = writes::release(node, POLICY) else {
            return false;
        };
        writes::put_record(node, record.as_ref());
        let name = node.name.clone();
        w.drains.remove(&name);
        if let Some(r) = &record {
            note_failures(w, &name, r);
        }
        let obs = &mut self.observations[k].1;
        obs.cordoned_by_us = false;
        obs.gates_closed_by_us = false;
        obs.grant = UpgradeGrant::Absent;
        obs.externally_cordoned = matches!(outcome, UncordonOutcome::External { .. });
        true
    }

    /// Hands out again the slots the landed lifts freed (`Pass::hand_on_slots`).
    fn hand_on_slots(&mut self, transitions: &mut Vec<(usize, NodeTransition)>) {
        let again = self.plan(&[]);
        let by_node: BTreeMap<_, _> = std::mem::take(transitions)
            .into_iter()
            .chain(again)
            .collect();
        *transitions = by_node.into_iter().collect();
    }

    /// Builds the status, writes the nodes' records, then hands the status over
    /// (`Pass::build`, `status_writer::decide`); false when a write that must land before the
    /// actions failed (the round ends there).
    fn record(
        &mut self,
        w: &mut World,
        transitions: Vec<(usize, NodeTransition)>,
        lifted: &[String],
    ) -> bool {
        let reports: Vec<NodeReport> = transitions
            .into_iter()
            .map(|(k, t)| {
                let (name, obs) = &self.observations[k];
                NodeReport {
                    current_version: obs.loaded_version.clone(),
                    loaded_parameters: None,
                    source_commit: None,
                    udev_rule: None,
                    next_kernels: None,
                    module_signer: None,
                    start_load: None,
                    install_mode: observe::install_mode_label(
                        &cached_node(&w.nodes[self.matched[k]]).metadata,
                    ),
                    name: name.clone(),
                    transition: t,
                }
            })
            .collect();
        self.facts.canary_halt = self.planner.verdict().and_then(|v| v.halt());
        let now = Time(w.now);
        let mut built = build_status(&self.facts, &w.status, &w.entries, reports, &now);
        built.status.rollout = self.planner.guards().rollout_status(self.planner.verdict());
        self.unrecorded = self.write_records(w, &built, lifted);
        // The status is a view written after the records, without holding up the actions
        // (`status_view`); only a changed rollout state is written before acting on it.
        let written = !std::mem::take(&mut w.fail_next_status_write);
        if built.status.rollout != w.status.rollout && !written {
            return false;
        }
        w.status = built.status;
        w.entries = built.all_nodes;
        if written {
            w.view = (w.status.clone(), w.entries.clone());
        }
        true
    }

    /// Writes the upgrade records of the nodes whose entry changed or that have actions
    /// (`Pass::record_patches`, each written by its node's task before its actions); returns the
    /// nodes whose record was not written (not acted on). The runtime hands the status over
    /// while the records are on their way: the view may run ahead of a record, as it does here
    /// where one could not be written.
    fn write_records(&self, w: &mut World, built: &BuiltStatus, lifted: &[String]) -> Vec<usize> {
        let mut unwritten = Vec::new();
        let target = self.facts.target_version.clone();
        // Each reconcile here is a pass's first round, which looks at every node's record.
        for k in 0..self.matched.len() {
            let node = &mut w.nodes[self.matched[k]];
            // A cordon or a grant carries the record; a lifted cordon took it with it.
            if rides_along(&self.todo(k)) || lifted.contains(&node.name) {
                continue;
            }
            let Some(entry) = built.all_nodes.get(node.name.as_str()) else {
                continue;
            };
            let want = node_record::desired(POLICY, &target, entry);
            let meta = cached_node(node).metadata;
            let on_node = match node_record::patch(&meta, POLICY, want.as_ref()) {
                Some(patch) => writes::record(node, &patch).is_ok(),
                None => true,
            };
            if !on_node {
                unwritten.push(k);
            } else {
                let name = node.name.clone();
                match want {
                    Some(r) => note_failures(w, &name, &r),
                    None => {
                        w.decided_failures.remove(&name);
                    }
                }
            }
        }
        unwritten
    }

    /// Carries out each node's actions not taken yet, in order (`Pass::start_work`); a failed
    /// write does not stop the node's next action.
    /// Node `k`'s actions not taken yet.
    fn todo(&self, k: usize) -> Vec<Action> {
        (self.planned[k].1.iter())
            .filter(|a| !self.taken[k].contains(a))
            .copied()
            .collect()
    }

    fn act(&mut self, w: &mut World) {
        for k in 0..self.planned.len() {
            let todo = self.todo(k);
            // Taken once started, as `Pass::start_work` notes them: a later part of the round
            // does not start them again, even where the record before them failed.
            self.taken[k].extend(todo.iter().copied());
            if self.unrecorded.contains(&k) {
                continue;
            }
            let i = self.matched[k];
            let pods = cached_pods(&w.nodes[i], w.now);
            let replace = observe::agent_to_replace(&todo, &self.observations[k].1.agent, &pods);
            let entry = w.entries.get(w.nodes[i].name.as_str()).cloned();
            let record = entry
                .filter(|_| rides_along(&todo))
                .and_then(|e| node_record::desired(POLICY, &self.facts.target_version, &e));
            for action in todo {
                self.act_on(w, i, action, replace.as_ref(), record.as_ref());
            }
        }
    }

    fn act_on(
        &self,
        w: &mut World,
        i: usize,
        action: Action,
        replace: Option<&CachedPod>,
        record: Option<&NodeRecord>,
    ) {
        let node = &mut w.nodes[i];
        let carried = |w: &mut World, ok: bool| {
            if let Some(r) = record.filter(|_| ok) {
                note_failures(w, &w.nodes[i].name.clone(), r);
            }
        };
        // A refused write fails the reconcile, which backs off; nothing else follows from it.
        let _ = match action {
            Action::Cordon => {
                let ok = writes::cordon(node, POLICY, record).is_ok();
                carried(w, ok);
                Ok(())
            }
            Action::Grant => {
                let ok = writes::grant(node, POLICY, self.target.as_str(), record).is_ok();
                carried(w, ok);
                Ok(())
            }
            Action::Release => writes::release(node, POLICY).map(|_| {
                w.drains.remove(&node.name);
            }),
            Action::ClearRetry => writes::clear_retry(node),
            Action::Drain => {
                let running = DrainProgress::Running {
                    message: "draining".into(),
                };
                w.drains.entry(node.name.clone()).or_insert(running);
                Ok(())
            }
            Action::ReplaceAgent { .. } => {
                let uid = replace.and_then(|p| p.metadata.uid.clone());
                if let Some(pod) = node.pod.as_mut()
                    && uid == Some(pod.uid.to_string())
                {
                    pod.terminating = true;
                }
                Ok(())
            }
        };
    }

    /// Keeps the drains still needed and releases the nodes that left the selection
    /// (`Pass::finish`, `act::release_unmatched`).
    fn finish(&self, w: &mut World) {
        let keep: Vec<&str> = (self.observations.iter().zip(&self.planned))
            .filter(|(_, (s, _))| matches!(s, NodeState::Draining | NodeState::Upgrading))
            .map(|((n, _), _)| n.as_str())
            .collect();
        w.drains.retain(|n, _| keep.contains(&n.as_str()));
        for &i in &self.unmatched {
            let meta = cached_node(&w.nodes[i]).metadata;
            let was_ours = || w.entries.contains_key(w.nodes[i].name.as_str());
            let recorded = node_record::current(&meta, POLICY).is_some();
            if (recorded || observe::holds_ours(&meta, POLICY, was_ours))
                && writes::let_go(&mut w.nodes[i], POLICY).is_ok()
            {
                w.decided_failures.remove(&w.nodes[i].name);
            }
        }
    }
}

/// Notes the failures `record` (now on the node) carries, for the restart invariant.
fn note_failures(w: &mut World, node: &str, record: &NodeRecord) {
    let k = record.attempts.unwrap_or(0);
    if k > 0 {
        let failed = record.state == NodeState::Failed;
        w.decided_failures.insert(node.to_owned(), (k, failed));
    } else {
        w.decided_failures.remove(node);
    }
}

/// Whether `todo` writes the node's record itself (`pass::record::rides_along`).
fn rides_along(todo: &[Action]) -> bool {
    todo.iter()
        .any(|a| matches!(a, Action::Cordon | Action::Grant))
}

/// The policy owning node `i`, by the core's overlap rules (None: no policy selects it).
pub(super) fn owner_of(w: &World, i: usize) -> Option<String> {
    let all = policies(w, &w.spec);
    let node = Arc::new(cached_node(&w.nodes[i]));
    let mut owner = None;
    for p in &all {
        let selection = overlap::selection_of(p, false)?;
        if !selection.matches(node.name(), &w.nodes[i].labels) {
            continue;
        }
        let older = OlderPolicies::of(p, &all, false);
        if overlap::conflicts_of(std::slice::from_ref(&node), &older).is_empty() {
            owner = p.metadata.name.clone();
        }
    }
    owner
}

/// Whether the other policy selects node `i`.
pub(super) fn other_selects(w: &World, i: usize) -> bool {
    let all = policies(w, &w.spec);
    let n = &w.nodes[i];
    all.get(1)
        .and_then(|p| overlap::selection_of(p, false))
        .is_some_and(|s| s.matches(&n.name, &n.labels))
}

/// Whether the other policy, seeing node `i` as its Conflict (our policy owns it), releases
/// it: what `transition::next` decides for it there.
pub(super) fn other_releases_conflict(w: &World, i: usize) -> bool {
    let all = policies(w, &w.spec);
    let Some(plan) = (all.get(1))
        .and_then(|p| Some((p, p.spec.version.parse::<KmdVersion>().ok()?)))
        .and_then(|(p, target)| RolloutPlan::of(&p.spec, &target, w.nodes.len(), true).ok())
    else {
        return false;
    };
    let n = cached_node(&w.nodes[i]);
    let now = Time(w.now);
    let obs = observe::observe(ObserveInput {
        policy: OTHER,
        target_version: &plan.rules.target_version,
        target_parameters: "",
        meta: &n.metadata,
        unschedulable: Some(n.unschedulable),
        pod: None,
        current_hash: "",
        recorded: None,
        conflict_with: Some(POLICY.to_owned()),
        drain: DrainProgress::NotStarted,
        retry: RetryGate::NotYet,
        node_not_ready: None,
        not_created: None,
        now: &now,
    });
    let t = transition::next(&obs, &plan.rules);
    t.actions.contains(&Action::Release)
}

/// Whether the other policy holds something on node `i` by `observe::holds_ours` (its status
/// lists every node it selects, so the gates count as its own there).
pub(super) fn other_holds(w: &World, i: usize) -> bool {
    let selected = other_selects(w, i);
    observe::holds_ours(&cached_node(&w.nodes[i]).metadata, OTHER, || selected)
}
