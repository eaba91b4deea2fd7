//! A watch on the policy: the latest policy, when each node's state changed in its status, and
//! the size of the status after every write.
//!
//! Each watch event is one write the API server stored (and sent to every watcher), so the
//! sizes seen are the status bytes the controller makes the server store and send, write by
//! write. Every event is measured: serializing a status costs far less than decoding the event
//! that brought it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};
use ttdp_programs::rollout_watch::{Transition, status_bytes};

/// One write of the status, as the watch saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusWrite {
    pub at: Instant,
    pub bytes: usize,
}

#[derive(Debug, Default)]
struct Seen {
    policy: Option<TenstorrentDriverPolicy>,
    states: HashMap<String, NodeState>,
    transitions: Vec<Transition>,
    writes: Vec<StatusWrite>,
}

/// The running watch; dropping it stops it.
#[derive(Debug)]
pub struct StatusWatch {
    seen: Arc<Mutex<Seen>>,
    task: JoinHandle<()>,
}

impl Drop for StatusWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StatusWatch {
    /// Starts watching the policy `name`.
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
                let Ok(policy) = item else { continue };
                record(&mut seen_lock(&shared), policy, Instant::now());
            }
        });
        Self { seen, task }
    }

    /// The latest policy, if seen.
    pub fn policy(&self) -> Option<TenstorrentDriverPolicy> {
        seen_lock(&self.seen).policy.clone()
    }

    /// Every node state change so far, oldest first.
    pub fn transitions(&self) -> Vec<Transition> {
        seen_lock(&self.seen).transitions.clone()
    }

    /// Every write seen so far, oldest first.
    pub fn writes(&self) -> Vec<StatusWrite> {
        seen_lock(&self.seen).writes.clone()
    }
}

fn seen_lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

fn record(seen: &mut Seen, policy: TenstorrentDriverPolicy, at: Instant) {
    let mut listed = HashSet::new();
    for node in policy.status.iter().flat_map(|s| s.nodes.iter()) {
        listed.insert(node.name.as_str());
        let previous = seen.states.insert(node.name.clone(), node.state);
        if previous != Some(node.state) {
            seen.transitions
                .push(transition(at, &node.name, previous, node.state));
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
        for (name, state) in seen.states.iter_mut() {
            if state.is_in_flight() && !listed.contains(name.as_str()) {
                seen.transitions
                    .push(transition(at, name, Some(*state), NodeState::Done));
                *state = NodeState::Done;
            }
        }
    }
    seen.writes.push(StatusWrite {
        at,
        bytes: status_bytes(&policy),
    });
    seen.policy = Some(policy);
}

fn transition(at: Instant, node: &str, from: Option<NodeState>, to: NodeState) -> Transition {
    Transition {
        at,
        node: node.to_owned(),
        from,
        to,
        version: None,
        why: None,
    }
}
