//! Kubernetes Events (events.k8s.io) on the policy and on the node, for each node transition and
//! failure. Publishing is best effort: a failed Event is logged, never fails a reconcile.

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use tracing::warn;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};

use crate::status::StateChange;

/// Publishes the controller's Events.
#[derive(Clone)]
pub struct EventPublisher {
    recorder: Recorder,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher").finish_non_exhaustive()
    }
}

/// The reporting controller name on Events.
pub const REPORTING_CONTROLLER: &str = "ttdp-controller";

/// The Event reason for a node entering `state`, e.g. `NodeDraining`.
pub fn reason_for(state: NodeState) -> String {
    format!("Node{state}")
}

fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(<Node as Resource>::kind(&()).into_owned()),
        name: Some(name.to_owned()),
        ..Default::default()
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

impl EventPublisher {
    /// A publisher reporting as `ttdp-controller`, instance `instance` (the pod name).
    pub fn new(client: Client, instance: Option<String>) -> Self {
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: REPORTING_CONTROLLER.into(),
                    instance,
                },
            ),
        }
    }

    /// One Event on the policy and one on the node for a node's state change.
    pub async fn node_changed(&self, policy: &TenstorrentDriverPolicy, change: &StateChange) {
        let type_ = if change.to == NodeState::Failed {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let detail = change
            .message
            .clone()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        let from = change.from.map_or("new".to_owned(), |s| s.to_string());
        let note = truncate(
            format!("node {} {from} -> {}{detail}", change.node, change.to),
            1000,
        );
        let event = Event {
            type_,
            reason: reason_for(change.to),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: Some(node_ref(&change.node)),
        };
        self.publish(&event, &policy.object_ref(&())).await;
        let on_node = Event {
            secondary: Some(policy.object_ref(&())),
            ..event
        };
        self.publish(&on_node, &node_ref(&change.node)).await;
    }

    /// An Event on the policy.
    pub async fn policy_event(
        &self,
        policy: &TenstorrentDriverPolicy,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(truncate(note, 1000)),
            action: "Reconcile".into(),
            secondary: None,
        };
        self.publish(&event, &policy.object_ref(&())).await;
    }

    async fn publish(&self, event: &Event, reference: &ObjectReference) {
        if let Err(err) = self.recorder.publish(event, reference).await {
            warn!(error = %err, reason = %event.reason, "cannot publish event");
        }
    }
}
