//! Kubernetes Events (events.k8s.io) for the node transitions a user cares about and for policy
//! failures. Publishing is best effort and off the reconcile path: Events go through a bounded
//! queue to a background task, so a 500-node wave never waits on a thousand Event writes; when
//! the queue is full an Event is dropped and logged, never fails a reconcile.
//!
//! Which transitions get Events ([`on_policy`], [`on_node`]): on the policy, every step a node
//! takes except queueing (entering Pending) and first sightings of settled nodes (a 5,000-node
//! policy would flood otherwise); on the node itself, only the start of its disruption (the
//! first in-flight step), its end and failures, which is what `kubectl describe node` readers
//! need.
//!
//! Unlike kube-runtime's `Recorder`, nothing is cached: each Event is created once (the
//! controller emits one per state change, so there is nothing to aggregate), and memory does
//! not grow with the number of Events sent.

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Resource};
use tracing::warn;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};

use crate::status::StateChange;

/// The reporting controller name on Events.
pub const REPORTING_CONTROLLER: &str = "ttdp-controller";
/// Events waiting to be written at most; more are dropped (and logged).
pub const QUEUE_CAPACITY: usize = 8_192;
/// Event writes in flight at once.
const CONCURRENT_WRITES: usize = 4;

/// Publishes the controller's Events through a background task.
#[derive(Clone)]
pub struct EventPublisher {
    queue: mpsc::Sender<K8sEvent>,
    instance: String,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// The Event reason for a node entering `state`, e.g. `NodeDraining`.
pub fn reason_for(state: NodeState) -> String {
    format!("Node{state}")
}

/// Whether a node's state change gets an Event on its policy.
pub fn on_policy(change: &StateChange) -> bool {
    let first_settled = change.from.is_none() && !change.to.is_in_flight();
    change.to == NodeState::Failed || !(first_settled || change.to == NodeState::Pending)
}

/// Whether a node's state change gets an Event on the node: its disruption starts or ends, or
/// it failed.
pub fn on_node(change: &StateChange) -> bool {
    let was = change.from.is_some_and(NodeState::is_in_flight);
    change.to == NodeState::Failed || was != change.to.is_in_flight()
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
    /// A publisher reporting as `ttdp-controller`, instance `instance` (the pod name). Starts
    /// the background writer on the current tokio runtime; it ends when every clone is dropped.
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let (queue, pending) = mpsc::channel::<K8sEvent>(QUEUE_CAPACITY);
        tokio::spawn(
            pending.for_each_concurrent(CONCURRENT_WRITES, move |event| {
                let client = client.clone();
                async move {
                    let ns = event.metadata.namespace.clone().unwrap_or_default();
                    let api: Api<K8sEvent> = Api::namespaced(client, &ns);
                    if let Err(err) = api.create(&PostParams::default(), &event).await {
                        warn!(error = %err, reason = ?event.reason, "cannot publish event");
                    }
                }
            }),
        );
        Self {
            queue,
            instance: instance.unwrap_or_else(|| REPORTING_CONTROLLER.to_owned()),
        }
    }

    /// The Events for a node's state change: on the policy ([`on_policy`]) and on the node
    /// ([`on_node`]).
    pub fn node_changed(&self, policy: &TenstorrentDriverPolicy, change: &StateChange) {
        let warning = change.to == NodeState::Failed;
        let detail = change
            .message
            .as_ref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        let from = change.from.map_or("new".to_owned(), |s| s.to_string());
        let note = format!("node {} {from} -> {}{detail}", change.node, change.to);
        let reason = reason_for(change.to);
        let policy_ref = policy.object_ref(&());
        if on_policy(change) {
            self.send(
                warning,
                &reason,
                note.clone(),
                policy_ref.clone(),
                Some(node_ref(&change.node)),
            );
        }
        if on_node(change) {
            self.send(
                warning,
                &reason,
                note,
                node_ref(&change.node),
                Some(policy_ref),
            );
        }
    }

    /// An Event on the policy.
    pub fn policy_event(
        &self,
        policy: &TenstorrentDriverPolicy,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        self.send(warning, reason, note, policy.object_ref(&()), None);
    }

    fn send(
        &self,
        warning: bool,
        reason: &str,
        note: String,
        regarding: ObjectReference,
        related: Option<ObjectReference>,
    ) {
        let now = Timestamp::now();
        let event = K8sEvent {
            action: Some("Reconcile".into()),
            reason: Some(reason.to_owned()),
            event_time: Some(MicroTime(now)),
            note: Some(truncate(note, 1000)),
            metadata: ObjectMeta {
                namespace: Some(
                    regarding
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".to_owned()),
                ),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(REPORTING_CONTROLLER),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            regarding: Some(regarding),
            related,
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
            ..Default::default()
        };
        if let Err(err) = self.queue.clone().try_send(event) {
            warn!(
                reason,
                full = err.is_full(),
                "event dropped: the event queue is full or closed"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeState::*;

    fn change(from: Option<NodeState>, to: NodeState) -> StateChange {
        StateChange {
            node: "n1".into(),
            from,
            to,
            reason: None,
            message: None,
            time_in_previous: None,
            upgrade_total: None,
        }
    }

    #[test]
    fn every_upgrade_step_is_told_on_the_policy_but_queueing_and_first_sightings_are_not() {
        for (from, to) in [
            (Pending, Cordoning),
            (Cordoning, Draining),
            (Draining, Upgrading),
            (Upgrading, Uncordoning),
            (Uncordoning, Done),
            (Upgrading, Failed),
        ] {
            assert!(on_policy(&change(Some(from), to)), "{from} -> {to}");
        }
        assert!(on_policy(&change(None, Failed)));
        assert!(on_policy(&change(None, Upgrading)));
        assert!(
            !on_policy(&change(Some(Done), Pending)),
            "a version bump queues every node"
        );
        assert!(!on_policy(&change(None, Done)));
        assert!(!on_policy(&change(None, Pending)));
    }

    #[test]
    fn nodes_hear_of_their_disruption_starting_and_ending() {
        assert!(on_node(&change(Some(Pending), Cordoning)));
        assert!(on_node(&change(Some(Uncordoning), Done)));
        assert!(on_node(&change(Some(Upgrading), Failed)));
        assert!(on_node(&change(None, Failed)));
        assert!(!on_node(&change(Some(Cordoning), Draining)));
        assert!(!on_node(&change(Some(Draining), Upgrading)));
        assert!(!on_node(&change(Some(Done), Pending)));
    }
}
