//! Follows the policy through a watch: every per-node state change with the time the benchmark
//! saw it, the largest serialized status seen, and the latest policy.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinHandle;
use ttdp_api::driver::v1alpha1::condition;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};

/// How often the status size is measured (serializing 5,000 entries on every event would cost the
/// benchmark more CPU than the controller it measures).
const SIZE_SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// One node entering a state.
#[derive(Debug, Clone, PartialEq)]
pub struct StateChange {
    /// When the benchmark saw it.
    pub at: Instant,
    /// The node.
    pub node: String,
    /// The state entered.
    pub state: NodeState,
}

#[derive(Debug, Default)]
struct Seen {
    policy: Option<TenstorrentDriverPolicy>,
    states: HashMap<String, NodeState>,
    changes: Vec<StateChange>,
    max_status_bytes: usize,
    sized_at: Option<Instant>,
    events: u64,
}

/// The running watch; dropping it stops it.
#[derive(Debug)]
pub struct RolloutWatch {
    seen: Arc<Mutex<Seen>>,
    task: JoinHandle<()>,
}

impl Drop for RolloutWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RolloutWatch {
    /// Starts watching policy `name`.
    pub fn start(client: Client, name: &str) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = Arc::clone(&seen);
        let api: Api<TenstorrentDriverPolicy> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(item) = stream.next().await {
                if let Ok(policy) = item {
                    record(&mut lock(&shared), policy, Instant::now());
                }
            }
        });
        Self { seen, task }
    }

    /// The latest policy.
    pub fn policy(&self) -> Option<TenstorrentDriverPolicy> {
        lock(&self.seen).policy.clone()
    }

    /// Every state change since `since`.
    pub fn changes_since(&self, since: Instant) -> Vec<StateChange> {
        lock(&self.seen)
            .changes
            .iter()
            .filter(|c| c.at >= since)
            .cloned()
            .collect()
    }

    /// The largest serialized status seen since the last reset, in bytes.
    pub fn max_status_bytes(&self) -> usize {
        lock(&self.seen).max_status_bytes
    }

    /// Policy events received.
    pub fn events(&self) -> u64 {
        lock(&self.seen).events
    }

    /// Forgets the largest status size.
    pub fn reset_max_status(&self) {
        lock(&self.seen).max_status_bytes = 0;
    }
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn record(seen: &mut Seen, policy: TenstorrentDriverPolicy, at: Instant) {
    seen.events += 1;
    let mut listed = HashSet::new();
    for node in policy.status.iter().flat_map(|s| s.nodes.iter()) {
        listed.insert(node.name.as_str());
        let previous = seen.states.insert(node.name.clone(), node.state);
        if previous != Some(node.state) {
            seen.changes.push(StateChange {
                at,
                node: node.name.clone(),
                state: node.state,
            });
        }
    }
    // Past 1,000 nodes the status leaves Done nodes (and ones waiting for a slot) out: a node
    // in flight that leaves the list has reached Done.
    let omits = policy
        .status
        .as_ref()
        .and_then(|s| s.summary.as_ref())
        .is_some_and(|s| s.nodes_omitted > 0);
    if omits {
        for (name, state) in &mut seen.states {
            if state.is_in_flight() && !listed.contains(name.as_str()) {
                *state = NodeState::Done;
                seen.changes.push(StateChange {
                    at,
                    node: name.clone(),
                    state: NodeState::Done,
                });
            }
        }
    }
    if seen
        .sized_at
        .is_none_or(|t| at.duration_since(t) >= SIZE_SAMPLE_EVERY)
    {
        seen.sized_at = Some(at);
        let bytes = policy
            .status
            .as_ref()
            .and_then(|s| serde_json::to_vec(s).ok())
            .map_or(0, |v| v.len());
        seen.max_status_bytes = seen.max_status_bytes.max(bytes);
    }
    seen.policy = Some(policy);
}

/// Whether the controller has observed the latest spec, says Ready, and counts `nodes` up to date
/// on `version`.
pub fn rolled_out(policy: &TenstorrentDriverPolicy, nodes: usize, version: &str) -> bool {
    let Some(status) = &policy.status else {
        return false;
    };
    let generation = policy.metadata.generation;
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
    let up_to_date = status
        .summary
        .as_ref()
        .map_or(0, |s| usize::try_from(s.up_to_date).unwrap_or(0));
    ready
        && up_to_date == nodes
        && status
            .nodes
            .iter()
            .all(|n| n.state == NodeState::Done && n.current_version.as_deref() == Some(version))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(nodes: serde_json::Value, omitted: i32) -> TenstorrentDriverPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": { "name": "bench" },
            "spec": { "version": "2.8.0" },
            "status": { "summary": { "matched": 1_001, "nodesOmitted": omitted }, "nodes": nodes },
        }))
        .unwrap()
    }

    fn states(seen: &Seen) -> Vec<(&str, NodeState)> {
        seen.changes
            .iter()
            .map(|c| (c.node.as_str(), c.state))
            .collect()
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
}
