//! [`DrainEvent`]: progress of a drain, for status, Kubernetes Events, logs and metrics.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::budget::HeldDisruption;
use crate::classify::PodDecision;
use crate::pod_ref::{ObjectKey, PodRef};

/// Which of the two passes of [`crate::TwoPassDrain`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pass {
    /// Pass 1: pods that use the device.
    Device,
    /// Pass 2: every other removable pod (kubectl drain semantics).
    FullNode,
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Device => "device",
            Self::FullNode => "full-node",
        })
    }
}

/// How a pod was removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Removal {
    /// Through the Eviction API.
    Evicted,
    /// By deleting it (finished pods, or eviction disabled).
    Deleted,
}

impl fmt::Display for Removal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Evicted => "evicted",
            Self::Deleted => "deleted",
        })
    }
}

/// One step of a drain of `node`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainEvent {
    /// The node being drained.
    pub node: String,
    /// What happened.
    pub kind: DrainEventKind,
}

/// What happened during a drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainEventKind {
    /// A pass of a two-pass drain starts.
    PassStarted {
        /// Which pass.
        pass: Pass,
    },
    /// The node's pods were listed and classified; removal starts unless some are refused.
    Planned {
        /// Every pod on the node with what will happen to it.
        decisions: Vec<PodDecision>,
    },
    /// An eviction is being requested.
    Evicting {
        /// The pod.
        pod: PodRef,
    },
    /// A deletion is being requested.
    Deleting {
        /// The pod.
        pod: PodRef,
    },
    /// The API refused an eviction because of a PodDisruptionBudget (429); it is retried.
    EvictionBlocked {
        /// The pod.
        pod: PodRef,
        /// The budget that selects the pod, when it could be found.
        budget: Option<ObjectKey>,
        /// The budget's `status.disruptionsAllowed`, when known.
        disruptions_allowed: Option<i32>,
        /// The API server's message.
        message: String,
        /// Disruptions the budget granted to evictions that were never carried out
        /// (`status.disruptedPods`, less the pods this drain is removing itself): Kubernetes
        /// holds them until they expire.
        held: Vec<HeldDisruption>,
        /// When the next attempt is made at the latest (sooner when the budget allows one).
        retry_in: Duration,
    },
    /// A request failed with an error that may pass (5xx, connection); it is retried.
    RequestFailed {
        /// The pod.
        pod: PodRef,
        /// The error.
        error: String,
        /// When the next attempt is made.
        retry_in: Duration,
    },
    /// The pod is gone: no pod with its UID is left on the node.
    Gone {
        /// The pod.
        pod: PodRef,
        /// How it was removed.
        removal: Removal,
    },
    /// Before the drain, the selected pods still running that it waits for
    /// ([`crate::Drainer::wait_for_completion`]); sent whenever the set changes, last with an
    /// empty set when they all finished.
    WaitingForCompletion {
        /// The pods still running, in name order.
        running: Vec<PodRef>,
        /// How long the wait has lasted.
        waited: Duration,
    },
    /// Every removable pod is gone.
    Done {
        /// How many pods were evicted.
        evicted: usize,
        /// How many pods were deleted.
        deleted: usize,
    },
}

/// Receives [`DrainEvent`]s. Called inline from the drain: keep it quick and non-blocking
/// (e.g. send into a channel).
#[derive(Clone)]
pub struct EventSink(Arc<dyn Fn(&DrainEvent) + Send + Sync>);

impl EventSink {
    /// Wrap a callback.
    pub fn new(callback: impl Fn(&DrainEvent) + Send + Sync + 'static) -> Self {
        Self(Arc::new(callback))
    }

    /// Deliver one event.
    pub fn emit(&self, event: &DrainEvent) {
        (self.0)(event)
    }
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EventSink(..)")
    }
}
