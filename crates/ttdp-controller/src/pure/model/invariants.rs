//! What must hold after every event, whatever came before. Each check returns the violation as
//! a message that says what went wrong and shows the world.
//!
//! "A slot" is what `maxUnavailable` bounds: a node holds one while it carries our cordon, or
//! a live grant of ours: for a version it does not run yet, which its agent pod (or the next
//! one the DaemonSet makes) asks for, so it may swap the module any moment.

use ttdp_api::driver::v1alpha1::rollout_phase as phase;
use ttdp_api::names::CORDON_OWNER_PREFIX;
use ttdp_api::{NodeState, NodeStatus};

use super::events::Event;
use super::{ModelNode, POLICY, World, other};
use crate::pure::transition::reasons;

/// Every invariant, after `event` took `before` to `after`, but those named (comma-separated)
/// in `TTDP_MODEL_SKIP`: looking for further violations while a known one is being fixed.
pub(super) fn check(before: &World, event: &Event, after: &World) -> Result<(), String> {
    let skip = std::env::var("TTDP_MODEL_SKIP").unwrap_or_default();
    let checks = [
        at_most_max_unavailable_cordoned(after),
        no_grant_without_slot_and_drain(after),
        paused_nodes_stay_put(before, event, after),
        released_only_with_a_driver(before, after),
        rollback_target_ran_somewhere(after),
        cordoned_nodes_have_gates_closed(after),
        failures_are_never_forgotten(before, event, after),
    ];
    for result in checks {
        if result
            .as_ref()
            .is_err_and(|why| skip.split(',').any(|s| !s.is_empty() && why.starts_with(s)))
        {
            continue;
        }
        result.map_err(|why| format!("{why}\nafter {event:?}:\n{}", after.brief()))?;
    }
    Ok(())
}

/// At most `maxUnavailable` nodes carry our cordon.
pub(super) fn at_most_max_unavailable_cordoned(w: &World) -> Result<(), String> {
    let cordoned: Vec<&str> = w
        .nodes
        .iter()
        .filter(|n| n.cordoned_by(POLICY))
        .map(|n| n.name.as_str())
        .collect();
    if cordoned.len() > w.setup.max_unavailable {
        return Err(format!(
            "at_most_max_unavailable_cordoned: {} nodes cordoned by us ({cordoned:?}), maxUnavailable is {}",
            cordoned.len(),
            w.setup.max_unavailable
        ));
    }
    Ok(())
}

/// Our grant on `n` for a version it does not run yet, which an agent may act on: its running
/// pod asks for that version, or the DaemonSet's next pod will.
fn live_grant(w: &World, n: &ModelNode) -> Option<String> {
    let g = n
        .grant_of(POLICY)
        .filter(|g| n.loaded.as_ref() != Some(g))?;
    let pod = n
        .pod
        .as_ref()
        .is_some_and(|p| !p.terminating && p.target == g);
    let next = w.daemonset.as_ref().is_some_and(|(_, v)| *v == g);
    (pod || next).then_some(g)
}

/// No grant without a slot: the nodes holding our cordon or a live grant of ours are at most
/// `maxUnavailable`; and with drain enabled, a node granted the swap of a loaded module is
/// cordoned and its drain finished since its cordon.
pub(super) fn no_grant_without_slot_and_drain(w: &World) -> Result<(), String> {
    let holding: Vec<&str> = w
        .nodes
        .iter()
        .filter(|n| n.cordoned_by(POLICY) || live_grant(w, n).is_some())
        .map(|n| n.name.as_str())
        .collect();
    if holding.len() > w.setup.max_unavailable {
        return Err(format!(
            "no_grant_without_slot_and_drain: {} nodes hold a slot by our cordon or grant ({holding:?}), maxUnavailable is {}",
            holding.len(),
            w.setup.max_unavailable
        ));
    }
    for n in &w.nodes {
        let swap = n.loaded.is_some() && live_grant(w, n).is_some();
        if w.setup.drain && swap && !(n.unschedulable && n.drained) {
            return Err(format!(
                "no_grant_without_slot_and_drain: {} is granted {:?} over {:?} without a finished drain behind a cordon (cordoned={}, drained={})",
                n.name,
                live_grant(w, n),
                n.loaded,
                n.unschedulable,
                n.drained
            ));
        }
    }
    Ok(())
}

/// While paused (before and after a reconcile), no node is newly cordoned or granted, none
/// leaves Done or Pending for a step (as the status shows it, which may lag the nodes by a
/// failed write), and none fails for waiting. A first install (nothing loaded) is the agent's own business and may
/// move on; a node whose agent fails may be Failed. "Failing for waiting" is a `NodeTimeout`
/// of a node that was Pending, Done, or held at a step boundary by the pause (reason Paused).
pub(super) fn paused_nodes_stay_put(
    before: &World,
    event: &Event,
    after: &World,
) -> Result<(), String> {
    if *event != Event::Reconcile || !before.spec.paused || !after.spec.paused {
        return Ok(());
    }
    for (name, was) in &before.entries {
        let Some(now) = after.entries.get(name) else {
            continue;
        };
        let held = matches!(was.state, NodeState::Pending | NodeState::Done);
        let paused = held || was.reason.as_deref() == Some(reasons::PAUSED);
        let timed_out =
            now.state == NodeState::Failed && now.reason.as_deref() == Some(reasons::NODE_TIMEOUT);
        if paused && timed_out {
            return Err(format!(
                "paused_nodes_stay_put: {name} failed by NodeTimeout while held by the pause (was {:?} {:?})",
                was.state, was.reason
            ));
        }
        let first_install = before.node(name).is_some_and(|n| n.loaded.is_none());
        // the status lags the nodes by a write that failed: a node that carried our cordon or
        // grant already was started before the pause
        let started = before.node(name).is_some_and(started_by_us);
        if held && now.state.is_in_flight() && !first_install && !started {
            return Err(format!(
                "paused_nodes_stay_put: {name} went from {:?} to {:?} ({:?}) while paused",
                was.state, now.state, now.reason
            ));
        }
    }
    for (n, was) in after.nodes.iter().zip(&before.nodes) {
        // a node the status showed in flight had begun: its cordon may be written only now
        let in_flight =
            (before.entries.get(n.name.as_str())).is_some_and(|e| e.state.is_in_flight());
        if started_by_us(n) && !started_by_us(was) && was.loaded.is_some() && !in_flight {
            return Err(format!(
                "paused_nodes_stay_put: {} was cordoned or granted while paused",
                n.name
            ));
        }
    }
    Ok(())
}

/// The node carries our cordon or our grant: its upgrade has begun.
fn started_by_us(n: &ModelNode) -> bool {
    n.cordoned_by(POLICY) || n.grant_of(POLICY).is_some()
}

/// No node of ours has our cordon lifted while no driver is loaded on it, unless its record on
/// the node shows it Failed with the reason and message. A node that left our selection (skip label, owned by
/// an older policy) is the admin's: it is not checked.
pub(super) fn released_only_with_a_driver(before: &World, after: &World) -> Result<(), String> {
    for (i, n) in after.nodes.iter().enumerate() {
        let lifted = before.nodes[i].cordoned_by(POLICY) && !n.cordoned_by(POLICY);
        if !lifted || n.loaded.is_some() || n.skipped() || other::owns(after, i) {
            continue;
        }
        let entry = after.entries.get(n.name.as_str());
        // Shown on the node itself, whose record was written before the release: the status
        // is a view that may lag.
        let record = ttdp_api::node_record::NodeRecord::of_policy(&n.annotations, POLICY);
        let shown = record.is_some_and(|r| {
            r.state == NodeState::Failed && r.reason.is_some() && r.message.is_some()
        });
        if !shown {
            return Err(format!(
                "released_only_with_a_driver: {} was released with no driver loaded, recorded {:?}",
                n.name,
                entry.map(|e| (e.state, e.reason.clone()))
            ));
        }
    }
    Ok(())
}

/// A restart forgets no failure the controller decided before acting on the node, even one
/// that lost the status: the node keeps its failed attempts (its back-off and the failure
/// budget count from them) and a Failed node stays Failed, unless the status it reads shows a
/// later decision (a retry, or Done, that could not be written on the node).
pub(super) fn failures_are_never_forgotten(
    before: &World,
    event: &Event,
    after: &World,
) -> Result<(), String> {
    if !matches!(event, Event::Restart { .. }) {
        return Ok(());
    }
    for (name, &(k, failed)) in &before.decided_failures {
        let a = after.entries.get(name.as_str());
        // What the restarted controller read: the view, where it is newer than the record.
        let from_view = |a: &NodeStatus| after.view.1.get(name.as_str()).is_some_and(|v| **v == *a);
        let kept = a.is_some_and(|a| {
            from_view(a) || (a.attempts >= Some(k) && (!failed || a.state == NodeState::Failed))
        });
        if !kept {
            return Err(format!(
                "failures_are_never_forgotten: {name} had {k} failed attempts (Failed: {failed}), now {:?}",
                a.map(|a| (a.state, a.attempts))
            ));
        }
    }
    Ok(())
}

/// A rollback goes to a version some node ran.
pub(super) fn rollback_target_ran_somewhere(w: &World) -> Result<(), String> {
    let Some(rollout) = &w.status.rollout else {
        return Ok(());
    };
    if !matches!(
        rollout.phase.as_str(),
        phase::ROLLING_BACK | phase::ROLLED_BACK
    ) {
        return Ok(());
    }
    match &rollout.from_version {
        Some(from) if w.ever_loaded.contains(from) => Ok(()),
        from => Err(format!(
            "rollback_target_ran_somewhere: rolling back to {from:?}, which no node ran (ran: {:?})",
            w.ever_loaded
        )),
    }
}

/// Every node cordoned by a ttdp policy has its deploy gates closed.
pub(super) fn cordoned_nodes_have_gates_closed(w: &World) -> Result<(), String> {
    for n in &w.nodes {
        let ours = n
            .cordon_owner()
            .is_some_and(|o| o.starts_with(CORDON_OWNER_PREFIX));
        if n.unschedulable && ours && !n.gates_closed() {
            return Err(format!(
                "cordoned_nodes_have_gates_closed: {} is cordoned by {:?} with its deploy gates open",
                n.name,
                n.cordon_owner()
            ));
        }
    }
    Ok(())
}
