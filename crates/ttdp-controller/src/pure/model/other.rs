//! The other policy, which selects the even-numbered nodes (the pool). Of its reconcile the
//! model runs what touches our nodes: on a node both select that our (older) policy owns, it
//! sees a Conflict and carries out what the core decides for it there; on a node it owns, it
//! cordons for its own upgrade and releases it after. Deleting it releases what it holds
//! (`runtime::reconcile::cleanup`).

use super::controller::{other_holds, other_releases_conflict, other_selects, owner_of};
use super::{OTHER, POLICY, World, writes};

/// Whether the other policy owns node `i` (selects it, and ours does not own it).
pub(super) fn owns(w: &World, i: usize) -> bool {
    owner_of(w, i).as_deref() == Some(OTHER)
}

/// The other policy cordons node `i` it owns for its upgrade (closing the gates).
pub(super) fn cordon(w: &mut World, i: usize) {
    if owns(w, i) {
        let _ = writes::cordon(&mut w.nodes[i], OTHER, None);
    }
}

/// The other policy releases node `i` after its upgrade.
pub(super) fn release(w: &mut World, i: usize) {
    if owns(w, i) {
        let _ = writes::release(&mut w.nodes[i], OTHER);
    }
}

/// The other policy's reconcile of the nodes it selects that our (older) policy owns.
pub(super) fn reconcile(w: &mut World) {
    if w.other.as_ref().is_none_or(|o| o.older) {
        return;
    }
    for i in 0..w.nodes.len() {
        let conflict = owner_of(w, i).as_deref() == Some(POLICY) && other_selects(w, i);
        if conflict && other_releases_conflict(w, i) {
            let _ = writes::release(&mut w.nodes[i], OTHER);
        }
    }
}

/// The other policy is deleted: it releases every node it holds something on.
pub(super) fn delete(w: &mut World) {
    if w.other.is_none() {
        return;
    }
    for i in 0..w.nodes.len() {
        if other_holds(w, i) {
            let _ = writes::release(&mut w.nodes[i], OTHER);
        }
    }
    w.other = None;
}
