//! Follows one policy through a watch and keeps what the demo shows and measures: the latest
//! policy, every per-node state change with its time, and when the rollout is Ready.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use ttdp_api::driver::v1alpha1::condition;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};

/// One node changing state, as seen in the policy's status.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// Time since the demo started.
    pub at: Duration,
    /// The node.
    pub node: String,
    /// Its previous state (`None`: first seen).
    pub from: Option<NodeState>,
    /// Its new state.
    pub to: NodeState,
    /// The version it reported loaded at that moment.
    pub version: Option<String>,
    /// Reason and message, when the status gives them.
    pub why: Option<String>,
}

#[derive(Debug, Default)]
struct Seen {
    policy: Option<TenstorrentDriverPolicy>,
    states: BTreeMap<String, NodeState>,
    transitions: Vec<Transition>,
}

/// The watch on the policy, running in the background until dropped.
#[derive(Debug)]
pub struct RolloutTracker {
    seen: Arc<Mutex<Seen>>,
    changed: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl Drop for RolloutTracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RolloutTracker {
    /// Starts watching the policy `name`; times are measured from `epoch`.
    pub fn start(client: Client, name: &str, epoch: Instant) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, changed) = watch::channel(0u64);
        let api: Api<TenstorrentDriverPolicy> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let name = name.to_owned();
        let shared = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(item) = stream.next().await {
                let Ok(policy) = item else { continue };
                if policy.name_any() != name {
                    continue;
                }
                record(&mut lock(&shared), policy, epoch.elapsed());
                tx.send_modify(|n| *n += 1);
            }
        });
        Self {
            seen,
            changed,
            task,
        }
    }

    /// A receiver that changes whenever the policy does.
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

    /// Transitions from index `from` on.
    pub fn transitions_since(&self, from: usize) -> Vec<Transition> {
        let seen = lock(&self.seen);
        seen.transitions
            .get(from..)
            .map(<[Transition]>::to_vec)
            .unwrap_or_default()
    }
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn record(seen: &mut Seen, policy: TenstorrentDriverPolicy, at: Duration) {
    for node in policy.status.iter().flat_map(|s| s.nodes.iter()) {
        let previous = seen.states.insert(node.name.clone(), node.state);
        if previous != Some(node.state) {
            let why = match (&node.reason, &node.message) {
                (Some(r), Some(m)) => Some(format!("{r}: {m}")),
                (Some(r), None) => Some(r.clone()),
                (None, Some(m)) => Some(m.clone()),
                (None, None) => None,
            };
            seen.transitions.push(Transition {
                at,
                node: node.name.clone(),
                from: previous,
                to: node.state,
                version: node.current_version.clone(),
                why,
            });
        }
    }
    seen.policy = Some(policy);
}

/// Whether `policy` is Ready for its current generation: the controller has observed the latest
/// spec, the `Ready` condition is true for it, and every listed node is HostManaged or Done at
/// `spec.version`.
pub fn is_ready(policy: &TenstorrentDriverPolicy, expected_nodes: usize) -> bool {
    let Some(status) = &policy.status else {
        return false;
    };
    let generation = policy.metadata.generation;
    if generation.is_none() || status.observed_generation != generation {
        return false;
    }
    let ready = status.conditions.iter().any(|c| {
        c.type_ == condition::READY
            && c.status == "True"
            && c.observed_generation.is_none_or(|g| Some(g) == generation)
    });
    // Done must mean "running spec.version": a status written just after a version bump can
    // still list nodes Done at the old version.
    let target = policy.spec.version.as_str();
    let settled = status.nodes.iter().all(|n| match n.state {
        NodeState::Done => n.current_version.as_deref() == Some(target),
        NodeState::HostManaged => true,
        _ => false,
    });
    let summary_settled = status.summary.as_ref().is_none_or(|s| {
        s.up_to_date + s.host_managed == s.matched && s.in_progress == 0 && s.pending == 0
    });
    let counted = status.nodes.len()
        + status
            .summary
            .as_ref()
            .map_or(0, |s| usize::try_from(s.nodes_omitted).unwrap_or(0));
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
            let mut line = format!("{} is {}", n.name, n.state);
            if let Some(reason) = &n.reason {
                line.push_str(&format!(" ({reason})"));
            }
            if let Some(message) = &n.message {
                line.push_str(&format!(": {message}"));
            }
            line
        })
        .collect()
}
