//! Known wrong behaviours that the safety invariants do not express (a promise broken, or a
//! rollout that stalls), replayed on the model as scenarios with their own assertions. Each
//! also checks every invariant on the way.

use ttdp_api::NodeState;

use super::events::Event::*;
use super::property::run;
use super::{POLICY, Setup, World};

fn setup(nodes: usize, drain: bool) -> Setup {
    Setup {
        nodes,
        max_unavailable: 1,
        drain,
        canary: None,
        schedule: false,
        wait_fail: false,
        fresh: Vec::new(),
        other_older: None,
    }
}

fn state_of(w: &World, node: &str) -> Option<(NodeState, Option<String>)> {
    let entry = w.entries.get(node)?;
    Some((entry.state, entry.reason.clone()))
}

/// `waitForCompletion.onTimeout: Fail` fails the node and leaves its pods alone: the node
/// stays cordoned until a retry (its jobs would be scheduled back onto it otherwise).
#[test]
fn a_node_failed_by_its_jobs_timeout_stays_cordoned() {
    let mut s = setup(2, true);
    s.wait_fail = true;
    let jobs_timed_out = DrainFails {
        node: 0,
        jobs: true,
    };
    let events = [Version(1), Reconcile, Reconcile, jobs_timed_out, Reconcile];
    let w = run(&s, &events).unwrap_or_else(|why| panic!("{why}"));
    let n0 = &w.nodes[0];
    assert_eq!(
        state_of(&w, "n0").map(|(s, _)| s),
        Some(NodeState::Failed),
        "{}",
        w.brief()
    );
    assert!(n0.cordoned_by(POLICY), "n0 was uncordoned:\n{}", w.brief());
}

/// Two nodes fail the rollout to 2.8.0 and halt it (more Failed than maxUnavailable); a new
/// spec.version is a new rollout, whose budget the old failures do not use up: the nodes that
/// failed before are back in line, one node starts, and no node is held by a halt.
#[test]
fn a_new_version_starts_despite_the_old_rollouts_failures() {
    let fail = |node| AgentFails {
        node,
        unloaded: false,
    };
    let events = [
        Version(1),
        Reconcile,
        Agent(0),
        Agent(0),
        fail(0),
        Reconcile,
        Agent(1),
        Agent(1),
        fail(1),
        Reconcile,
        Version(2),
        Reconcile,
    ];
    let w = run(&setup(3, false), &events).unwrap_or_else(|why| panic!("{why}"));
    let states: Vec<_> = ["n0", "n1", "n2"]
        .iter()
        .map(|n| state_of(&w, n).unwrap_or((NodeState::Pending, None)))
        .collect();
    assert!(
        states.iter().any(|(s, _)| *s == NodeState::Upgrading),
        "no node started:\n{}",
        w.brief()
    );
    for (state, reason) in &states {
        assert_ne!(*state, NodeState::Failed, "{}", w.brief());
        assert_ne!(reason.as_deref(), Some("RolloutHalted"), "{}", w.brief());
    }
}

/// The first node in name order is NotReady when a canaried rollout begins: the Ready nodes
/// still get the new version.
#[test]
fn a_not_ready_canary_does_not_stall_the_fleet() {
    let mut s = setup(3, false);
    s.canary = Some((1, 0, false));
    let events = [
        NodeNotReady(0),
        Version(1),
        Progress,
        Progress,
        Progress,
        Progress,
    ];
    let w = run(&s, &events).unwrap_or_else(|why| panic!("{why}"));
    for n in &w.nodes[1..] {
        assert_eq!(n.loaded.as_deref(), Some("2.8.0"), "{}", w.brief());
    }
}
