//! Between the rounds of one reconcile: which matched nodes' inputs changed in the caches
//! ([`crate::runtime::process::watch_changes`]), so that only those are observed again. A reconcile
//! follows the fleet this way while it changes ([`crate::runtime::reconcile::pass`]), instead of observing
//! every node again in a new reconcile.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::labels;
use ttdp_api::node_selection::NodeSelection;

use crate::pure::cached::{CachedNode, CachedPod};
use crate::pure::overlap::OlderPolicies;
use crate::runtime::process::context::Context;
use crate::runtime::process::watch_changes::ChangeSubscription;

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

/// What of a policy decides which policy owns which node: its uid, generation and whether it is
/// being deleted.
pub type PolicyKey = (Option<String>, Option<i64>, bool);

/// Every policy's [`PolicyKey`], sorted.
pub fn policy_keys(policies: &[Arc<TenstorrentDriverPolicy>]) -> Vec<PolicyKey> {
    let mut keys: Vec<_> = policies.iter().map(|p| key_of(p)).collect();
    keys.sort_unstable();
    keys
}

/// [`policy_keys`], with `held`'s own key as the reconcile holds it: a reconcile triggered
/// before the cache took a newer spec (a new leader's first one, while its watches sync) then
/// differs from the cache at its first look and ends, and the next one starts from the newer
/// spec, instead of following the older one until its time bound.
pub fn policy_keys_as_held(
    policies: &[Arc<TenstorrentDriverPolicy>],
    held: &TenstorrentDriverPolicy,
) -> Vec<PolicyKey> {
    let mut keys: Vec<_> = policies
        .iter()
        .map(|p| match p.metadata.uid == held.metadata.uid {
            true => key_of(held),
            false => key_of(p),
        })
        .collect();
    keys.sort_unstable();
    keys
}

fn key_of(p: &TenstorrentDriverPolicy) -> PolicyKey {
    (
        p.metadata.uid.clone(),
        p.metadata.generation,
        p.metadata.deletion_timestamp.is_some(),
    )
}

/// What a reconcile decided from when it started (selection, conflicts, policies): a change to
/// any of it ends the following.
#[derive(Debug)]
pub struct FollowBasis<'a> {
    /// The policy.
    pub policy: &'a str,
    /// Its node selection.
    pub selection: &'a NodeSelection,
    /// The older policies (for conflicts).
    pub older: &'a OlderPolicies,
    /// The matched nodes in conflict, with the policy owning them.
    pub conflicts: &'a BTreeMap<String, String>,
    /// [`policy_keys`] when the reconcile started.
    pub policies: &'a [PolicyKey],
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
    /// The policy's agent DaemonSet changed (a hand edit is reverted by the next apply).
    DaemonSet,
}

/// Brings `matched` and `by_node` (see [`agent_pods_by_node`]) up to date with what the watches
/// changed since the last call and returns the indexes (in `matched`) of the nodes whose node
/// object or agent pods changed.
pub fn changed_nodes(
    ctx: &Context,
    basis: &FollowBasis<'_>,
    watched: &ChangeSubscription,
    matched: &mut [Arc<CachedNode>],
    by_node: &mut [Vec<Arc<CachedPod>>],
) -> Result<Vec<usize>, Restart> {
    if ctx.node_tasks.has_failures(basis.policy) {
        return Err(Restart::TaskFailed);
    }
    if policy_keys(&ctx.caches.policies.state()) != basis.policies {
        return Err(Restart::Policies);
    }
    let changes = watched.take();
    if changes.relisted {
        return Err(Restart::Relisted);
    }
    if changes.daemonsets.contains(basis.policy) {
        return Err(Restart::DaemonSet);
    }
    let mut changed = Vec::new();
    for name in &changes.nodes {
        let node = ctx.caches.nodes.get(&ObjectRef::new(name));
        let matches = node
            .as_ref()
            .is_some_and(|n| basis.selection.matches(name, n.labels()));
        let Some(i) = position(matched, name) else {
            if matches {
                return Err(Restart::Membership);
            }
            continue;
        };
        let Some(node) = node else {
            return Err(Restart::Membership);
        };
        let owner = basis.older.owner(name, node.labels());
        if !matches || owner != basis.conflicts.get(name).map(String::as_str) {
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
        if let Some(now) = ctx.caches.agent_pods.get(pod)
            && of_policy(&now, basis.policy)
            && now.node_name.as_deref() == Some(node.as_str())
        {
            pods.push(now);
        }
        changed.push(i);
    }
    Ok(changed)
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
            deleted: false,
        }
    }

    fn policy(uid: &str, generation: i64) -> Arc<TenstorrentDriverPolicy> {
        let spec = serde_json::from_value(serde_json::json!({"version": "2.8.0"})).unwrap();
        let mut p = TenstorrentDriverPolicy::new(uid, spec);
        p.metadata.uid = Some(uid.into());
        p.metadata.generation = Some(generation);
        Arc::new(p)
    }

    #[test]
    fn a_reconcile_holding_an_older_spec_than_the_cache_sees_a_change_at_once() {
        let cache = [policy("a", 2), policy("b", 1)];
        let held = policy("a", 1);
        let basis = policy_keys_as_held(&cache, &held);
        assert_ne!(policy_keys(&cache), basis, "the next look ends the pass");
        assert_eq!(policy_keys(&cache), policy_keys_as_held(&cache, &cache[0]));
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
