//! The suites' figures: the one machine-readable line each suite prints (`BENCH-RESULT {json}` on
//! stdout, read by `cargo xtask bench`), durations in milliseconds and their spread, and the
//! rollout's timing figures, as pure functions of what was observed: when each node entered
//! Cordoning and Done (from the policy status) and when each agent finished (from the stand-in).

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

/// Hand-offs with `slots` nodes in flight at most: the `i`-th freed slot (the `i`-th of
/// `freed`, sorted) is taken by the `slots + i`-th node entering Cordoning. Returns the delays.
pub fn handoffs(mut freed: Vec<Instant>, mut cordons: Vec<Instant>, slots: usize) -> Vec<Duration> {
    freed.sort();
    cordons.sort();
    cordons
        .iter()
        .skip(slots)
        .zip(freed.iter())
        .map(|(cordon, free)| cordon.saturating_duration_since(*free))
        .collect()
}

/// `ceil(nodes / slots) × per_node`.
pub fn ideal_total(nodes: usize, slots: usize, per_node: Duration) -> Duration {
    let waves = nodes.div_ceil(slots.max(1));
    per_node.saturating_mul(u32::try_from(waves).unwrap_or(u32::MAX))
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
    fn the_ideal_is_one_node_time_per_wave() {
        assert_eq!(ideal_total(5, 2, ms(100)), ms(300));
    }
}
