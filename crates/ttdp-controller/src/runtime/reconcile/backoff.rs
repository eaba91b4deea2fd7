//! Per-object exponential back-off for failed reconciles (kube-runtime only offers fixed
//! requeues in `error_policy`).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Consecutive failures per object, and the delay they earn.
#[derive(Debug)]
pub struct ErrorBackoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl ErrorBackoff {
    /// Delays start at `base` and double per consecutive failure up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::default(),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let n = failures.entry(key.to_owned()).or_insert(0);
        let delay = self
            .base
            .saturating_mul(2u32.saturating_pow((*n).min(20)))
            .min(self.max);
        *n = n.saturating_add(1);
        delay
    }

    /// Forgets the failures of `key` after a success.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

impl Default for ErrorBackoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(300))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_per_failure_caps_and_resets_per_object() {
        let b = ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(b.failed("a"), Duration::from_secs(1));
        assert_eq!(b.failed("a"), Duration::from_secs(2));
        assert_eq!(b.failed("b"), Duration::from_secs(1), "per object");
        assert_eq!(b.failed("a"), Duration::from_secs(4));
        assert_eq!(b.failed("a"), Duration::from_secs(5));
        b.succeeded("a");
        assert_eq!(b.failed("a"), Duration::from_secs(1));
    }
}
