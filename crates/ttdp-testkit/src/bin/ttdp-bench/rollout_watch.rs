//! Follows the policy through a watch: every per-node state change with the time the benchmark
//! saw it, the largest serialized status seen, and the latest policy.

use std::collections::HashMap;
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
    for node in policy.status.iter().flat_map(|s| s.nodes.iter()) {
        let previous = seen.states.insert(node.name.clone(), node.state);
        if previous != Some(node.state) {
            seen.changes.push(StateChange {
                at,
                node: node.name.clone(),
                state: node.state,
            });
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
