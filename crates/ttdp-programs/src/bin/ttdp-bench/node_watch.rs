//! A watch on the Tenstorrent nodes: when each node was really cordoned by ttdp, granted its
//! upgrade and released, as the nodes themselves say (not as the policy's status reports it).
//!
//! Cordoned by ttdp: `spec.unschedulable` and ttdp's cordon annotation naming the policy, as the
//! controller itself reads it (`cordoned_by` in `crates/ttdp-controller/src/pure/observe.rs`).
//! Granted: the upgrade-grant annotation for the policy and the version rolled out. Released:
//! a node seen cordoned by ttdp that no longer is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;
use ttdp_api::names::{self, annotations, labels};

/// What happened to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeChange {
    Cordoned,
    Granted,
    Released,
}

/// One change, when the watch saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    pub node: String,
    pub change: NodeChange,
    pub at: Instant,
}

/// What the watch knows of one node.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Held {
    cordoned: bool,
    granted: bool,
}

#[derive(Debug, Default)]
struct Seen {
    held: HashMap<String, Held>,
    events: Vec<NodeEvent>,
}

/// The running watch; dropping it stops it.
#[derive(Debug)]
pub struct NodeWatch {
    seen: Arc<Mutex<Seen>>,
    task: JoinHandle<()>,
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NodeWatch {
    /// Watches the Tenstorrent nodes for `policy`'s cordons and its grants of `version`.
    pub fn start(client: Client, policy: &str, version: &str) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = Arc::clone(&seen);
        let owner = names::cordon_owner(policy);
        let grant = names::upgrade_grant(policy, version);
        let nodes: Api<Node> = Api::all(client);
        let selector = format!("{}={}", labels::NFD_TENSTORRENT, labels::NFD_PRESENT);
        let config = watcher::Config::default().labels(&selector);
        let task = tokio::spawn(async move {
            let mut stream = watcher(nodes, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(item) = stream.next().await {
                let Ok(node) = item else { continue };
                let now = held(&node, &owner, &grant);
                let mut seen = seen_lock(&shared);
                let before = seen.held.insert(node.name_any(), now).unwrap_or_default();
                for change in changes(before, now) {
                    let event = NodeEvent {
                        node: node.name_any(),
                        change,
                        at: Instant::now(),
                    };
                    seen.events.push(event);
                }
            }
        });
        Self { seen, task }
    }

    /// Every change seen so far, oldest first.
    pub fn events(&self) -> Vec<NodeEvent> {
        seen_lock(&self.seen).events.clone()
    }
}

fn seen_lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether `node` is cordoned by the cordon `owner` and carries the upgrade `grant`.
fn held(node: &Node, owner: &str, grant: &str) -> Held {
    let annotation = |key: &str| node.annotations().get(key).map(String::as_str);
    let unschedulable = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    Held {
        cordoned: unschedulable && annotation(annotations::CORDONED_BY) == Some(owner),
        granted: annotation(annotations::UPGRADE_GRANT) == Some(grant),
    }
}

/// The changes from `before` to `now` (a grant removed is no event: the release says it).
fn changes(before: Held, now: Held) -> Vec<NodeChange> {
    let mut changes = Vec::new();
    if now.cordoned && !before.cordoned {
        changes.push(NodeChange::Cordoned);
    }
    if now.granted && !before.granted {
        changes.push(NodeChange::Granted);
    }
    if before.cordoned && !now.cordoned {
        changes.push(NodeChange::Released);
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(unschedulable: bool, annotations: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": { "name": "tt-00001", "annotations": annotations },
            "spec": { "unschedulable": unschedulable },
        }))
        .unwrap()
    }

    #[test]
    fn only_a_cordon_with_the_policys_annotation_counts() {
        let (owner, grant) = ("ttdp/bench", "bench/2.1.0");
        let by_us = json!({ annotations::CORDONED_BY: owner });
        assert!(held(&node(true, by_us.clone()), owner, grant).cordoned);
        // The annotation alone (the cordon not written yet) or someone else's cordon is not ours.
        assert!(!held(&node(false, by_us), owner, grant).cordoned);
        let other = json!({ annotations::CORDONED_BY: "ttdp/other" });
        assert!(!held(&node(true, other), owner, grant).cordoned);
        let granted = json!({ annotations::UPGRADE_GRANT: grant });
        assert!(held(&node(false, granted), owner, grant).granted);
        let old = json!({ annotations::UPGRADE_GRANT: "bench/2.0.0" });
        assert!(!held(&node(false, old), owner, grant).granted);
    }

    #[test]
    fn a_cordon_a_grant_and_a_release_are_each_seen_once() {
        let free = Held::default();
        let cordoned = Held {
            cordoned: true,
            granted: false,
        };
        let granted = Held {
            cordoned: true,
            granted: true,
        };
        assert_eq!(changes(free, cordoned), [NodeChange::Cordoned]);
        assert_eq!(changes(cordoned, cordoned), []);
        assert_eq!(changes(cordoned, granted), [NodeChange::Granted]);
        assert_eq!(changes(granted, free), [NodeChange::Released]);
    }
}
