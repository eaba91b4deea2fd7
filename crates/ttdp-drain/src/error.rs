//! [`DrainError`]: why a cordon, uncordon or drain did not finish.

use std::fmt;
use std::time::Duration;

use crate::classify::PodDecision;
use crate::event::Pass;
use crate::pod_ref::PodRef;
use crate::report::StuckPod;

/// Why a cordon, uncordon or drain did not finish.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// Reading the node failed.
    #[error(
        "cannot read node {node}: {source}; check that it exists and that get on nodes is allowed"
    )]
    NodeRead {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Patching the node failed.
    #[error("cannot {action} node {node}: {source}; check that patch on nodes is allowed")]
    NodeWrite {
        /// The node.
        node: String,
        /// `cordon` or `uncordon`.
        action: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The node kept changing between reading and writing it.
    #[error("cannot {action} node {node}: it kept changing under us (write conflicts); try again")]
    NodeConflict {
        /// The node.
        node: String,
        /// `cordon` or `uncordon`.
        action: &'static str,
    },
    /// Listing the node's pods failed.
    #[error("cannot list the pods of node {node}: {source}; check that list on pods is allowed")]
    ListPods {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Some pods may not be removed with the drain's rules; nothing was removed.
    #[error("cannot drain node {node}{}: {}", in_pass(*.pass), Refusals(.pods))]
    Refused {
        /// The node.
        node: String,
        /// The pass, for a two-pass drain.
        pass: Option<Pass>,
        /// The refused pods, each with the reason (which names the option that allows it).
        pods: Vec<PodDecision>,
    },
    /// The drain's timeout expired while some pods were still on the node.
    #[error(
        "drain of node {node}{} timed out after {}s; still on the node: {}",
        in_pass(*.pass), .timeout.as_secs(), StuckList(.remaining)
    )]
    Timeout {
        /// The node.
        node: String,
        /// The pass, for a two-pass drain.
        pass: Option<Pass>,
        /// The timeout.
        timeout: Duration,
        /// Every pod that was to be removed and is still there, with why.
        remaining: Vec<StuckPod>,
    },
    /// The wait for the node's selected pods to finish timed out, and the wait says to fail.
    #[error(
        "node {node}: {} selected pods still running after waiting {}s for them to finish: {}; nothing was evicted",
        .running.len(), .timeout.as_secs(), PodList(.running)
    )]
    CompletionTimeout {
        /// The node.
        node: String,
        /// The wait's timeout.
        timeout: Duration,
        /// The pods still running.
        running: Vec<PodRef>,
    },
    /// Some removals failed with errors that retrying does not fix; the others finished.
    #[error("drain of node {node}{} failed: {}", in_pass(*.pass), StuckList(.failed))]
    Failed {
        /// The node.
        node: String,
        /// The pass, for a two-pass drain.
        pass: Option<Pass>,
        /// The pods whose removal failed, with the error.
        failed: Vec<StuckPod>,
    },
}

fn in_pass(pass: Option<Pass>) -> String {
    pass.map(|p| format!(" ({p} pass)")).unwrap_or_default()
}

struct Refusals<'a>(&'a [PodDecision]);

impl fmt::Display for Refusals<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", d.pod, d.reason)?;
        }
        Ok(())
    }
}

struct StuckList<'a>(&'a [StuckPod]);

impl fmt::Display for StuckList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none (the pods were not listed yet)");
        }
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

struct PodList<'a>(&'a [PodRef]);

impl fmt::Display for PodList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}
