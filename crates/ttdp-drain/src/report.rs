//! [`DrainReport`] (what a finished drain did) and [`StuckPod`] (why a pod is still there).

use std::fmt;
use std::time::Duration;

use crate::budget::{HeldDisruption, held_text};
use crate::classify::{Disposition, PodDecision};
use crate::pod_ref::{ObjectKey, PodRef};

/// What a finished drain of one node did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainReport {
    /// The node.
    pub node: String,
    /// Every pod that was on the node, with its disposition and reason.
    pub decisions: Vec<PodDecision>,
    /// Pods removed through the Eviction API (empty in a dry run).
    pub evicted: Vec<PodRef>,
    /// Pods removed by deletion (empty in a dry run).
    pub deleted: Vec<PodRef>,
    /// Pods left on the node only because force is off ([`PodRules::skip_unmanaged`]): pods
    /// without a controller, or whose DaemonSet is gone. They are still running, so a caller
    /// should name them; their reasons are in [`decisions`](Self::decisions).
    ///
    /// [`PodRules::skip_unmanaged`]: crate::PodRules::skip_unmanaged
    pub skipped_without_force: Vec<PodRef>,
    /// Whether this was a dry run (nothing was removed).
    pub dry_run: bool,
    /// How long the drain took.
    pub elapsed: Duration,
}

impl DrainReport {
    /// The decisions with this disposition.
    pub fn with(&self, disposition: Disposition) -> impl Iterator<Item = &PodDecision> {
        self.decisions
            .iter()
            .filter(move |d| d.disposition == disposition)
    }
}

/// The pods of `decisions` that are left only because force is off, in their order.
pub(crate) fn skipped_without_force(decisions: &[PodDecision]) -> Vec<PodRef> {
    decisions
        .iter()
        .filter(|d| d.skipped_without_force())
        .map(|d| d.pod.clone())
        .collect()
}

/// A pod that should have been removed and is still on the node, and why.
/// Displays as `namespace/name: why`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StuckPod {
    /// The pod.
    pub pod: PodRef,
    /// Why it is still there.
    pub why: StuckReason,
}

impl fmt::Display for StuckPod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.pod, self.why)
    }
}

/// Why a pod is still on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StuckReason {
    /// Its eviction was not requested yet (every request slot was busy).
    NotRequested,
    /// A PodDisruptionBudget refuses its eviction.
    Blocked {
        /// The budget that selects the pod, when it could be found.
        budget: Option<ObjectKey>,
        /// The budget's `status.disruptionsAllowed`, when known.
        disruptions_allowed: Option<i32>,
        /// The API server's message.
        message: String,
        /// Disruptions the budget granted to evictions that were never carried out
        /// (`status.disruptedPods`): Kubernetes holds them until they expire.
        held: Vec<HeldDisruption>,
    },
    /// Its removal keeps failing with an error that may pass.
    Retrying {
        /// The last error.
        error: String,
    },
    /// Its removal failed with an error that retrying does not fix.
    Failed {
        /// The error.
        error: String,
    },
    /// Its removal was accepted but it has not started terminating.
    Accepted,
    /// It is terminating and has not gone away.
    Terminating {
        /// How long ago this drain's eviction or deletion of it was accepted.
        waiting: Option<Duration>,
        /// Its `metadata.deletionGracePeriodSeconds`.
        grace_period_seconds: Option<i64>,
        /// Its finalizers, which keep it until their controllers remove them.
        finalizers: Vec<String>,
    },
}

impl fmt::Display for StuckReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotRequested => f.write_str("eviction not requested yet"),
            Self::Blocked {
                budget: Some(budget),
                disruptions_allowed,
                held,
                ..
            } => {
                write!(f, "eviction blocked by PodDisruptionBudget {budget}")?;
                if let Some(n) = disruptions_allowed {
                    let s = if *n == 1 { "" } else { "s" };
                    write!(f, " ({n} disruption{s} allowed)")?;
                }
                f.write_str(&held_text(held))
            }
            Self::Blocked {
                budget: None,
                message,
                ..
            } => write!(f, "eviction blocked: {message}"),
            Self::Retrying { error } => write!(f, "removal keeps failing: {error}"),
            Self::Failed { error } => write!(f, "removal failed: {error}"),
            Self::Accepted => f.write_str("removal accepted, pod not terminating yet"),
            Self::Terminating {
                waiting,
                grace_period_seconds,
                finalizers,
            } => {
                f.write_str("still terminating")?;
                let mut details = Vec::new();
                if let Some(w) = waiting {
                    details.push(format!("removal accepted {}s ago", w.as_secs()));
                }
                if let Some(g) = grace_period_seconds {
                    details.push(format!("grace period {g}s"));
                }
                if !finalizers.is_empty() {
                    details.push(format!("finalizers: {}", finalizers.join(", ")));
                }
                if !details.is_empty() {
                    write!(f, " ({})", details.join("; "))?;
                }
                Ok(())
            }
        }
    }
}
