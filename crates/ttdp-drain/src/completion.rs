//! Waiting for workloads to finish before a drain (the GPU operator's `waitForCompletion`): on a
//! cordoned node nothing new starts, so jobs already running are let run to their end instead of
//! being evicted halfway through.
//!
//! The pods waited for are the node's pods that the selector matches and that have not finished
//! (phase `Succeeded` or `Failed`). DaemonSet pods are never waited for: they run for as long as
//! the node does. The node's pods are listed (field selector `spec.nodeName`) every
//! [`CompletionWait::poll_interval`]; each change of the set is reported as a
//! [`DrainEventKind::WaitingForCompletion`] event, so a caller can count them down.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;
use ttdp_selector::Selector;

use crate::classify::{controller_of, has_finished};
use crate::drainer::Drainer;
use crate::error::DrainError;
use crate::event::DrainEventKind;
use crate::node_pods::list_node_pods;
use crate::pod_ref::PodRef;

/// What happens when the wait times out with pods still running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnCompletionTimeout {
    /// Go on: the drain evicts what is still running, as without the wait.
    #[default]
    Drain,
    /// Stop with [`DrainError::CompletionTimeout`]; nothing is evicted.
    Fail,
}

/// A wait for the node's selected pods to finish.
#[derive(Clone, Debug)]
pub struct CompletionWait {
    /// Which pods to wait for (the empty selector: every pod).
    pub selector: Selector,
    /// How long to wait at most (None: as long as it takes).
    pub timeout: Option<Duration>,
    /// What the timeout leads to.
    pub on_timeout: OnCompletionTimeout,
    /// How often the node's pods are listed.
    pub poll_interval: Duration,
}

/// The pods among `pods` the wait is for, in name order: selected, not finished, not owned by
/// a DaemonSet.
pub fn unfinished(pods: &[Pod], selector: &Selector) -> Vec<PodRef> {
    let mut running: Vec<PodRef> = pods
        .iter()
        .filter(|p| !has_finished(p))
        .filter(|p| controller_of(p).is_none_or(|c| c.kind != "DaemonSet"))
        .filter(|p| match &p.metadata.labels {
            Some(labels) => selector.matches(labels),
            None => selector.matches(&Default::default()),
        })
        .map(PodRef::of)
        .collect();
    running.sort();
    running
}

impl Drainer {
    /// Waits until no pod on `node` is one `wait` is for. Returns the pods still running when
    /// it timed out and `wait.on_timeout` is [`OnCompletionTimeout::Drain`] (empty when they
    /// all finished).
    pub async fn wait_for_completion(
        &self,
        node: &str,
        wait: &CompletionWait,
    ) -> Result<Vec<PodRef>, DrainError> {
        let started = Instant::now();
        let mut last: Option<Vec<PodRef>> = None;
        loop {
            let pods = list_node_pods(self.client(), node)
                .await
                .map_err(|source| DrainError::ListPods {
                    node: node.to_owned(),
                    source,
                })?;
            let running = unfinished(&pods, &wait.selector);
            if last.as_ref() != Some(&running) {
                self.emit(
                    node,
                    DrainEventKind::WaitingForCompletion {
                        running: running.clone(),
                        waited: started.elapsed(),
                    },
                );
            }
            if running.is_empty() {
                return Ok(running);
            }
            if let Some(timeout) = wait.timeout.filter(|t| started.elapsed() >= *t) {
                return match wait.on_timeout {
                    OnCompletionTimeout::Drain => Ok(running),
                    OnCompletionTimeout::Fail => Err(DrainError::CompletionTimeout {
                        node: node.to_owned(),
                        timeout,
                        running,
                    }),
                };
            }
            last = Some(running);
            tokio::time::sleep(wait.poll_interval).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str, labels: serde_json::Value, owner: Option<&str>) -> Pod {
        let owners = owner.map(|kind| {
            json!([{"apiVersion": "v1", "kind": kind, "name": "o", "uid": "u", "controller": true}])
        });
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "labels": labels,
                         "ownerReferences": owners.unwrap_or(json!([]))},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn only_selected_unfinished_non_daemon_pods_are_waited_for() {
        let selector = Selector::parse("job-name").unwrap();
        let pods = [
            pod(
                "train-b",
                "Running",
                json!({"job-name": "train"}),
                Some("Job"),
            ),
            pod(
                "train-a",
                "Pending",
                json!({"job-name": "train"}),
                Some("Job"),
            ),
            pod("done", "Succeeded", json!({"job-name": "old"}), Some("Job")),
            pod("web", "Running", json!({"app": "web"}), Some("ReplicaSet")),
            pod(
                "agent",
                "Running",
                json!({"job-name": "x"}),
                Some("DaemonSet"),
            ),
        ];
        let names: Vec<String> = unfinished(&pods, &selector)
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["train-a", "train-b"]);
    }
}
