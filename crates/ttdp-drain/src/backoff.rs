//! [`Backoff`]: capped exponential back-off with jitter between eviction retries.

use std::time::Duration;

use rand::Rng;

/// Capped exponential back-off with jitter, for retrying evictions a PodDisruptionBudget
/// refuses (429) and transient API errors.
///
/// Retry `n` (from 0) waits a random time between half and all of
/// `min(initial * 2^n, max)`, so many blocked pods never retry in lock-step nor in a tight loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The base delay before the first retry.
    pub initial: Duration,
    /// The longest delay between two retries.
    pub max: Duration,
}

impl Default for Backoff {
    /// 5 s, then 10 s (both jittered down to half): kubectl retries a refused eviction every
    /// 5 s, so the first retry comes no later than kubectl's and later ones at most as often on
    /// average (every 7.5 s). A budget that stays blocked for minutes costs a request every few
    /// seconds, not several per second.
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(5),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The cap for retry `attempt` (0-based), before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(30));
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The delay before retry `attempt` (0-based): uniformly random in
    /// `[ceiling / 2, ceiling]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let fraction: f64 = rand::rng().random_range(0.5..=1.0);
        ceiling.mul_f64(fraction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_then_stay_at_the_cap_with_jitter() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
        };
        let ceilings: Vec<u128> = (0..6).map(|n| b.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.ceiling(u32::MAX), Duration::from_millis(1000));
        for attempt in 0..8 {
            let d = b.delay(attempt);
            assert!(
                d >= b.ceiling(attempt) / 2 && d <= b.ceiling(attempt),
                "{d:?}"
            );
        }
        // Jitter: 50 draws at the cap are not all equal.
        let draws: std::collections::BTreeSet<Duration> = (0..50).map(|_| b.delay(9)).collect();
        assert!(draws.len() > 1);
    }

    #[test]
    fn by_default_a_blocked_eviction_is_retried_no_more_often_than_kubectl_does() {
        let b = Backoff::default();
        // kubectl waits 5 s between attempts: the first retry comes no later than that...
        assert!(b.delay(0) <= Duration::from_secs(5));
        // ...and later ones average at least 5 s apart.
        let mean = (1..200).map(|n| b.delay(n)).sum::<Duration>() / 199;
        assert!(mean >= Duration::from_secs(5), "{mean:?}");
    }
}
