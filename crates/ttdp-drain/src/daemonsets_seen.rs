//! [`DaemonSetsSeen`]: the DaemonSets recent drains found, shared by the drains of a fleet.
//!
//! A drain looks up the DaemonSet of each DaemonSet-managed pod (a pod whose DaemonSet is gone
//! is not skipped, as with `kubectl drain`). Across a rollout every node runs the same few
//! DaemonSets, so each drain asking the API server again is one request per node that tells
//! nothing new. Drains that share a `DaemonSetsSeen` ask for a DaemonSet at most once per
//! [`DaemonSetsSeen::DEFAULT_FRESH_FOR`]; only DaemonSets found are remembered, so a missing one
//! is always looked up again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::pod_ref::ObjectKey;

/// The DaemonSets found by the drains sharing this value (clones share it), with when.
#[derive(Clone, Debug)]
pub struct DaemonSetsSeen {
    found: Arc<Mutex<HashMap<ObjectKey, Instant>>>,
    fresh_for: Duration,
}

impl Default for DaemonSetsSeen {
    fn default() -> Self {
        Self::fresh_for(Self::DEFAULT_FRESH_FOR)
    }
}

impl DaemonSetsSeen {
    /// How long a DaemonSet found stays known. A DaemonSet deleted within that time still
    /// has its pods skipped as DaemonSet-managed, which is what the drain would have done a
    /// moment earlier; its garbage collector removes those pods anyway.
    pub const DEFAULT_FRESH_FOR: Duration = Duration::from_secs(10);

    /// DaemonSets found stay known for `fresh_for` (zero: never remembered).
    pub fn fresh_for(fresh_for: Duration) -> Self {
        Self {
            found: Arc::default(),
            fresh_for,
        }
    }

    /// Whether `key` was found within the freshness.
    pub(crate) fn known(&self, key: &ObjectKey) -> bool {
        let found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        found
            .get(key)
            .is_some_and(|at| at.elapsed() < self.fresh_for)
    }

    /// Remembers that `key` exists now; forgets what has gone stale.
    pub(crate) fn found(&self, key: &ObjectKey) {
        if self.fresh_for.is_zero() {
            return;
        }
        let mut found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        found.retain(|_, at| at.elapsed() < self.fresh_for);
        found.insert(key.clone(), Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("kube-system", name)
    }

    #[test]
    fn a_daemonset_found_is_known_to_every_clone_until_it_goes_stale() {
        let seen = DaemonSetsSeen::default();
        let shared = seen.clone();
        assert!(!shared.known(&key("kube-proxy")));
        seen.found(&key("kube-proxy"));
        assert!(shared.known(&key("kube-proxy")));
        assert!(!shared.known(&key("other")));

        let never = DaemonSetsSeen::fresh_for(Duration::ZERO);
        never.found(&key("kube-proxy"));
        assert!(!never.known(&key("kube-proxy")));

        let brief = DaemonSetsSeen::fresh_for(Duration::from_millis(20));
        brief.found(&key("kube-proxy"));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!brief.known(&key("kube-proxy")));
    }
}
