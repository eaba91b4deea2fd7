//! Between the passes of one reconcile: which matched nodes' inputs changed in the caches, so
//! that only those are observed again. A reconcile follows the fleet this way while it changes
//! (see [`crate::runtime::reconcile::apply`]), instead of observing every node again in a new reconcile.
//!
//! The node and agent-pod watches record what they change in the caches ([`Changes`]); a
//! reconcile that follows the fleet takes those records between its passes, so a pass costs what
//! changed, not the fleet.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::labels;
use ttdp_api::node_selection::NodeSelection;

use crate::pure::cached::{CachedNode, CachedPod};
use crate::pure::overlap::OlderPolicies;
use crate::runtime::context::Context;

/// The index of the node `name` in `matched` (in name order).
pub fn position(matched: &[Arc<CachedNode>], name: &str) -> Option<usize> {
    matched.binary_search_by(|n| n.name().cmp(name)).ok()
}

/// `policy`'s agent pods on each of the `matched` nodes (in name order), in that order.
pub fn agent_pods_by_node(
    pods: Vec<Arc<CachedPod>>,
    policy: &str,
    matched: &[Arc<CachedNode>],
) -> Vec<Vec<Arc<CachedPod>>> {
    let mut by_node = vec![Vec::new(); matched.len()];
    for pod in pods {
        if !of_policy(&pod, policy) {
            continue;
        }
        if let Some(i) = pod.node_name.as_deref().and_then(|n| position(matched, n)) {
            by_node[i].push(pod);
        }
    }
    by_node
}

/// Whether the agent pod belongs to `policy` (its policy label).
fn of_policy(pod: &CachedPod, policy: &str) -> bool {
    pod.labels().get(labels::POLICY).map(String::as_str) == Some(policy)
}

/// What decides which policy owns which node: every policy's uid, generation and whether it is
/// being deleted.
pub fn policy_keys(
    policies: &[Arc<TenstorrentDriverPolicy>],
) -> Vec<(Option<String>, Option<i64>, bool)> {
    let mut keys: Vec<_> = policies
        .iter()
        .map(|p| {
            (
                p.metadata.uid.clone(),
                p.metadata.generation,
                p.metadata.deletion_timestamp.is_some(),
            )
        })
        .collect();
    keys.sort_unstable();
    keys
}

/// What a reconcile decided from when it started (selection, conflicts, policies): a change to
/// any of it ends the following.
#[derive(Debug)]
pub struct Seen<'a> {
    /// The policy.
    pub policy: &'a str,
    /// Its node selection.
    pub selection: &'a NodeSelection,
    /// The older policies (for conflicts).
    pub older: &'a OlderPolicies,
    /// The matched nodes in conflict, with the policy owning them.
    pub conflicts: &'a BTreeMap<String, String>,
    /// [`policy_keys`] when the reconcile started.
    pub policies: &'a [(Option<String>, Option<i64>, bool)],
}

/// Why the caches cannot be followed node by node: a new reconcile observes everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// A background action failed (the next reconcile reports it).
    TaskFailed,
    /// A policy was created, changed or deleted.
    Policies,
    /// A node joined or left, or the policy's selection or a conflict changed.
    Membership,
    /// A watch listed its objects again.
    Relisted,
}

/// Brings `matched` and `by_node` (see [`agent_pods_by_node`]) up to date with what the watches
/// changed since the last call and returns the indexes (in `matched`) of the nodes whose node
/// object or agent pods changed.
pub fn changed_nodes(
    ctx: &Context,
    seen: &Seen<'_>,
    watched: &Subscription,
    matched: &mut [Arc<CachedNode>],
    by_node: &mut [Vec<Arc<CachedPod>>],
) -> Result<Vec<usize>, Restart> {
    if ctx.node_tasks.has_failures(seen.policy) {
        return Err(Restart::TaskFailed);
    }
    if policy_keys(&ctx.policies.state()) != seen.policies {
        return Err(Restart::Policies);
    }
    let changes = watched.take();
    if changes.relisted {
        return Err(Restart::Relisted);
    }
    let mut changed = Vec::new();
    for name in &changes.nodes {
        let node = ctx.nodes.get(&ObjectRef::new(name));
        let matches = node
            .as_ref()
            .is_some_and(|n| seen.selection.matches(name, n.labels()));
        let Some(i) = position(matched, name) else {
            if matches {
                return Err(Restart::Membership);
            }
            continue;
        };
        let Some(node) = node else {
            return Err(Restart::Membership);
        };
        let owner = seen.older.owner(name, node.labels());
        if !matches || owner != seen.conflicts.get(name).map(String::as_str) {
            return Err(Restart::Membership);
        }
        matched[i] = node;
        changed.push(i);
    }
    for (node, pod) in &changes.pods {
        let Some(i) = position(matched, node) else {
            continue;
        };
        let pods = &mut by_node[i];
        pods.retain(|p| p.metadata.name.as_deref() != Some(pod.name.as_str()));
        if let Some(now) = ctx.agent_pods.get(pod)
            && of_policy(&now, seen.policy)
            && now.node_name.as_deref() == Some(node.as_str())
        {
            pods.push(now);
        }
        changed.push(i);
    }
    Ok(changed)
}

/// What the watches changed in the caches since a [`Subscription`] last took it.
#[derive(Debug, Default)]
pub struct Changed {
    /// Nodes changed, added or deleted.
    pub nodes: HashSet<String>,
    /// Agent pods changed, added or deleted, with their node.
    pub pods: Vec<(String, ObjectRef<CachedPod>)>,
    /// A watch listed its objects again: anything may have changed.
    pub relisted: bool,
}

/// Where the node and agent-pod watches record their changes, for every open [`Subscription`].
#[derive(Debug, Default)]
pub struct Changes {
    open: Mutex<HashMap<u64, Changed>>,
    next: AtomicU64,
}

impl Changes {
    fn record(&self, f: impl Fn(&mut Changed)) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        for changed in open.values_mut() {
            f(changed);
        }
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
    pub fn subscribe(self: &Arc<Self>) -> Subscription {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Changed::default());
        Subscription {
            changes: self.clone(),
            id,
        }
    }
}

/// The changes recorded for one reconcile.
#[derive(Debug)]
pub struct Subscription {
    changes: Arc<Changes>,
    id: u64,
}

impl Subscription {
    /// What changed since the last call (or since the subscription).
    pub fn take(&self) -> Changed {
        self.changes
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&self.id)
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

impl Drop for Subscription {
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
        let changes = Arc::new(Changes::default());
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

    #[test]
    fn a_node_is_found_by_name_in_the_sorted_list() {
        let matched: Vec<Arc<CachedNode>> = ["a", "c", "e"]
            .into_iter()
            .map(|n| Arc::new(node(n)))
            .collect();
        assert_eq!(position(&matched, "c"), Some(1));
        assert_eq!(position(&matched, "d"), None);
    }
}
