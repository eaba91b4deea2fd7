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

use std::sync::Arc;

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

use crate::pure::status::StateChange;

/// The reporting controller name on Events.
pub const REPORTING_CONTROLLER: &str = "ttdp-controller";
/// Events waiting to be written at most; more are dropped (and logged).
pub const QUEUE_CAPACITY: usize = 8_192;
/// Event writes in flight at once.
const CONCURRENT_WRITES: usize = 4;

/// Publishes the controller's Events through a background task.
#[derive(Clone)]
pub struct EventPublisher {
    queue: mpsc::Sender<Queued>,
    instance: Arc<str>,
}

/// An Event waiting in the queue: only what differs between Events (a built `Event` is a few
/// kilobytes, and a wave of hundreds of nodes can queue thousands).
struct Queued {
    at: Timestamp,
    warning: bool,
    reason: String,
    note: String,
    regarding: Subject,
    related: Option<Subject>,
}

/// What an Event is about: a node (by name) or an object (shared by the Events of one change).
#[derive(Clone)]
enum Subject {
    Node(String),
    Object(Arc<ObjectReference>),
}

impl Subject {
    fn reference(self) -> ObjectReference {
        match self {
            Subject::Node(name) => node_ref(&name),
            Subject::Object(r) => Arc::unwrap_or_clone(r),
        }
    }
}

impl Queued {
    /// The `events.k8s.io/v1` Event.
    fn event(self, instance: &str) -> K8sEvent {
        let regarding = self.regarding.reference();
        K8sEvent {
            action: Some("Reconcile".into()),
            reason: Some(self.reason),
            event_time: Some(MicroTime(self.at)),
            note: Some(truncate(self.note, 1000)),
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
                    self.at.as_nanosecond()
                )),
                ..Default::default()
            },
            regarding: Some(regarding),
            related: self.related.map(Subject::reference),
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(instance.to_owned()),
            type_: Some(if self.warning { "Warning" } else { "Normal" }.to_owned()),
            ..Default::default()
        }
    }
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
        let (queue, pending) = mpsc::channel::<Queued>(QUEUE_CAPACITY);
        let instance: Arc<str> = instance
            .unwrap_or_else(|| REPORTING_CONTROLLER.to_owned())
            .into();
        let writer_instance = instance.clone();
        tokio::spawn(
            pending.for_each_concurrent(CONCURRENT_WRITES, move |queued| {
                let client = client.clone();
                let event = queued.event(&writer_instance);
                async move {
                    let ns = event.metadata.namespace.clone().unwrap_or_default();
                    let api: Api<K8sEvent> = Api::namespaced(client, &ns);
                    if let Err(err) = api.create(&PostParams::default(), &event).await {
                        warn!(error = %err, reason = ?event.reason, "cannot publish event");
                    }
                }
            }),
        );
        Self { queue, instance }
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
        let policy_ref = Subject::Object(Arc::new(policy.object_ref(&())));
        let node = Subject::Node(change.node.clone());
        if on_policy(change) {
            self.send(
                warning,
                &reason,
                note.clone(),
                policy_ref.clone(),
                Some(node.clone()),
            );
        }
        if on_node(change) {
            self.send(warning, &reason, note, node, Some(policy_ref));
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
        let policy_ref = Subject::Object(Arc::new(policy.object_ref(&())));
        self.send(warning, reason, note, policy_ref, None);
    }

    fn send(
        &self,
        warning: bool,
        reason: &str,
        note: String,
        regarding: Subject,
        related: Option<Subject>,
    ) {
        let queued = Queued {
            at: Timestamp::now(),
            warning,
            reason: reason.to_owned(),
            note,
            regarding,
            related,
        };
        if let Err(err) = self.queue.clone().try_send(queued) {
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
    fn a_queued_event_becomes_an_event_about_its_subject() {
        let policy = ObjectReference {
            kind: Some("TenstorrentDriverPolicy".into()),
            name: Some("fleet".into()),
            ..Default::default()
        };
        let at = Timestamp::now();
        let e = Queued {
            at,
            warning: true,
            reason: "NodeFailed".into(),
            note: "x".repeat(1200),
            regarding: Subject::Node("n1".into()),
            related: Some(Subject::Object(Arc::new(policy))),
        }
        .event("ctl-0");
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            e.metadata.name,
            Some(format!("n1.{:x}", at.as_nanosecond()))
        );
        assert_eq!(e.regarding.unwrap().kind.as_deref(), Some("Node"));
        assert_eq!(e.related.unwrap().name.as_deref(), Some("fleet"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.note.unwrap().len(), 1000);
        assert_eq!(e.reporting_instance.as_deref(), Some("ctl-0"));
        assert_eq!(e.event_time.unwrap().0, at);
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
