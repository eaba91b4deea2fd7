//! The suites' figures: the one machine-readable line each suite prints (`BENCH-RESULT {json}` on
//! stdout, read by `cargo xtask bench`), durations in milliseconds and their spread, and the
//! rollout's timing figures, as pure functions of what was observed: when each node was
//! cordoned, granted and released (from a node watch), when its state changed in the policy's
//! status (from a policy watch) and when each agent finished (from the stand-in).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Prints `figures` (a JSON object with at least `suite`) as the suite's result line, with the
/// prefix `cargo xtask bench` looks for.
pub fn print_result(figures: &serde_json::Value) {
    println!("BENCH-RESULT {figures}");
}

/// Milliseconds with a fraction, for figures measured as durations.
pub fn ms(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1_000_000.0).round() / 1_000.0
}

/// Median, 95th percentile (nearest rank) and largest of `count` durations.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spread {
    pub p50: Duration,
    pub p95: Duration,
    pub max: Duration,
    pub count: usize,
}

impl Spread {
    /// The figures in milliseconds, as the result lines carry them.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({ "p50": ms(self.p50), "p95": ms(self.p95), "max": ms(self.max), "count": self.count })
    }
}

/// Nearest-rank percentiles of `values` (all zero when empty).
pub fn spread(mut values: Vec<Duration>) -> Spread {
    if values.is_empty() {
        return Spread::default();
    }
    values.sort();
    let rank = |p: f64| {
        let index = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
        values[index]
    };
    Spread {
        p50: rank(0.50),
        p95: rank(0.95),
        max: values[values.len() - 1],
        count: values.len(),
    }
}

/// How hand-offs pair up with `slots` nodes in flight at most: the `i`-th freed slot (by time)
/// is taken by the `slots + i`-th node entering Cordoning. Each side is (what, when).
pub fn slot_pairs<T>(
    mut freed: Vec<(T, Instant)>,
    mut taken: Vec<(T, Instant)>,
    slots: usize,
) -> Vec<((T, Instant), (T, Instant))> {
    freed.sort_by_key(|(_, at)| *at);
    taken.sort_by_key(|(_, at)| *at);
    freed
        .into_iter()
        .zip(taken.into_iter().skip(slots))
        .collect()
}

/// The hand-offs' delays, paired as [`slot_pairs`] pairs them.
pub fn handoffs(freed: Vec<Instant>, cordons: Vec<Instant>, slots: usize) -> Vec<Duration> {
    let untagged = |times: Vec<Instant>| times.into_iter().map(|at| ((), at)).collect();
    slot_pairs(untagged(freed), untagged(cordons), slots)
        .into_iter()
        .map(|((_, free), (_, cordon))| cordon.saturating_duration_since(free))
        .collect()
}

/// How long after each node's own change (`changed`, by node) its new state was visible in
/// the status (`shown`, by node): 0 when the status showed it first (the controller records a
/// step before it acts). Nodes missing from either side are left out.
pub fn freshness(
    changed: &BTreeMap<String, Instant>,
    shown: &BTreeMap<String, Instant>,
) -> Vec<Duration> {
    changed
        .iter()
        .filter_map(|(node, at)| Some(shown.get(node)?.saturating_duration_since(*at)))
        .collect()
}

/// Each node's time from `granted` to its agent Ready (`ready`, by node): the DaemonSet
/// controller, the scheduler and the agent's work, none of it the controller's.
pub fn grant_to_ready(
    granted: &BTreeMap<String, Instant>,
    ready: &BTreeMap<String, Instant>,
) -> Vec<Duration> {
    freshness(granted, ready)
}

/// The controller's own part of a hand-off: the hand-off less two node writes at the API
/// server's own p95 (the release of the finished node and the cordon of the next), in ms.
pub fn overhead_ms(handoff: Duration, node_patch: Duration) -> f64 {
    ms(handoff) - 2.0 * ms(node_patch)
}

/// The rollout's `total` over `ceil(nodes / slots)` waves of `floor` each (0 without a floor).
pub fn ratio_to_floor(total: Duration, nodes: usize, slots: usize, floor: Duration) -> f64 {
    let waves = nodes.div_ceil(slots.max(1)) as f64;
    let ideal = waves * floor.as_secs_f64();
    if ideal > 0.0 {
        total.as_secs_f64() / ideal
    } else {
        0.0
    }
}

/// `bytes` written over `window`, per second (0 for an empty window).
pub fn per_second(bytes: usize, window: Duration) -> f64 {
    if window.is_zero() {
        0.0
    } else {
        bytes as f64 / window.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let s = spread((1..=100).map(ms).collect());
        assert_eq!(
            (s.p50, s.p95, s.max, s.count),
            (ms(50), ms(95), ms(100), 100)
        );
        assert_eq!(spread(vec![]).count, 0);
    }

    #[test]
    fn each_freed_slot_is_paired_with_the_next_cordon() {
        let t0 = Instant::now();
        let at = |n| t0 + ms(n);
        // Two slots: nodes a, b start at 0; a finishes at 100, c starts at 130; b finishes at 150,
        // d starts at 160.
        let delays = handoffs(
            vec![at(150), at(100)],
            vec![at(0), at(0), at(160), at(130)],
            2,
        );
        assert_eq!(delays, vec![ms(30), ms(10)]);
    }

    #[test]
    fn freshness_is_from_the_nodes_change_to_the_status_and_never_negative() {
        let t0 = Instant::now();
        let by_node = |pairs: &[(&str, u64)]| -> BTreeMap<String, Instant> {
            pairs
                .iter()
                .map(|(n, at)| (n.to_string(), t0 + ms(*at)))
                .collect()
        };
        let changed = by_node(&[("a", 100), ("b", 100), ("c", 100)]);
        // a shown 250 ms late, b shown before its change, c never shown.
        let shown = by_node(&[("a", 350), ("b", 40), ("d", 0)]);
        assert_eq!(freshness(&changed, &shown), vec![ms(250), ms(0)]);
        assert_eq!(grant_to_ready(&changed, &shown), vec![ms(250), ms(0)]);
    }

    #[test]
    fn the_overhead_takes_two_node_writes_off_the_hand_off() {
        assert_eq!(overhead_ms(ms(130), ms(15)), 100.0);
        // Faster than two writes at their p95: the overhead is negative, not hidden.
        assert_eq!(overhead_ms(ms(20), ms(15)), -10.0);
    }

    #[test]
    fn the_ratio_counts_whole_waves_of_the_floor() {
        // 5 nodes, 2 at a time: 3 waves of 100 ms.
        let ratio = ratio_to_floor(ms(600), 5, 2, ms(100));
        assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
        assert_eq!(ratio_to_floor(ms(600), 5, 2, Duration::ZERO), 0.0);
        assert_eq!(per_second(3_000, ms(1_500)), 2_000.0);
        assert_eq!(per_second(3_000, Duration::ZERO), 0.0);
    }
}
