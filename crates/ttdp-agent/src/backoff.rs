//! [`Backoff`]: exponential delays between retries, so a stuck node never spins or crash-loops.

use std::time::Duration;

/// Doubling delays from `initial` up to `max`, back to `initial` after [`Backoff::reset`].
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Delays starting at `initial`, never longer than `max` (nor shorter than `initial`).
    pub fn new(initial: Duration, max: Duration) -> Self {
        let max = max.max(initial);
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay before the next retry; each call doubles the following one up to the maximum.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// Starts over from the initial delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let delays: Vec<u64> = (0..5).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 5, 5]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }

    #[test]
    fn a_cap_below_the_start_is_raised_to_it() {
        let mut b = Backoff::new(Duration::from_secs(3), Duration::from_secs(1));
        assert_eq!(b.next_delay(), Duration::from_secs(3));
        assert_eq!(b.next_delay(), Duration::from_secs(3));
    }
}
