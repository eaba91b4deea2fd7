//! Follows one policy, and the upgrade records on the nodes, through watches and keeps what the
//! demo shows: the latest policy, every per-node state change with the time it was seen, how many
//! events arrived and the largest serialized status seen; [`node_spans`], when each node's
//! upgrade began and ended; and [`is_rolled_out`], when a rollout counts as finished.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use ttdp_api::driver::v1alpha1::condition;
use ttdp_api::node_record::NodeRecord;
use ttdp_api::{NodeState, NodeStatus, TenstorrentDriverPolicy};
use ttdp_testkit::node_view::NodeView;

/// How often the status size is measured (serializing a fleet's status on every event would cost
/// the benchmark more CPU than the controller it measures).
const SIZE_SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// One node entering a state, as seen in the policy's status or the node's upgrade record.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// When the watch saw it.
    pub at: Instant,
    /// The node.
    pub node: String,
    /// Its previous state (`None`: first seen).
    pub from: Option<NodeState>,
    /// The state entered.
    pub to: NodeState,
    /// The version it reported loaded at that moment.
    pub version: Option<String>,
    /// Reason and message, when the status or the record gives them.
    pub why: Option<String>,
}

/// What the watch knows of one node: its state as the record and the status say
/// ([`NodeView`]), and what its status entry adds for the demo's lines.
#[derive(Debug, Default)]
struct NodeSeen {
    view: NodeView,
    entry: Option<Entry>,
    /// The state last reported as a transition.
    shown: Option<NodeState>,
}

/// What the watch keeps of a node's entry in the status.
#[derive(Debug)]
struct Entry {
    version: Option<String>,
    reason: Option<String>,
    message: Option<String>,
}

impl NodeSeen {
    fn see_entry(&mut self, n: &NodeStatus) {
        (self.view).see_entry(
            n.state,
            n.last_transition_time.clone(),
            n.current_version.clone(),
        );
        self.entry = Some(Entry {
            version: n.current_version.clone(),
            reason: n.reason.clone(),
            message: n.message.clone(),
        });
    }

    fn why(&self) -> Option<String> {
        let (reason, message) = match (self.view.carried(), &self.entry) {
            (Some(r), _) => (&r.reason, &r.message),
            (None, Some(e)) => (&e.reason, &e.message),
            (None, None) => return None,
        };
        let why: Vec<&str> = [reason, message]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        (!why.is_empty()).then(|| why.join(": "))
    }
}

#[derive(Debug, Default)]
struct Seen {
    policy: Option<TenstorrentDriverPolicy>,
    nodes: BTreeMap<String, NodeSeen>,
    transitions: Vec<Transition>,
    max_status_bytes: usize,
    sized_at: Option<Instant>,
}

impl Seen {
    /// Adds a transition for each node in `names` whose state changed.
    fn note_changes<'a>(&mut self, names: impl IntoIterator<Item = &'a str>, at: Instant) {
        for name in names {
            let Some(node) = self.nodes.get_mut(name) else {
                continue;
            };
            let Some(state) = node.view.state() else {
                continue;
            };
            if node.shown == Some(state) {
                continue;
            }
            self.transitions.push(Transition {
                at,
                node: name.to_owned(),
                from: node.shown,
                to: state,
                version: node.entry.as_ref().and_then(|e| e.version.clone()),
                why: node.why(),
            });
            node.shown = Some(state);
        }
    }
}

/// The watch on the policy and on the nodes' upgrade records, running in the background until
/// dropped.
#[derive(Debug)]
pub struct RolloutWatch {
    seen: Arc<Mutex<Seen>>,
    /// Counts the events received.
    changed: watch::Receiver<u64>,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for RolloutWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl RolloutWatch {
    /// Starts watching the policy `name` and the nodes.
    pub fn start(client: Client, name: &str) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, changed) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let policies: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
        // Every server the programs run on (the imitation included) honours the field selector.
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (shared, sender) = (Arc::clone(&seen), Arc::clone(&tx));
        let policy_task = tokio::spawn(async move {
            let mut stream = watcher(policies, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(item) = stream.next().await {
                let Ok(policy) = item else { continue };
                record(&mut lock(&shared), policy, Instant::now());
                sender.send_modify(|n| *n += 1);
            }
        });
        let nodes: Api<Node> = Api::all(client);
        let (shared, policy) = (Arc::clone(&seen), name.to_owned());
        let node_task = tokio::spawn(async move {
            let mut stream = watcher(nodes, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(item) = stream.next().await {
                let Ok(node) = item else { continue };
                let record = NodeRecord::of_policy(node.annotations(), &policy);
                record_node(&mut lock(&shared), &node.name_any(), record, Instant::now());
                tx.send_modify(|n| *n += 1);
            }
        });
        Self {
            seen,
            changed,
            tasks: [policy_task, node_task],
        }
    }

    /// A receiver that changes whenever the policy or a node does.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.clone()
    }

    /// The latest policy, if seen.
    pub fn policy(&self) -> Option<TenstorrentDriverPolicy> {
        lock(&self.seen).policy.clone()
    }

    /// Every transition so far, oldest first.
    pub fn transitions(&self) -> Vec<Transition> {
        lock(&self.seen).transitions.clone()
    }

    /// The largest serialized status seen since the last reset, in bytes (sampled at most every
    /// `SIZE_SAMPLE_EVERY`).
    pub fn max_status_bytes(&self) -> usize {
        lock(&self.seen).max_status_bytes
    }

    /// Policy and node events received.
    pub fn events(&self) -> u64 {
        *self.changed.borrow()
    }

    /// Forgets the largest status size.
    pub fn reset_max_status(&self) {
        lock(&self.seen).max_status_bytes = 0;
    }
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes node `name`'s record for the policy (`None`: it carries none).
fn record_node(seen: &mut Seen, name: &str, record: Option<NodeRecord>, at: Instant) {
    let known = seen.nodes.contains_key(name);
    if !known && record.is_none() {
        // A node the rollout never touched.
        return;
    }
    seen.nodes
        .entry(name.to_owned())
        .or_default()
        .view
        .see_record(record);
    seen.note_changes([name], at);
}

fn record(seen: &mut Seen, policy: TenstorrentDriverPolicy, at: Instant) {
    let mut listed = HashSet::new();
    for entry in policy.status.iter().flat_map(|s| s.nodes.iter()) {
        listed.insert(entry.name.clone());
        seen.nodes
            .entry(entry.name.clone())
            .or_default()
            .see_entry(entry);
    }
    // Past 1,000 nodes the status leaves Done nodes (and ones waiting for a slot) out: a node
    // in flight that leaves the list, and carries no record, has reached Done.
    let omits = policy
        .status
        .as_ref()
        .and_then(|s| s.summary.as_ref())
        .is_some_and(|s| s.nodes_omitted > 0);
    if omits {
        let now = Time(Timestamp::now());
        for (name, node) in &mut seen.nodes {
            let left = !listed.contains(name) && node.view.carried().is_none();
            if left && node.view.state().is_some_and(NodeState::is_in_flight) {
                node.view
                    .see_entry(NodeState::Done, Some(now.clone()), None);
                node.entry = None;
            }
        }
    }
    let names: Vec<String> = seen.nodes.keys().cloned().collect();
    seen.note_changes(names.iter().map(String::as_str), at);
    if seen
        .sized_at
        .is_none_or(|t| at.duration_since(t) >= SIZE_SAMPLE_EVERY)
    {
        seen.sized_at = Some(at);
        seen.max_status_bytes = seen.max_status_bytes.max(status_bytes(&policy));
    }
    seen.policy = Some(policy);
}

/// The size of `policy`'s serialized status, in bytes (0 without a status).
pub fn status_bytes(policy: &TenstorrentDriverPolicy) -> usize {
    let status = policy.status.as_ref();
    status
        .and_then(|s| serde_json::to_vec(s).ok())
        .map_or(0, |v| v.len())
}

/// When one node's upgrade began and ended, as far as the watch saw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NodeSpan {
    /// Its first entry into a state in flight (Cordoning to Uncordoning).
    pub started: Option<Instant>,
    /// Its last entry into Done.
    pub done: Option<Instant>,
}

impl NodeSpan {
    /// From start to Done, when both were seen.
    pub fn duration(&self) -> Option<Duration> {
        Some(self.done?.saturating_duration_since(self.started?))
    }
}

/// The span of every node with a transition at or after `since` (a rollout's start).
pub fn node_spans(transitions: &[Transition], since: Instant) -> BTreeMap<String, NodeSpan> {
    let mut spans: BTreeMap<String, NodeSpan> = BTreeMap::new();
    for t in transitions.iter().filter(|t| t.at >= since) {
        let span = spans.entry(t.node.clone()).or_default();
        if t.to.is_in_flight() && span.started.is_none() {
            span.started = Some(t.at);
        }
        if t.to == NodeState::Done {
            span.done = Some(t.at);
        }
    }
    spans
}

/// Whether `policy` has rolled out `version` to at least `expected_nodes` nodes: the controller
/// has observed the latest spec (which asks for `version`), the `Ready` condition is true for it,
/// every listed node is HostManaged or Done at `version`, and the summary counts nothing in
/// progress or pending.
pub fn is_rolled_out(
    policy: &TenstorrentDriverPolicy,
    version: &str,
    expected_nodes: usize,
) -> bool {
    let Some(status) = &policy.status else {
        return false;
    };
    let generation = policy.metadata.generation;
    // The watch's copy may still be the one from before a version bump (a status write that
    // raced it): the spec must ask for `version` too.
    if generation.is_none()
        || status.observed_generation != generation
        || policy.spec.version != version
    {
        return false;
    }
    let ready = status.conditions.iter().any(|c| {
        c.type_ == condition::READY
            && c.status == "True"
            && c.observed_generation.is_none_or(|g| Some(g) == generation)
    });
    // Done must mean "running `version`": a status written just after a version bump can still
    // list nodes Done at the old version.
    let settled = status.nodes.iter().all(|n| match n.state {
        NodeState::Done => n.current_version.as_deref() == Some(version),
        NodeState::HostManaged => true,
        _ => false,
    });
    let summary = status.summary.as_ref();
    let summary_settled = summary.is_none_or(|s| {
        s.up_to_date + s.host_managed == s.matched && s.in_progress == 0 && s.pending == 0
    });
    let omitted = summary.map_or(0, |s| usize::try_from(s.nodes_omitted).unwrap_or(0));
    let counted = status.nodes.len() + omitted;
    ready && settled && summary_settled && counted >= expected_nodes
}

/// Nodes that are not where the rollout wants them, with the status's explanation, for a
/// timeout message.
pub fn stragglers(policy: &TenstorrentDriverPolicy) -> Vec<String> {
    policy
        .status
        .iter()
        .flat_map(|s| s.nodes.iter())
        .filter(|n| !matches!(n.state, NodeState::Done | NodeState::HostManaged))
        .map(|n| {
            let reason = n.reason.as_ref().map(|r| format!(" ({r})"));
            let message = n.message.as_ref().map(|m| format!(": {m}"));
            let (reason, message) = (reason.unwrap_or_default(), message.unwrap_or_default());
            format!("{} is {}{reason}{message}", n.name, n.state)
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn policy(nodes: serde_json::Value, omitted: i32) -> TenstorrentDriverPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": { "name": "bench", "generation": 2 },
            "spec": { "version": "2.8.0" },
            "status": {
                "observedGeneration": 2,
                "conditions": [{ "type": "Ready", "status": "True", "reason": "RolledOut",
                    "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z" }],
                "summary": { "matched": 1_001, "upToDate": 1_000, "hostManaged": 1, "nodesOmitted": omitted },
                "nodes": nodes },
        }))
        .unwrap()
    }

    fn states(seen: &Seen) -> Vec<(&str, NodeState)> {
        seen.transitions
            .iter()
            .map(|c| (c.node.as_str(), c.to))
            .collect()
    }

    #[test]
    fn a_span_runs_from_the_first_state_in_flight_to_the_last_done() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let step = |node: &str, to, at| Transition {
            at: t0 + ms(at),
            node: node.into(),
            from: None,
            to,
            version: None,
            why: None,
        };
        let transitions = [
            step("a", NodeState::Done, 0),
            step("a", NodeState::Pending, 1),
            step("a", NodeState::Cordoning, 5),
            step("a", NodeState::Draining, 6),
            step("b", NodeState::Cordoning, 7),
            step("a", NodeState::Done, 50),
        ];
        let spans = node_spans(&transitions, t0 + ms(1));
        let (started, done) = (Some(t0 + ms(5)), Some(t0 + ms(50)));
        assert_eq!(
            spans["a"],
            NodeSpan { started, done },
            "the Done before `since` is left out"
        );
        assert_eq!(spans["a"].duration(), Some(ms(45)));
        assert_eq!(spans["b"].duration(), None, "b never finished");
    }

    #[test]
    fn a_node_in_flight_that_leaves_a_compacted_status_is_done() {
        let mut seen = Seen::default();
        let at = Instant::now();
        let both = serde_json::json!([
            { "name": "a", "state": "Uncordoning" },
            { "name": "b", "state": "Failed" },
        ]);
        record(&mut seen, policy(both, 999), at);
        let only_b = serde_json::json!([{ "name": "b", "state": "Failed" }]);
        record(&mut seen, policy(only_b.clone(), 1_000), at);
        record(&mut seen, policy(only_b, 1_000), at);
        assert_eq!(
            states(&seen),
            [
                ("a", NodeState::Uncordoning),
                ("b", NodeState::Failed),
                ("a", NodeState::Done),
            ],
            "a left the list once (Done); b stays Failed"
        );
        assert_eq!(seen.transitions[2].from, Some(NodeState::Uncordoning));
    }

    #[test]
    fn a_status_that_lists_every_node_says_done_itself() {
        let mut seen = Seen::default();
        let at = Instant::now();
        record(
            &mut seen,
            policy(
                serde_json::json!([{ "name": "a", "state": "Upgrading" }]),
                0,
            ),
            at,
        );
        record(&mut seen, policy(serde_json::json!([]), 0), at);
        assert_eq!(states(&seen), [("a", NodeState::Upgrading)]);
    }

    fn upgrade_record(state: NodeState, since: &str) -> Option<NodeRecord> {
        Some(NodeRecord {
            policy: "bench".into(),
            state,
            target: "2.8.0".into(),
            since: Time(since.parse().unwrap()),
            started: None,
            attempts: None,
            reason: None,
            message: None,
        })
    }

    #[test]
    fn the_record_on_the_node_shows_each_step_the_lagging_status_skips() {
        let mut seen = Seen::default();
        let at = Instant::now();
        let entry = |state: &str, ltt: &str| {
            serde_json::json!([{ "name": "a", "state": state, "lastTransitionTime": ltt,
                "currentVersion": "2.7.0" }])
        };
        record(
            &mut seen,
            policy(entry("Done", "2026-12-07T05:00:00Z"), 0),
            at,
        );
        for (state, since) in [
            (NodeState::Cordoning, "2026-12-07T05:00:10Z"),
            (NodeState::Draining, "2026-12-07T05:00:10Z"),
            (NodeState::Upgrading, "2026-12-07T05:00:11Z"),
        ] {
            record_node(&mut seen, "a", upgrade_record(state, since), at);
        }
        // The view catches up with Cordoning only: the record still says Upgrading.
        record(
            &mut seen,
            policy(entry("Cordoning", "2026-12-07T05:00:10Z"), 0),
            at,
        );
        // The record is removed at Done before the view says so: the node stays Upgrading
        // until an entry at least as recent as the record arrives.
        record_node(&mut seen, "a", None, at);
        record(
            &mut seen,
            policy(entry("Done", "2026-12-07T05:00:12Z"), 0),
            at,
        );
        assert_eq!(
            states(&seen),
            [
                ("a", NodeState::Done),
                ("a", NodeState::Cordoning),
                ("a", NodeState::Draining),
                ("a", NodeState::Upgrading),
                ("a", NodeState::Done),
            ],
            "every step once, in order, never back to one the view lagged at"
        );
        assert_eq!(seen.transitions[4].version.as_deref(), Some("2.7.0"));
    }

    #[test]
    fn a_node_the_rollout_never_touched_is_not_followed() {
        let mut seen = Seen::default();
        let at = Instant::now();
        record_node(&mut seen, "plain", None, at);
        assert!(seen.nodes.is_empty() && seen.transitions.is_empty());
    }

    #[test]
    fn rolled_out_needs_the_version_every_node_and_a_settled_summary() {
        let done = serde_json::json!([
            { "name": "a", "state": "Done", "currentVersion": "2.8.0" },
            { "name": "h", "state": "HostManaged", "currentVersion": "2.6.1" },
        ]);
        let p = policy(done, 999);
        assert!(is_rolled_out(&p, "2.8.0", 1_001));
        assert!(!is_rolled_out(&p, "2.7.0", 1_001), "another version");
        assert!(!is_rolled_out(&p, "2.8.0", 1_002), "a node not counted");
        let old = serde_json::json!([{ "name": "a", "state": "Done", "currentVersion": "2.7.0" }]);
        assert!(!is_rolled_out(&policy(old, 1_000), "2.8.0", 1_001));
        let busy = serde_json::json!([{ "name": "a", "state": "Draining", "reason": "Evicting" }]);
        let p = policy(busy, 1_000);
        assert!(!is_rolled_out(&p, "2.8.0", 1_001));
        assert_eq!(stragglers(&p), ["a is Draining (Evicting)"]);
    }
}
