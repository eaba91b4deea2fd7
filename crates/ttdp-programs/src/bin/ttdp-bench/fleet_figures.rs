//! The rollout's timing figures, from what the run observed: the node watch's cordons, grants
//! and releases, the policy watch's state changes and status writes, the agents' Ready times
//! and the API server's own times from its audit log.
//!
//! - hand-off: an agent Ready (a slot freed) to the next node really cordoned by ttdp;
//! - overhead: the hand-off's p95 less two node writes at the server's own p95 (the release of
//!   the finished node and the cordon of the next), what the controller adds;
//! - status freshness: a node's cordon or release to its new state in the policy's status;
//! - floor: a node's grant to its agent Ready (DaemonSet controller, scheduler, agent work),
//!   and the rollout's total over whole waves of it.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{Value, json};
use ttdp_programs::rollout_watch::{Transition, node_spans};

use crate::agent_stand_in::AgentReady;
use crate::audit_times::ServerTimes;
use crate::figures::{
    freshness, grant_to_ready, handoffs, ms, overhead_ms, per_second, ratio_to_floor, spread,
};
use crate::handoff_path::{Seen, WallClock, handoff_path};
use crate::node_watch::{NodeChange, NodeEvent};
use crate::status_watch::StatusWrite;

/// What one rollout run observed.
pub struct Observed {
    /// Tenstorrent nodes and the policy's maxUnavailable.
    pub nodes: usize,
    pub slots: usize,
    /// When the new version was set.
    pub started: Instant,
    /// When the wait saw the rollout finished (the total's end when no release was seen).
    pub finished: Instant,
    pub node_events: Vec<NodeEvent>,
    pub transitions: Vec<Transition>,
    /// Every status write of the run, adoption included (the largest status is the run's;
    /// the bytes a second and `status_max_bytes_rollout` are the rollout's).
    pub writes: Vec<StatusWrite>,
    /// The agents that swapped to the new version.
    pub agents: Vec<AgentReady>,
    /// When a pod watch saw each node's agent Ready.
    pub agents_seen_ready: BTreeMap<String, Instant>,
    /// The server's times for the rollout's requests.
    pub server: ServerTimes,
    /// `started` on the audit log's clock.
    pub clock: WallClock,
}

/// The first time at or after `since` each node made `change`.
fn first(events: &[NodeEvent], change: NodeChange, since: Instant) -> BTreeMap<String, Instant> {
    let mut first = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.change == change && e.at >= since)
    {
        first.entry(e.node.clone()).or_insert(e.at);
    }
    first
}

/// The timing figures of a rollout, as the result line carries them.
pub fn timing_figures(o: &Observed) -> Value {
    let cordoned = first(&o.node_events, NodeChange::Cordoned, o.started);
    let granted = first(&o.node_events, NodeChange::Granted, o.started);
    let released = first(&o.node_events, NodeChange::Released, o.started);
    let ready: BTreeMap<String, Instant> =
        o.agents.iter().map(|a| (a.node.clone(), a.at)).collect();
    let handoff = spread(handoffs(
        ready.values().copied().collect(),
        cordoned.values().copied().collect(),
        o.slots,
    ));
    let seen = Seen {
        ready: &ready,
        ready_seen: &o.agents_seen_ready,
        released: &released,
        cordoned: &cordoned,
    };
    let spans = node_spans(&o.transitions, o.started);
    let shown_started: BTreeMap<String, Instant> = spans
        .iter()
        .filter_map(|(n, s)| Some((n.clone(), s.started?)))
        .collect();
    let shown_done: BTreeMap<String, Instant> = spans
        .iter()
        .filter_map(|(n, s)| Some((n.clone(), s.done?)))
        .collect();
    let mut fresh = freshness(&cordoned, &shown_started);
    fresh.extend(freshness(&released, &shown_done));
    let floor = spread(grant_to_ready(&granted, &ready));
    let end = released.values().max().copied().unwrap_or(o.finished);
    let total = end.saturating_duration_since(o.started);
    let patch = spread(o.server.node_patches.clone());
    let rollout_writes: Vec<&StatusWrite> = o.writes.iter().filter(|w| w.at >= o.started).collect();
    let written: usize = rollout_writes.iter().map(|w| w.bytes).sum();
    json!({
        "nodes_cordoned": cordoned.len(),
        "nodes_released": released.len(),
        "agents_finished": ready.len(),
        "handoff_ms": handoff.json(),
        "handoff_p95_ms": ms(handoff.p95),
        "handoff_path_ms": handoff_path(&seen, &o.server.node_patch_spans, &o.clock, o.slots),
        "node_patch_server_ms": patch.json(),
        "overhead_p95_ms": overhead_ms(handoff.p95, patch.p95),
        "status_freshness_ms": spread(fresh).json(),
        "grant_to_ready_ms": floor.json(),
        "floor_ms": ms(floor.p50),
        "total_seconds": total.as_secs_f64(),
        "ratio_to_floor": ratio_to_floor(total, o.nodes, o.slots, floor.p50),
        "status_writes_seen": rollout_writes.len(),
        "status_writes_audited": o.server.status_writes,
        "status_bytes_per_s": per_second(written, total),
        "status_max_bytes": o.writes.iter().map(|w| w.bytes).max().unwrap_or(0),
        "status_max_bytes_rollout": rollout_writes.iter().map(|w| w.bytes).max().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use ttdp_api::NodeState;

    #[test]
    fn a_two_slot_rollout_of_three_nodes_gives_one_hand_off_and_its_figures() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + Duration::from_millis(n);
        let event = |node: &str, change, t| NodeEvent {
            node: node.into(),
            change,
            at: at(t),
        };
        let shown = |node: &str, to, t| Transition {
            at: at(t),
            node: node.into(),
            from: None,
            to,
            version: None,
            why: None,
        };
        let agent = |node: &str, t| AgentReady {
            node: node.into(),
            version: "2.1.0".into(),
            at: at(t),
            worked: true,
        };
        let o = Observed {
            nodes: 3,
            slots: 2,
            started: at(0),
            finished: at(2_000),
            node_events: vec![
                event("a", NodeChange::Cordoned, 10),
                event("b", NodeChange::Cordoned, 12),
                event("a", NodeChange::Granted, 20),
                event("b", NodeChange::Granted, 20),
                event("a", NodeChange::Released, 700),
                // a's agent Ready at 600 -> c cordoned at 750: a 150 ms hand-off.
                event("c", NodeChange::Cordoned, 750),
                event("b", NodeChange::Released, 800),
                event("c", NodeChange::Granted, 760),
                event("c", NodeChange::Released, 1_500),
            ],
            transitions: vec![
                shown("a", NodeState::Cordoning, 5),
                shown("b", NodeState::Cordoning, 5),
                shown("a", NodeState::Done, 1_000),
                shown("c", NodeState::Cordoning, 740),
                shown("b", NodeState::Done, 1_000),
                shown("c", NodeState::Done, 1_600),
            ],
            writes: vec![
                // Adoption's write, before the rollout: the largest of the run.
                StatusWrite {
                    at: t0 - Duration::from_millis(100),
                    bytes: 3_000,
                },
                StatusWrite {
                    at: at(5),
                    bytes: 1_000,
                },
                StatusWrite {
                    at: at(1_000),
                    bytes: 2_000,
                },
            ],
            agents: vec![agent("a", 600), agent("b", 620), agent("c", 1_260)],
            agents_seen_ready: BTreeMap::new(),
            server: ServerTimes {
                node_patches: vec![Duration::from_millis(20); 3],
                node_patch_spans: Vec::new(),
                status_writes: 2,
            },
            clock: WallClock::now(),
        };
        let f = timing_figures(&o);
        assert_eq!(f["handoff_p95_ms"], 150.0);
        assert_eq!(f["overhead_p95_ms"], 110.0);
        // Floor: grant to Ready, 580 / 600 / 500 ms, median 580; 2 waves over 1,500 ms.
        assert_eq!(f["floor_ms"], 580.0);
        assert_eq!(f["total_seconds"], 1.5);
        assert_eq!(f["ratio_to_floor"], 1.5 / 1.16);
        // Freshness: cordons shown before they happened (0); releases 300, 200 and 100 ms late.
        assert_eq!(f["status_freshness_ms"]["p95"], 300.0);
        assert_eq!(f["status_freshness_ms"]["count"], 6);
        assert_eq!(f["status_max_bytes"], 3_000);
        assert_eq!(f["status_max_bytes_rollout"], 2_000);
        assert_eq!(f["status_bytes_per_s"], 3_000.0 / 1.5);
    }
}
