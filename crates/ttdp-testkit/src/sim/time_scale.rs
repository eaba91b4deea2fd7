//! A global speed factor for simulated time, so tests run fast.

use std::time::Duration;

/// Multiplies every simulated duration (probe periods, restart back-off, grace periods, heartbeats).
///
/// `TimeScale::new(0.1)` runs the simulation ten times faster than a real kubelet would.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeScale(f64);

impl TimeScale {
    /// Real time: every duration as a real kubelet would use it.
    pub const REAL: TimeScale = TimeScale(1.0);

    /// A scale factor; values that are not finite or not positive are taken as 1.0.
    pub fn new(factor: f64) -> Self {
        if factor.is_finite() && factor > 0.0 {
            Self(factor)
        } else {
            Self(1.0)
        }
    }

    /// Scales a duration, never below one millisecond.
    pub fn scale(self, real: Duration) -> Duration {
        real.mul_f64(self.0).max(Duration::from_millis(1))
    }

    /// Scales a number of (Kubernetes) seconds.
    pub fn seconds(self, seconds: i64) -> Duration {
        self.scale(Duration::from_secs(seconds.max(0).unsigned_abs()))
    }
}

impl Default for TimeScale {
    fn default() -> Self {
        Self::REAL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_seconds_and_rejects_nonsense_factors() {
        assert_eq!(
            TimeScale::new(0.1).seconds(10),
            Duration::from_secs(1),
            "a tenth of 10 s"
        );
        assert_eq!(TimeScale::new(-3.0), TimeScale::REAL);
        assert_eq!(TimeScale::new(f64::NAN), TimeScale::REAL);
        assert_eq!(TimeScale::new(0.001).seconds(0), Duration::from_millis(1));
    }
}
