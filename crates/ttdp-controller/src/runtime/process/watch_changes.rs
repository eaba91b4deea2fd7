//! What the node and agent-pod watches changed in the caches, recorded for every reconcile that
//! follows the fleet ([`crate::runtime::reconcile::follow`]): between its rounds a reconcile takes what
//! changed, so a round costs what changed, not the fleet.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::pure::cached::{CachedNode, CachedPod};

/// What the watches changed in the caches since a [`ChangeSubscription`] last took it.
#[derive(Debug, Default)]
pub struct ChangesSince {
    /// Nodes changed, added or deleted.
    pub nodes: HashSet<String>,
    /// Agent pods changed, added or deleted, with their node.
    pub pods: Vec<(String, ObjectRef<CachedPod>)>,
    /// A watch listed its objects again: anything may have changed.
    pub relisted: bool,
    /// Something besides the watches asks to look again: a drain or a node task ended, or a
    /// policy changed.
    pub poked: bool,
    /// The policies whose agent DaemonSet's spec changed (someone edited it, or it was
    /// applied): a reconcile of theirs applies it again.
    pub daemonsets: HashSet<String>,
}

impl ChangesSince {
    fn is_empty(&self) -> bool {
        self.nodes.is_empty()
            && self.pods.is_empty()
            && !self.relisted
            && !self.poked
            && self.daemonsets.is_empty()
    }
}

/// Where the node and agent-pod watches record their changes, for every open [`ChangeSubscription`].
#[derive(Debug, Default)]
pub struct WatchChanges {
    open: Mutex<HashMap<u64, ChangesSince>>,
    next: AtomicU64,
    /// Wakes the reconciles waiting for a change.
    recorded: Notify,
    /// The controller is stopping: no reconcile waits any more.
    closed: AtomicBool,
}

impl WatchChanges {
    fn record(&self, f: impl Fn(&mut ChangesSince)) {
        {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            for changed in open.values_mut() {
                f(changed);
            }
        }
        self.recorded.notify_waiters();
    }

    /// Records that `policy`'s agent DaemonSet changed.
    pub fn daemonset_changed(&self, policy: &str) {
        self.record(|c| {
            c.daemonsets.insert(policy.to_owned());
        });
    }

    /// Asks every reconcile following the fleet to look again.
    pub fn poke(&self) {
        self.record(|c| c.poked = true);
    }

    /// The controller stops (shutdown, or leadership lost): every reconcile following the fleet
    /// ends now, so the shutdown does not wait for it.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.recorded.notify_waiters();
    }

    /// Records a node watch event.
    pub fn node_event(&self, event: &Result<watcher::Event<CachedNode>, watcher::Error>) {
        match event {
            Ok(watcher::Event::Apply(n) | watcher::Event::Delete(n)) => {
                let name = n.name();
                self.record(|c| {
                    c.nodes.insert(name.to_owned());
                });
            }
            Ok(_) => self.record(|c| c.relisted = true),
            Err(_) => {}
        }
    }

    /// Records an agent pod watch event.
    pub fn pod_event(&self, event: &Result<watcher::Event<CachedPod>, watcher::Error>) {
        match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p)) => {
                if let Some(node) = p.node_name.as_deref() {
                    let pod = ObjectRef::from_obj(p);
                    self.record(|c| c.pods.push((node.to_owned(), pod.clone())));
                }
            }
            Ok(_) => self.record(|c| c.relisted = true),
            Err(_) => {}
        }
    }

    /// Starts recording for one reconcile; it stops when the subscription is dropped.
    pub fn subscribe(self: &Arc<Self>) -> ChangeSubscription {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, ChangesSince::default());
        ChangeSubscription {
            changes: self.clone(),
            id,
        }
    }
}

/// The changes recorded for one reconcile.
#[derive(Debug)]
pub struct ChangeSubscription {
    changes: Arc<WatchChanges>,
    id: u64,
}

impl ChangeSubscription {
    /// Waits until something changed since the last [`ChangeSubscription::take`], at most
    /// `limit`; whether something did (or the controller is stopping).
    pub async fn changed_within(&self, limit: Duration) -> bool {
        let notified = self.changes.recorded.notified();
        tokio::pin!(notified);
        // Registered before looking: a change in between wakes it.
        notified.as_mut().enable();
        let pending = (self
            .changes
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
        .get(&self.id)
        .is_some_and(|c| !c.is_empty());
        pending || self.closed() || tokio::time::timeout(limit, notified).await.is_ok()
    }

    /// Whether the controller is stopping.
    pub fn closed(&self) -> bool {
        self.changes.closed.load(Ordering::Relaxed)
    }

    /// What changed since the last call (or since the subscription).
    pub fn take(&self) -> ChangesSince {
        self.changes
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&self.id)
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

impl Drop for ChangeSubscription {
    fn drop(&mut self) {
        self.changes
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn node(name: &str) -> CachedNode {
        CachedNode {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            unschedulable: false,
            not_ready: None,
            deleted: false,
        }
    }

    fn pod(name: &str, node: Option<&str>) -> CachedPod {
        CachedPod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ttdp-system".into()),
                ..ObjectMeta::default()
            },
            node_name: node.map(Into::into),
            ..CachedPod::default()
        }
    }

    #[test]
    fn each_open_subscription_gets_the_changes_made_while_it_is_open() {
        let changes = Arc::new(WatchChanges::default());
        changes.node_event(&Ok(watcher::Event::Apply(node("before"))));
        let first = changes.subscribe();
        changes.node_event(&Ok(watcher::Event::Apply(node("a"))));
        let second = changes.subscribe();
        changes.node_event(&Ok(watcher::Event::Delete(node("b"))));
        changes.pod_event(&Ok(watcher::Event::Apply(pod("agent-1", Some("c")))));
        changes.pod_event(&Ok(watcher::Event::Apply(pod("pending", None))));

        let taken = first.take();
        let names: BTreeMap<_, _> = taken.nodes.iter().map(|n| (n.as_str(), ())).collect();
        assert_eq!(names.keys().copied().collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(taken.pods.len(), 1);
        assert_eq!(taken.pods[0].0, "c");
        assert_eq!(taken.pods[0].1.name, "agent-1");
        assert!(!taken.relisted);
        assert!(first.take().nodes.is_empty(), "taken once");

        let taken = second.take();
        assert_eq!(taken.nodes.len(), 1);
        assert!(taken.nodes.contains("b"));

        changes.node_event(&Ok(watcher::Event::Init));
        assert!(first.take().relisted);
        drop(first);
        drop(second);
        assert!(
            changes
                .open
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty(),
            "a dropped subscription records nothing more"
        );
    }
}
