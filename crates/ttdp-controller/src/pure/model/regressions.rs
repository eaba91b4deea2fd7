//! The property test's shrunk counterexamples, as ordinary tests: each names the behaviour it
//! pins, replays the events that broke it and checks every invariant after each event. The
//! first tests show the model itself running a rollout through.

use ttdp_api::NodeState;

use super::events::Event::{self, *};
use super::property::run;
use super::{Setup, World};

fn setup(nodes: usize, max_unavailable: usize, drain: bool) -> Setup {
    Setup {
        nodes,
        max_unavailable,
        drain,
        canary: None,
        schedule: false,
        wait_fail: false,
        fresh: Vec::new(),
        other_older: None,
    }
}

fn holds(setup: &Setup, events: &[Event]) -> World {
    run(setup, events).unwrap_or_else(|why| panic!("{why}"))
}

/// Every node Done at `version`, uncordoned, without a grant.
fn all_done_at(w: &World, version: &str) {
    for n in &w.nodes {
        let state = w.entries.get(n.name.as_str()).map(|e| e.state);
        let clean = !n.unschedulable && n.grant_of(super::POLICY).is_none() && !n.gates_closed();
        assert!(
            state == Some(NodeState::Done) && n.loaded.as_deref() == Some(version) && clean,
            "{} is not Done at {version}:\n{}",
            n.name,
            w.brief()
        );
    }
}

#[test]
fn the_model_rolls_an_upgrade_with_drain_through_every_node() {
    let events = [
        Version(1),
        Progress,
        Progress,
        Progress,
        Progress,
        Progress,
        Progress,
    ];
    all_done_at(&holds(&setup(3, 1, true), &events), "2.8.0");
}

#[test]
fn the_model_rolls_an_upgrade_through_a_canary() {
    let mut s = setup(3, 2, false);
    s.canary = Some((1, 0, true));
    let events = [Version(1), Progress, Progress, Progress];
    all_done_at(&holds(&s, &events), "2.8.0");
}

/// `paused_nodes_stay_put`. While paused the DaemonSet keeps its template, so after a version
/// change the agents are still "current" and Ready at the old version: `decide::settled` sends
/// the Done nodes to `upgrading(true)`, which records Upgrading (WaitingForVersionLabel); past
/// the node timeout they fail by NodeTimeout, still paused.
#[test]
fn pause_then_version_change_leaves_done_nodes_alone() {
    holds(&setup(2, 1, false), &[Pause(true), Version(1), Reconcile]);
}

/// `paused_nodes_stay_put` with a signing Secret staged, alone and with a version: nothing
/// moves while paused, the DaemonSet keeps the Secret it had, and once unpaused both go out
/// (the agents restart with the Secret and the version rolls through).
#[test]
fn a_signing_change_staged_while_paused_goes_out_after_the_pause() {
    let s = setup(2, 1, true);
    let paused = holds(
        &s,
        &[
            Progress,
            Pause(true),
            Signing(Some(0)),
            Reconcile,
            Progress,
            Signing(Some(1)),
            Version(1),
            Progress,
            Tick(700),
            Progress,
        ],
    );
    all_done_at(&paused, "2.7.0");
    assert_eq!(paused.daemonset_signing, None, "{}", paused.brief());
    let mut events = vec![
        Progress,
        Pause(true),
        Signing(Some(0)),
        Version(1),
        Progress,
    ];
    events.extend([
        Pause(false),
        Progress,
        Progress,
        Progress,
        Progress,
        Progress,
        Progress,
    ]);
    let unpaused = holds(&s, &events);
    all_done_at(&unpaused, "2.8.0");
    assert_eq!(
        unpaused.daemonset_signing.as_deref(),
        Some("tt-kmd-signing"),
        "{}",
        unpaused.brief()
    );
}

/// `rollback_target_ran_somewhere`. A rollout to 2.8.0 begins, then spec.version moves to
/// 2.9.0 before any node ran 2.8.0; the canary times out and the rollback goes to 2.8.0:
/// `canary::begin` takes the previous rollout's target as `fromVersion`.
#[test]
fn auto_rollback_returns_to_a_version_the_nodes_ran() {
    let mut s = setup(2, 1, false);
    s.canary = Some((1, 0, true));
    holds(
        &s,
        &[Version(1), Reconcile, Version(2), Tick(700), Reconcile],
    );
}

/// `cordoned_nodes_have_gates_closed`. An older policy cordons a node both select and closes
/// its gates; ours sees the node as Conflict and "holds ours" because `observe::observe` takes
/// any closed gate for ours (`gates_closed_by_us`), so `decide::decide` releases it and the
/// release reopens the other policy's gates under its cordon.
#[test]
fn a_conflict_node_keeps_the_older_policys_gates_closed() {
    let mut s = setup(2, 1, false);
    s.other_older = Some(true);
    holds(&s, &[OtherCordons(0), Reconcile]);
}

/// `cordoned_nodes_have_gates_closed`, the same cause seen from the newer policy: it sees our
/// cordoned node as its Conflict with gates closed, and releases it.
#[test]
fn a_newer_overlapping_policy_leaves_our_gates_closed() {
    let events = [OtherCreated, Version(1), Reconcile, OtherReconciles];
    holds(&setup(2, 1, true), &events);
}

/// `cordoned_nodes_have_gates_closed`. Deleting a newer policy that selects our cordoned node
/// releases what `observe::holds_ours` says it holds there: the gates, which we closed.
#[test]
fn deleting_a_newer_overlapping_policy_keeps_our_gates_closed() {
    let events = [OtherCreated, Version(1), Reconcile, OtherDeleted];
    holds(&setup(2, 1, true), &events);
}

/// `at_most_max_unavailable_cordoned`. A drain fails, the node goes Failed with a release, the
/// release write fails: the node keeps our cordon, but `rollout::takes_slot` counts no Failed
/// node, so the next node is cordoned too.
#[test]
fn a_failed_node_whose_release_fails_keeps_its_slot() {
    let events = [
        Version(1),
        Reconcile,
        Reconcile,
        NodeWriteFails(0),
        DrainFails {
            node: 0,
            jobs: false,
        },
        Reconcile,
    ];
    holds(&setup(2, 1, true), &events);
}

/// `no_grant_without_slot_and_drain`, the same cause without drain: a NodeTimeout whose release
/// fails leaves the node its grant, and the next node is granted too.
#[test]
fn a_timed_out_node_whose_release_fails_keeps_its_slot() {
    let events = [
        Version(1),
        Reconcile,
        Tick(700),
        NodeWriteFails(0),
        Reconcile,
    ];
    holds(&setup(2, 1, false), &events);
}

/// `no_grant_without_slot_and_drain`. A granted node gets the skip label and the release of it
/// (`act::release_unmatched`) fails: it keeps its grant (its agent may still swap), but the
/// planner counts slots over the matched nodes only, so the next node is granted.
#[test]
fn a_node_leaving_the_selection_keeps_its_slot_until_released() {
    let events = [
        Version(1),
        Reconcile,
        NodeWriteFails(0),
        Skip { node: 0, on: true },
        Reconcile,
    ];
    holds(&setup(2, 1, false), &events);
}

/// `no_grant_without_slot_and_drain`. A node in Upgrading with its grant for 2.8.0 and an agent
/// pod for 2.8.0 goes NotReady, and spec.version moves to 2.9.0: `decide::grant_or_gate` sends
/// it back through `start`, which records Pending (NodeNotReady) without releasing the old
/// grant. The pod still asks for 2.8.0 and may swap with it, while the slot goes to the next
/// node.
#[test]
fn a_node_sent_back_to_pending_gives_up_its_old_grant() {
    let events = [
        Version(1),
        Reconcile,
        Agent(0),
        Agent(0),
        Version(2),
        NodeNotReady(0),
        Reconcile,
    ];
    holds(&setup(3, 1, false), &events);
}

/// `no_grant_without_slot_and_drain`, the same cause through the canary gate: the second node,
/// Upgrading to 2.8.0 when spec.version moves to 2.9.0, waits for the new canary in Pending
/// with its 2.8.0 grant and a 2.8.0 agent pod, while the canary is granted 2.9.0.
#[test]
fn a_node_waiting_for_a_new_canary_gives_up_its_old_grant() {
    let mut s = setup(2, 1, false);
    s.canary = Some((1, 0, false));
    holds(&s, &[Version(1), Progress, Progress, Version(2), Reconcile]);
}

/// `no_grant_without_slot_and_drain`. A node is upgraded; its cordon is lifted but the status
/// write recording Uncordoning fails, so it is still recorded Upgrading and `pass::observe_node`
/// counts it cordoned by us. spec.version then changes: `decide::grant_or_gate` takes "in
/// Upgrading and cordoned for us" as "drained" and grants 2.9.0 to a node that is neither
/// cordoned nor drained.
#[test]
fn an_unrecorded_uncordon_is_not_granted_without_a_drain() {
    let events = [
        Version(1),
        Reconcile,
        Progress,
        StatusWriteFails,
        Agent(0),
        Reconcile,
        Version(2),
        Reconcile,
    ];
    holds(&setup(2, 1, true), &events);
}

/// `paused_nodes_stay_put`. A Done node's kubelet stops and comes back: its agent pod is not
/// Ready yet but its report still says Ready, which `observe::agent_condition` reads as
/// Working, and `decide::settled` sends a node with a current Working agent to Upgrading
/// (Installing), though it runs the target; paused or not (then its step can time out).
#[test]
fn a_done_node_whose_agent_blips_stays_done_while_paused() {
    let events = [Pause(true), NodeNotReady(0), NodeReady(0), Reconcile];
    holds(&setup(2, 1, false), &events);
}

/// `released_only_with_a_driver`. The swap fails on a cordoned node and nothing can be loaded
/// back; the node goes Failed with a release, and `pass::lift_cordons` lifts the cordon of
/// every node whose only action is a release before the status write. That write fails: the
/// node is schedulable with no driver while the status still shows it Upgrading, no reason.
#[test]
fn a_node_whose_swap_failed_is_released_only_once_its_failure_shows() {
    let events = [
        Version(1),
        Reconcile,
        Reconcile,
        DrainDone(0),
        Reconcile,
        Agent(0),
        Agent(0),
        StatusWriteFails,
        AgentFails {
            node: 0,
            unloaded: true,
        },
        Reconcile,
    ];
    holds(&setup(2, 1, true), &events);
}

/// `paused_nodes_stay_put`. While paused, a node leaves the selection and comes back: its new
/// agent pod is not Ready yet but the target is loaded, and the node went Pending → Upgrading
/// (Installing) for an install that was not happening (and, unpaused, held a slot for it).
#[test]
fn a_node_rejoining_on_the_target_stays_pending_until_its_agent_is_ready() {
    let events = [
        Pause(true),
        Skip { node: 2, on: true },
        Progress,
        Skip { node: 2, on: false },
        Reconcile,
        Agent(2),
        Reconcile,
    ];
    holds(&setup(2, 1, false), &events);
}

/// The canary's nodes time out while the policy is paused and the canary rolls back: the
/// DaemonSet keeps the version it was applied with until the pause ends, so the rollback must
/// wait for it too. It used to aim the nodes at the version rolled back to while their agents
/// still asked for the new one, and took the waiting nodes out of Pending while paused.
#[test]
fn a_rollback_decided_while_paused_waits_for_the_unpause() {
    let mut s = setup(2, 2, false);
    s.canary = Some((2, 0, true));
    let paused = [
        Version(1),
        Reconcile,
        Pause(true),
        Tick(700),
        Progress,
        Reconcile,
    ];
    let w = holds(&s, &paused);
    for n in &w.nodes {
        let state = w.entries.get(n.name.as_str()).map(|e| e.state);
        assert_ne!(state, Some(NodeState::Upgrading), "{}", w.brief());
    }
    let mut all = paused.to_vec();
    all.extend([
        Pause(false),
        Progress,
        Progress,
        Progress,
        Progress,
        Progress,
    ]);
    all_done_at(&holds(&s, &all), "2.7.0");
}

/// A restart loses the status while a node we cordoned is at the target but its agent is not
/// Ready (its node went down): the node was taken up again in Upgrading without a drain, and
/// when the version then changed it was granted the swap at once, undrained.
#[test]
fn a_node_taken_up_again_after_a_lost_status_is_drained_before_its_grant() {
    let events = [
        Version(1),
        Reconcile,
        NodeNotReady(0),
        Restart { status: true },
        Version(0),
        Reconcile,
        Version(1),
        Reconcile,
    ];
    holds(&setup(3, 2, true), &events);
}

/// A node whose agent stopped with it is sent back to Pending with its release, and the
/// release fails: its grant stays, and its agent may swap once the node is back. It used to
/// give that slot away in the same plan, so three nodes held a slot with maxUnavailable 2.
#[test]
fn a_release_that_fails_keeps_its_slot_whatever_the_node_goes_to() {
    let events = [
        Version(2),
        Reconcile,
        NodeNotReady(1),
        Progress,
        NodeWriteFails(1),
        Reconcile,
        Progress,
        Version(1),
        Reconcile,
    ];
    holds(&setup(3, 2, false), &events);
}

/// A node that failed its upgrade stays Failed, with its attempts, when the controller restarts
/// with the policy's status lost: the record on the node carries them, so its back-off and the
/// failure budget go on counting.
#[test]
fn a_failure_survives_a_restart_that_lost_the_status() {
    let failing = [
        Version(1),
        Reconcile,
        Agent(0),
        Agent(0),
        Reconcile,
        Agent(0),
        AgentFails {
            node: 0,
            unloaded: false,
        },
        Reconcile,
    ];
    let failed = holds(&setup(2, 1, false), &failing);
    let before = failed.entries.get("n0").expect("n0 has an entry");
    assert_eq!(before.state, NodeState::Failed, "{}", failed.brief());
    let restarted = holds(
        &setup(2, 1, false),
        &[&failing[..], &[Restart { status: true }, Reconcile]].concat(),
    );
    let after = restarted.entries.get("n0").expect("n0 keeps its entry");
    assert_eq!(after.state, NodeState::Failed, "{}", restarted.brief());
    assert_eq!(after.attempts, before.attempts);
    assert_eq!(after.reason, before.reason);
}

/// A round lifted a node's cordon (the version went back while it drained) and could not
/// write the rollout's new state, so it ended there; the version came back and the old drain
/// finished. The node was granted the swap uncordoned, its old drain taken for a new one. Now
/// a lifted cordon forgets the node's drain, and a Draining node that lost its cordon is
/// cordoned again first.
#[test]
fn a_drain_from_before_a_lifted_cordon_grants_nothing() {
    let mut s = setup(2, 1, true);
    s.schedule = true;
    let events = [
        Version(1),
        Reconcile,
        Reconcile,
        StatusWriteFails,
        Version(0),
        Reconcile,
        Version(1),
        DrainDone(0),
        Reconcile,
    ];
    let w = holds(&s, &events);
    let n0 = &w.nodes[0];
    assert!(n0.grant_of(super::POLICY).is_none(), "{}", w.brief());
}
