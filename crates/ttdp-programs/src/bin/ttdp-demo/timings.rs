//! What the demo measures: how long each phase took, how long each node spent being upgraded,
//! and how long nodes stayed in each state on average.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;
use ttdp_api::NodeState;

use ttdp_programs::Transition;
use ttdp_programs::rollout_watch::node_spans;

/// One named phase of the demo and how many seconds it took.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: String,
    pub seconds: f64,
}

/// Per-node and per-state times of one rollout, from its transitions.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutTimes {
    /// Seconds from a node's first state in flight to Done, per node.
    pub per_node: BTreeMap<String, f64>,
    /// Average seconds a node spent in each in-flight state.
    pub per_state: BTreeMap<NodeState, f64>,
    /// The largest number of nodes holding a slot at once: Cordoning to Upgrading (an
    /// Uncordoning node's cordon is lifted already, its slot given to the next node).
    pub max_in_flight: usize,
}

impl RolloutTimes {
    /// Times of the transitions that happened at or after `since` (the rollout's start).
    pub fn from_transitions(transitions: &[Transition], since: Instant) -> Self {
        let per_node = node_spans(transitions, since)
            .into_iter()
            .filter_map(|(node, span)| Some((node, span.duration()?.as_secs_f64())))
            .collect();
        // Each node's latest transition: the time from it to the node's next one is time spent
        // in its state.
        let mut latest: BTreeMap<&str, &Transition> = BTreeMap::new();
        let mut in_state: BTreeMap<NodeState, Vec<Duration>> = BTreeMap::new();
        let mut max_in_flight = 0;
        for t in transitions.iter().filter(|t| t.at >= since) {
            if let Some(previous) = latest.insert(&t.node, t)
                && previous.to.is_in_flight()
            {
                let time = t.at.saturating_duration_since(previous.at);
                in_state.entry(previous.to).or_default().push(time);
            }
            let flying = (latest.values())
                .filter(|t| t.to.is_in_flight() && t.to != NodeState::Uncordoning)
                .count();
            max_in_flight = max_in_flight.max(flying);
        }
        let per_state = in_state
            .into_iter()
            .map(|(state, times)| {
                let total: Duration = times.iter().sum();
                (state, total.as_secs_f64() / times.len() as f64)
            })
            .collect();
        Self {
            per_node,
            per_state,
            max_in_flight,
        }
    }
}

/// The timings block printed at the end: one row per phase, the total, and the upgrade's times.
pub fn render(phases: &[Phase], upgrade: &RolloutTimes, max_unavailable: &str) -> String {
    let mut rows: Vec<(&str, String)> = phases
        .iter()
        .map(|p| (p.name.as_str(), format!("{:>7.1} s", p.seconds)))
        .collect();
    let total: f64 = phases.iter().map(|p| p.seconds).sum();
    rows.push(("total", format!("{total:>7.1} s")));
    let times: Vec<f64> = upgrade.per_node.values().copied().collect();
    if !times.is_empty() {
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        let max = times.iter().copied().fold(0.0, f64::max);
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let count = times.len();
        let value = format!("min {min:.1} s, mean {mean:.1} s, max {max:.1} s over {count} nodes");
        rows.push(("per node upgrade (Cordoning to Done)", value));
    }
    if !upgrade.per_state.is_empty() {
        let states: Vec<String> = upgrade
            .per_state
            .iter()
            .map(|(state, t)| format!("{state} {t:.1} s"))
            .collect();
        rows.push(("mean time in state", states.join(", ")));
    }
    if upgrade.max_in_flight > 0 {
        let value = format!(
            "{} (maxUnavailable {max_unavailable})",
            upgrade.max_in_flight
        );
        rows.push(("most nodes upgrading at once", value));
    }
    let mut out = "Timings\n".to_owned();
    for (name, value) in rows {
        let _ = writeln!(out, "  {name:<48} {value}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(epoch: Instant, at_ms: u64, node: &str, to: NodeState) -> Transition {
        Transition {
            at: epoch + Duration::from_millis(at_ms),
            node: node.to_owned(),
            from: None,
            to,
            version: None,
            why: None,
        }
    }

    #[test]
    fn per_node_and_per_state_times_follow_the_transitions() {
        let epoch = Instant::now();
        let t = |at_ms, node, to| t(epoch, at_ms, node, to);
        let transitions = [
            t(0, "a", NodeState::Done),
            t(1000, "a", NodeState::Pending),
            t(2000, "a", NodeState::Cordoning),
            t(2500, "a", NodeState::Draining),
            t(4500, "b", NodeState::Cordoning),
            t(5000, "a", NodeState::Upgrading),
            t(6000, "a", NodeState::Done),
        ];
        let times =
            RolloutTimes::from_transitions(&transitions, epoch + Duration::from_millis(500));
        assert_eq!(
            times.per_node.get("a"),
            Some(&4.0),
            "Cordoning at 2 s, Done at 6 s"
        );
        assert_eq!(times.per_state.get(&NodeState::Draining), Some(&2.5));
        assert_eq!(times.max_in_flight, 2, "a draining while b cordons");
        assert!(!times.per_node.contains_key("b"), "b never finished");
    }

    #[test]
    fn an_uncordoning_node_holds_no_slot() {
        let epoch = Instant::now();
        let t = |at_ms, node, to| t(epoch, at_ms, node, to);
        let transitions = [
            t(0, "a", NodeState::Cordoning),
            t(1000, "a", NodeState::Upgrading),
            t(2000, "a", NodeState::Uncordoning),
            t(2000, "b", NodeState::Cordoning),
            t(2100, "a", NodeState::Done),
        ];
        let times = RolloutTimes::from_transitions(&transitions, epoch);
        assert_eq!(
            times.max_in_flight, 1,
            "b took a's slot when a's cordon was lifted"
        );
    }
}
