//! [`DrainCounters`]: monotonic counters of what drains did, for metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters shared by every drain of one [`crate::Drainer`] (and its clones), for
/// exporting as metrics. Read them with [`DrainCounters::snapshot`].
#[derive(Debug, Default)]
pub struct DrainCounters {
    eviction_requests: AtomicU64,
    evictions: AtomicU64,
    deletion_requests: AtomicU64,
    deletions: AtomicU64,
    budget_blocks: AtomicU64,
    request_errors: AtomicU64,
    pods_gone: AtomicU64,
    daemonset_lookups: AtomicU64,
}

/// The values of [`DrainCounters`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Eviction requests sent (every attempt, including refused ones).
    pub eviction_requests: u64,
    /// Evictions the API accepted.
    pub evictions: u64,
    /// Deletion requests sent.
    pub deletion_requests: u64,
    /// Deletions the API accepted.
    pub deletions: u64,
    /// Evictions refused because of a PodDisruptionBudget (429).
    pub budget_blocks: u64,
    /// Requests that failed otherwise (including lists and lookups).
    pub request_errors: u64,
    /// Removed pods seen gone.
    pub pods_gone: u64,
    /// DaemonSets looked up on the API server (see [`crate::DaemonSetsSeen`]).
    pub daemonset_lookups: u64,
}

/// Which counter to bump.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    EvictionRequest,
    Eviction,
    DeletionRequest,
    Deletion,
    BudgetBlock,
    RequestError,
    PodGone,
    DaemonSetLookup,
}

impl DrainCounters {
    pub(crate) fn bump(&self, counter: Counter) {
        let cell = match counter {
            Counter::EvictionRequest => &self.eviction_requests,
            Counter::Eviction => &self.evictions,
            Counter::DeletionRequest => &self.deletion_requests,
            Counter::Deletion => &self.deletions,
            Counter::BudgetBlock => &self.budget_blocks,
            Counter::RequestError => &self.request_errors,
            Counter::PodGone => &self.pods_gone,
            Counter::DaemonSetLookup => &self.daemonset_lookups,
        };
        cell.fetch_add(1, Ordering::Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> CounterSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CounterSnapshot {
            eviction_requests: get(&self.eviction_requests),
            evictions: get(&self.evictions),
            deletion_requests: get(&self.deletion_requests),
            deletions: get(&self.deletions),
            budget_blocks: get(&self.budget_blocks),
            request_errors: get(&self.request_errors),
            pods_gone: get(&self.pods_gone),
            daemonset_lookups: get(&self.daemonset_lookups),
        }
    }
}
