//! The other policy, which selects the even-numbered nodes (the pool). Of its reconcile the
//! model runs what touches our nodes: on a node both select that our (older) policy owns, it
//! sees a Conflict and carries out what the core decides for it there; on a node it owns, it
//! cordons for its own upgrade and releases it after. Deleting it releases what it holds
//! (`runtime::reconcile::cleanup`).

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::controller::{cached_node, policies};
use super::{OTHER, POLICY, World, writes};
use crate::pure::observe::{self, ObserveInput};
use crate::pure::overlap::{self, OlderPolicies};
use crate::pure::rollout::RolloutPlan;
use crate::pure::transition::{self, Action, DrainProgress, RetryGate};

/// Whether the other policy owns node `i` (selects it, and ours does not own it).
pub(super) fn owns(w: &World, i: usize) -> bool {
    owner_of(w, i).as_deref() == Some(OTHER)
}

/// The policy owning node `i`, by the core's overlap rules.
fn owner_of(w: &World, i: usize) -> Option<String> {
    w.other.as_ref()?;
    let all = policies(w, &w.spec);
    let node = Arc::new(cached_node(&w.nodes[i]));
    let mut owner = None;
    for p in &all {
        let selection = overlap::selection_of(p, false)?;
        if !selection.matches(&w.nodes[i].name, &w.nodes[i].labels) {
            continue;
        }
        let older = OlderPolicies::of(p, &all, false);
        if overlap::conflicts_of(std::slice::from_ref(&node), &older).is_empty() {
            owner = Some(p.metadata.name.clone().unwrap_or_default());
        }
    }
    owner
}

/// The other policy cordons node `i` it owns for its upgrade (closing the gates).
pub(super) fn cordon(w: &mut World, i: usize) {
    if owns(w, i) {
        let _ = writes::cordon(&mut w.nodes[i], OTHER);
    }
}

/// The other policy releases node `i` after its upgrade.
pub(super) fn release(w: &mut World, i: usize) {
    if owns(w, i) {
        let _ = writes::release(&mut w.nodes[i], OTHER);
    }
}

/// The other policy's reconcile of the nodes it selects that our policy owns: Conflict, with
/// what the core decides for them.
pub(super) fn reconcile(w: &mut World) {
    let Some(other) = w.other.clone() else {
        return;
    };
    if other.older {
        return;
    }
    let all = policies(w, &w.spec);
    let Ok(target) = w.spec.version.parse() else {
        return;
    };
    let Ok(plan) = RolloutPlan::of(&all[1].spec, &target, w.nodes.len(), true) else {
        return;
    };
    let now = Time(w.now);
    for i in 0..w.nodes.len() {
        if owner_of(w, i).as_deref() != Some(POLICY) || !selected(w, i) {
            continue;
        }
        let n = cached_node(&w.nodes[i]);
        let obs = observe::observe(ObserveInput {
            policy: OTHER,
            target_version: &plan.rules.target_version,
            target_parameters: "",
            meta: &n.metadata,
            unschedulable: Some(n.unschedulable),
            pod: None,
            current_hash: "",
            recorded: None,
            conflict_with: Some(POLICY.to_owned()),
            drain: DrainProgress::NotStarted,
            retry: RetryGate::NotYet,
            node_not_ready: None,
            not_created: None,
            now: &now,
        });
        if transition::next(&obs, &plan.rules)
            .actions
            .contains(&Action::Release)
        {
            let _ = writes::release(&mut w.nodes[i], OTHER);
        }
    }
}

/// Whether the other policy selects node `i`.
fn selected(w: &World, i: usize) -> bool {
    let all = policies(w, &w.spec);
    let Some(p) = all.get(1) else {
        return false;
    };
    let n = &w.nodes[i];
    overlap::selection_of(p, false).is_some_and(|s| s.matches(&n.name, &n.labels))
}

/// The other policy is deleted: it releases every node it holds something on.
pub(super) fn delete(w: &mut World) {
    if w.other.is_none() {
        return;
    }
    for i in 0..w.nodes.len() {
        let was_ours = selected(w, i);
        let meta = cached_node(&w.nodes[i]).metadata;
        if observe::holds_ours(&meta, OTHER, || was_ours) {
            let _ = writes::release(&mut w.nodes[i], OTHER);
        }
    }
    w.other = None;
}
