//! One reconcile of one policy as a value that owns what it knows. [`Pass::observe`] reads the
//! caches and observes every matched node; each [`Pass::round`] plans, records and acts, then
//! follows the fleet: it waits for the next change and observes again only the nodes whose
//! node, agent pods, drain or entry changed, so an agent's Ready or a finished drain is acted
//! on in the next round, not in a new reconcile that observes the whole fleet.
//! [`Pass::finish`] releases the nodes that left the selection and says when to look again.
//!
//! The new state is recorded before the action, so a crash in between repeats the action on the
//! next reconcile instead of skipping it: on each node it changed for (its upgrade record, see
//! [`crate::pure::node_record`], riding on the cordon or the grant where the step takes one, else
//! written by the node's task before its actions), and handed to the policy's status writer, a
//! view written later. No round waits for a node's writes but the lifts of cordons: lifting a
//! cordon, harmless to repeat, runs first and writes the node's Uncordoning record in the same
//! patch, so that the slot it frees goes to the next node in the same round, as soon as that
//! lift lands: a hand-off is two node patches, the lift and the next node's cordon. While lifts
//! are on their way the round takes up the nodes that change, so an agent turning Ready does
//! not wait for another node's lift ([`lifts`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action as Requeue;
use ttdp_api::driver::v1alpha1::RolloutStatus;
use ttdp_api::node_record::NodeRecord;
use ttdp_api::node_selection::NodeSelection;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};
use ttdp_drain::UncordonOutcome;
use ttdp_kmd_types::KmdVersion;

use crate::error::Error;
use crate::pure::agent_blocker::Blocker;
use crate::pure::builder_images;
use crate::pure::cached::{CachedNode, CachedPod};
use crate::pure::observe::{self, ObserveInput};
use crate::pure::overlap::{self, OlderPolicies, selection_of};
use crate::pure::rollout::Planner;
use crate::pure::start_guard::guards_of;
use crate::pure::status::{PolicyFacts, StateChange};
use crate::pure::transition::{Action, DrainProgress, NodeObservation, NodeTransition, reasons};
use crate::pure::{drain_plan, node_record};
use crate::runtime::node_work::act::{self, NodeWork};
use crate::runtime::node_work::node_actions::RecordOnRelease;
use crate::runtime::process::context::Context;
use crate::runtime::process::watch_changes::ChangeSubscription;
use crate::runtime::reconcile::follow::{self, PolicyKey};
use crate::runtime::writes::status_writer::{self, RecordedStatus};

mod following;
mod lifts;
mod record;

use record::{Planned, rides_along};

/// How long one reconcile follows the fleet, round after round and waiting for changes between
/// them, before it ends and the next one observes everything again: a safety net, since a
/// change of the spec, of the selection or of the set of nodes, or a watch listing again, ends
/// it at once.
pub const FOLLOW_FOR: Duration = Duration::from_secs(120);
/// Requeue while nodes are in flight (a safety net; watches drive progress).
const IN_FLIGHT_RESYNC: Duration = Duration::from_secs(30);
/// Look again once a managed node's agent pod has been missing this long (to read the
/// DaemonSet's Events again).
const MISSING_AGENT_RESYNC: Duration = Duration::from_secs(5);
/// Requeue when nothing is happening.
const IDLE_RESYNC: Duration = Duration::from_secs(300);

/// What the reconcile decided from when it started; a change to any of it ends the following.
struct Basis {
    selection: NodeSelection,
    older: OlderPolicies,
    /// The matched nodes an older policy owns, with that policy.
    conflicts: BTreeMap<String, String>,
    policies: Vec<PolicyKey>,
    /// The agent DaemonSet's template hash.
    template_hash: String,
    /// Why the DaemonSet cannot create agent pods, when it says so.
    not_created: Option<Blocker>,
}

/// One reconcile of one policy.
pub struct Pass {
    ctx: Arc<Context>,
    policy: Arc<TenstorrentDriverPolicy>,
    name: String,
    basis: Basis,
    watched: ChangeSubscription,
    facts: PolicyFacts,
    /// The matched nodes in name order; their agent pods, observations and planned steps are at
    /// the same index.
    matched: Vec<Arc<CachedNode>>,
    unmatched: Vec<Arc<CachedNode>>,
    /// Some of `unmatched` carry something of ours (see [`Pass::finish`]).
    to_release: bool,
    /// The pass ended for something the next one must take up at once.
    again_now: bool,
    /// `status.rollout` when the pass began: a rollback, a halt, a soak's start are taken up
    /// by the next pass, which begins from them.
    rollout_at_start: Option<RolloutStatus>,
    agent_pods: Vec<Vec<Arc<CachedPod>>>,
    observations: Vec<(String, NodeObservation)>,
    planned: Vec<(NodeState, Vec<Action>)>,
    planner: Planner,
    /// The nodes observed again since the last round (the first round plans every node).
    reobserved: Vec<usize>,
    first_round: bool,
    /// The nodes with work left undone because a task of theirs was still running: taken up
    /// again when it ends.
    deferred: BTreeSet<usize>,
    /// Actions already taken per node in its current state (a later round does not repeat them).
    actions_taken: HashMap<String, Vec<Action>>,
    /// The record each node's last task of this pass writes (None: it removes the record).
    written: HashMap<String, Option<NodeRecord>>,
    /// Nodes whose cordon this reconcile lifted, with the node as the cache showed it then: until
    /// the cache shows the change, the observation says what the lifting did.
    uncordoned: HashMap<String, (Arc<CachedNode>, UncordonOutcome)>,
    recorded: Arc<RecordedStatus>,
    now: Time,
    /// How long until the soonest retry gate opens, wait on the device's holders times out or
    /// a node reaches its step's deadline.
    next_retry: Option<Duration>,
    first_error: Option<Error>,
    /// When this pass began, after its `policy` was read.
    following_since: Instant,
    /// The matched nodes without an agent pod, with when this pass first saw them so.
    agents_missing_since: HashMap<String, Instant>,
    /// The canary's halt was announced (an Event) in this pass.
    halt_reported: bool,
}

/// Whether a node that left the selection carries an upgrade record of `policy`, or a write of
/// ours to it is on the way: it is released (once that write has landed) when the pass ends,
/// which is then after its first round.
fn leaving_with_ours(ctx: &Context, policy: &str, unmatched: &[Arc<CachedNode>]) -> bool {
    node_record::any_on(unmatched, policy)
        || unmatched
            .iter()
            .any(|n| ctx.node_tasks.busy(policy, n.name()))
}

impl Pass {
    /// Applies the DaemonSet and observes every matched node (None: the policy selects none).
    pub async fn observe(
        policy: Arc<TenstorrentDriverPolicy>,
        ctx: Arc<Context>,
        recorded: Arc<RecordedStatus>,
        target: KmdVersion,
        rollout_target: &str,
    ) -> Result<Option<Self>, Error> {
        let require_nfd = ctx.settings.require_nfd;
        let Some(selection) = selection_of(&policy, require_nfd) else {
            return Ok(None);
        };
        let name = policy.name_any();
        let all_policies = ctx.caches.policies.state();
        let older = OlderPolicies::of(&policy, &all_policies, require_nfd);
        // Subscribed before the caches are read: no change after the read goes unrecorded.
        let watched = ctx.caches.changes.subscribe();
        let (matched, unmatched) =
            overlap::split_by_selection(ctx.caches.nodes.state(), &selection);
        let conflicts = overlap::conflicts_of(&matched, &older);
        let mut selection = selection;
        selection.excluded = conflicts.keys().cloned().collect();
        let daemonset = ctx.agent_daemonset(&name);
        let template_hash = daemonset.ensure(&policy, &selection).await?;
        let agent_pods = follow::agent_pods_by_node(ctx.caches.agent_pods.state(), &name, &matched);
        let not_created = daemonset.blocker(&matched, &agent_pods, &conflicts).await;
        let managed = matched.len().saturating_sub(conflicts.len());
        let (facts, plan) = ctx.plan_of(&policy, &target, managed)?;
        let now = Timestamp::now();
        let guards = guards_of(
            &policy.spec,
            rollout_target,
            recorded.status.rollout.as_ref(),
            managed,
            now,
        );
        let basis = Basis {
            selection,
            older,
            conflicts,
            policies: follow::policy_keys_as_held(&all_policies, &policy),
            template_hash,
            not_created,
        };
        let outside = observe::held_outside(&unmatched, &name, |n| recorded.nodes.contains_key(n));
        let to_release = outside > 0 || leaving_with_ours(&ctx, &name, &unmatched);
        let mut pass = Self {
            planner: Planner::new(plan)
                .with_guards(guards)
                .with_held_outside(outside),
            planned: vec![(NodeState::Pending, Vec::new()); matched.len()],
            observations: Vec::with_capacity(matched.len()),
            ctx,
            policy,
            name,
            basis,
            watched,
            facts,
            matched,
            unmatched,
            to_release,
            again_now: false,
            rollout_at_start: recorded.status.rollout.clone(),
            agent_pods,
            reobserved: Vec::new(),
            first_round: true,
            deferred: BTreeSet::new(),
            actions_taken: HashMap::new(),
            written: HashMap::new(),
            uncordoned: HashMap::new(),
            recorded,
            now: Time(now),
            next_retry: None,
            first_error: None,
            halt_reported: false,
            following_since: Instant::now(),
            agents_missing_since: HashMap::new(),
        };
        pass.observe_all();
        Ok(Some(pass))
    }

    /// Observes every matched node.
    fn observe_all(&mut self) {
        let mut drains = self.ctx.drains.progress_of(&self.name);
        for i in 0..self.matched.len() {
            let drain = drains.remove(self.matched[i].name());
            let observation = self.observe_node(i, drain);
            self.observations.push(observation);
        }
    }

    /// Plans, records the status and acts; then follows the fleet. Returns whether to go on with
    /// another round.
    pub async fn round(&mut self) -> Result<bool, Error> {
        let began = Instant::now();
        let mut deferred = std::mem::take(&mut self.deferred);
        let mut transitions = self.plan_nodes();
        let mut lifts = act::LiftsInFlight::new();
        let mut lifted = Vec::new();
        self.send_lifts(&mut lifts, &mut lifted);
        let (mut changes, mut changed_entries, mut released) = (Vec::new(), Vec::new(), 0);
        // The first part records and starts all else planned while the lifts are on their way;
        // each freed slot goes on as soon as its lift lands. Nodes changing meanwhile (an agent
        // turning Ready) are taken up at once, not after even one lift's round trip.
        let (mut first_part, mut following) = (true, true);
        loop {
            let landed = if first_part {
                Vec::new()
            } else if !following {
                act::landed(&mut lifts).await
            } else {
                match self.landed_or_changed(&mut lifts).await {
                    Some(landed) => landed,
                    None => {
                        following = self.take_up_changes(&mut transitions, &mut deferred);
                        self.send_lifts(&mut lifts, &mut lifted);
                        vec![]
                    }
                }
            };
            let done = landed.is_empty() && lifts.is_empty();
            let freed = self.take_outcomes(landed);
            if freed > 0 {
                released += freed;
                self.hand_on_slots(&mut transitions);
            }
            if first_part || !transitions.is_empty() {
                let part = std::mem::take(&mut transitions);
                match self.record_and_act(part, &lifted, &deferred).await {
                    Ok((c, e)) => (changes.extend(c), changed_entries.extend(e)),
                    Err(e) => {
                        // The lifts on their way land before the pass ends, as before a failure.
                        while !act::landed(&mut lifts).await.is_empty() {}
                        return Err(e);
                    }
                };
                (first_part, deferred) = (false, BTreeSet::new());
            }
            if done {
                break;
            }
        }
        self.ctx.note_lifted(&self.name, &lifted, false);
        tracing::debug!(
            changes = changes.len(),
            lifted = lifted.len(),
            round_ms = began.elapsed().as_millis(),
            "round"
        );
        self.report(&changes);
        if !changes.is_empty() {
            let recorded = &self.recorded;
            self.ctx
                .metrics
                .set_policy(&self.name, &recorded.status, &recorded.nodes);
        }
        let retry_due = self
            .next_retry
            .is_some_and(|w| self.following_since.elapsed() >= w);
        // The canary's and the soak's times count from the rollout's state and the clock this
        // pass started with: a new state of the rollout is taken up by a new pass.
        let rollout_moved = self.recorded.status.rollout != self.rollout_at_start;
        // Ended for what the next pass must take up at once: it reconciles right after. So
        // does a change taken up during the lifts that this pass cannot follow node by node.
        self.again_now = self.to_release
            || rollout_moved
            || !following
            || self.following_since.elapsed() >= FOLLOW_FOR;
        if self.again_now || self.first_error.is_some() || retry_due {
            return Ok(false);
        }
        Ok(self.follow(changed_entries, released).await)
    }

    /// Builds the status entries of `transitions`, hands the status to the writer and starts
    /// the nodes' work: the records first where the rollout's state must be written before
    /// acting on it, else the work first (the status writer waits for the records it carries).
    async fn record_and_act(
        &mut self,
        transitions: Vec<(usize, NodeTransition)>,
        lifted: &[String],
        deferred: &BTreeSet<usize>,
    ) -> Result<(Vec<StateChange>, Vec<usize>), Error> {
        let whole = self.first_round;
        let planned = self.build(transitions);
        let records = self.record_patches(&planned, lifted, whole, deferred);
        let Planned {
            built,
            changes,
            changed_entries,
        } = planned;
        let decided = status_writer::decide(&self.policy, built, &self.recorded, false);
        self.recorded = decided.recorded();
        let ctx = self.ctx.clone();
        let (views, client) = (&ctx.status_views, &ctx.client);
        if decided.write_first() {
            // The rollout's state, which reconciles read back before acting, is written first.
            decided.hand_over(views, client).await?;
            self.start_work(records);
        } else {
            self.start_work(records);
            decided.hand_over(views, client).await?;
        }
        Ok((changes, changed_entries))
    }
    /// Whether every action so far went through.
    pub fn went_through(&self) -> bool {
        self.first_error.is_none()
    }

    /// The reconcile failure shown before this pass is over: the rounds to come say so.
    pub fn forget_failure(&mut self) {
        self.facts.failure = None;
    }

    /// Keeps the drains still needed, releases the nodes that left the selection, and says when
    /// to reconcile again.
    pub async fn finish(mut self) -> Result<Requeue, Error> {
        let recorded = &self.recorded;
        self.ctx
            .metrics
            .set_policy(&self.name, &recorded.status, &recorded.nodes);
        // Kept through Upgrading: the pods a drain skipped name the device's holders there.
        let keep_drain: HashSet<&str> = self
            .observations
            .iter()
            .zip(&self.planned)
            .filter(|(_, (state, _))| matches!(state, NodeState::Draining | NodeState::Upgrading))
            .map(|((n, _), _)| n.as_str())
            .collect();
        self.ctx
            .drains
            .retain(&self.name, |n| keep_drain.contains(n));
        let released =
            act::release_unmatched(&self.ctx, &self.name, &self.unmatched, &self.recorded);
        if let Err(e) = released.await {
            self.first_error.get_or_insert(e);
        }
        if let Some(e) = self.first_error.take() {
            return Err(e);
        }
        let after = if self.again_now {
            Duration::ZERO
        } else {
            self.requeue_after()
        };
        Ok(Requeue::requeue(after))
    }

    /// Node `i`'s observation, and how long until its retry gate opens, its wait on the
    /// device's holders reaches the drain timeout or its step reaches its deadline.
    fn observe_node(
        &mut self,
        i: usize,
        drain: Option<DrainProgress>,
    ) -> (String, NodeObservation) {
        let (n, settings) = (&self.matched[i], &self.ctx.settings);
        let node = n.name();
        let entry = self.recorded.nodes.get(node).map(Arc::as_ref);
        let (retry, wait) = observe::retry_gate(
            &n.metadata,
            entry,
            &self.now,
            settings.retry_base,
            settings.retry_max,
        );
        // Who else cordoned the nodes in flight, or the Done nodes left cordoned for someone
        // else: only those look at `spec.unschedulable` (from the node cache).
        let in_flight = entry.is_some_and(|r| {
            r.state.is_in_flight() || r.reason.as_deref() == Some(reasons::CORDONED_BY_OTHER)
        });
        let unschedulable =
            (in_flight || observe::cordoned_by(&n.metadata, &self.name)).then_some(n.unschedulable);
        let mut observation = observe::observe(ObserveInput {
            policy: &self.name,
            target_version: &self.planner.rules().target_version,
            target_parameters: &self.planner.rules().target_parameters,
            meta: &n.metadata,
            unschedulable,
            pod: observe::pick_agent_pod(self.agent_pods[i].iter().map(|p| p.as_ref())),
            current_hash: &self.basis.template_hash,
            recorded: entry,
            conflict_with: self.basis.conflicts.get(node).cloned(),
            drain: drain.unwrap_or(DrainProgress::NotStarted),
            retry,
            node_not_ready: n.not_ready.as_deref(),
            not_created: self.basis.not_created.as_ref(),
            now: &self.now,
        });
        // Lifted before a status write that failed: ours until its Uncordoning is recorded.
        observation.lifted_unrecorded = observation.recorded == Some(NodeState::Upgrading)
            && self.ctx.lifted_unrecorded(&self.name, node);
        observation.cordoned_by_us |= observation.lifted_unrecorded;
        observation.unsupported_compiler = builder_images::unsupported_compiler(
            &self.policy,
            settings,
            n.metadata.labels.as_ref(),
        );
        let rules = self.planner.rules();
        let deadline = drain_plan::holders_deadline(entry, &self.now, rules.drain_timeout);
        let step_deadline = observe::until_step_deadline(entry, &self.now, rules);
        let soonest = wait
            .into_iter()
            .chain(deadline)
            .chain(step_deadline)
            .chain(self.next_retry)
            .min();
        let observed = (node.to_owned(), observation);
        self.next_retry = soonest;
        self.note_agent_missing(&observed);
        observed
    }

    /// Plans the nodes observed anew (by index, in index order) and keeps their actions.
    fn plan_nodes(&mut self) -> Vec<(usize, NodeTransition)> {
        let mut transitions = self.planner.plan(&mut self.observations, &self.reobserved);
        for (i, t) in &mut transitions {
            let node = &self.observations[*i].0;
            // A new state's actions are new: none of them is taken yet.
            if self.recorded.nodes.get(node.as_str()).map(|e| e.state) != Some(t.state) {
                self.actions_taken.remove(node);
            }
            self.planned[*i] = (t.state, std::mem::take(&mut t.actions));
        }
        transitions
    }

    /// Starts each node's work in the background: its record (`records`, by index) and its
    /// actions not taken yet. A node whose last task still runs waits for it, and is taken up
    /// again when it ends ([`Pass::deferred`]).
    fn start_work(&mut self, mut records: BTreeMap<usize, serde_json::Value>) {
        for i in 0..self.observations.len() {
            let record_patch = records.remove(&i);
            let (node, obs) = &self.observations[i];
            let actions = &self.planned[i].1;
            // Most nodes have nothing to do: no entry (a String and a Vec) for them.
            if actions.is_empty() && record_patch.is_none() {
                continue;
            }
            let todo = self.not_taken(node, actions);
            if todo.is_empty() && record_patch.is_none() {
                continue;
            }
            if self.ctx.node_tasks.busy(&self.name, node) {
                self.deferred.insert(i);
                continue;
            }
            (self.actions_taken.entry(node.clone()).or_default()).extend(&todo);
            let pods = &self.agent_pods[i];
            let work = NodeWork {
                node: node.clone(),
                stale_agent: observe::agent_to_replace(&todo, &obs.agent, pods),
                grant: todo
                    .contains(&Action::Grant)
                    .then(|| self.planner.rules().target_version.clone()),
                entered: (self.recorded.nodes.get(node.as_str()))
                    .and_then(|e| e.last_transition_time.clone()),
                record: rides_along(&todo).then(|| self.record_of(node)).flatten(),
                record_patch,
                on_release: RecordOnRelease::Keep,
                actions: todo,
            };
            if work.record.is_some() || work.record_patch.is_some() {
                let record = self.record_of(node);
                self.written.insert(node.clone(), record);
            }
            act::spawn_in_background(&self.ctx, &self.policy, work, &self.now);
        }
    }
}
