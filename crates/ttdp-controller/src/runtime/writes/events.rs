//! Kubernetes Events (events.k8s.io) for the node transitions a user cares about and for policy
//! failures. Publishing is best effort and off the reconcile path: Events go through a bounded
//! queue to a background task, so a 500-node wave never waits on a thousand Event writes; when
//! the queue is full an Event is dropped and counted in the log, never fails a reconcile. (The
//! queue is tokio's bounded channel: a `futures` channel sent to through a fresh clone of its
//! sender takes every message, and a 5,000-node rollout queued tens of thousands.)
//!
//! Which transitions get Events ([`on_policy`], [`on_node`]): on the policy, every step a node
//! takes except queueing (entering Pending) and first sightings of settled nodes (a 5,000-node
//! policy would flood otherwise); on the node itself, only the start of its disruption (the
//! first in-flight step), its end and failures, which is what `kubectl describe node` readers
//! need.
//!
//! At fleet scale a policy's routine steps are counted rather than told one by one past a share
//! per window ([`super::event_tally`]). Unlike kube-runtime's `Recorder`, no Event is cached:
//! each is created once, and memory does not grow with the number of Events sent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Resource};
use tokio::sync::mpsc;
use tracing::warn;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};

use crate::pure::status::StateChange;
use crate::runtime::writes::event_tally::{self, NODES_PROGRESSED, StepTally};

/// Each policy's steps in the current window (by policy name and uid), with its reference.
type Tallies = Mutex<HashMap<(String, String), (Arc<ObjectReference>, StepTally)>>;

/// The reporting controller name on Events.
pub const REPORTING_CONTROLLER: &str = "ttdp-controller";
/// Events waiting to be written at most; more are dropped (and counted in the log).
pub const QUEUE_CAPACITY: usize = 8_192;
/// Event writes in flight at once.
const CONCURRENT_WRITES: usize = 4;
/// Every how many dropped Events the log says so again.
const DROPS_PER_WARNING: u64 = 1_000;
/// Places of the queue kept for Warning Events (failures): a flood of routine steps fills the
/// rest first.
const WARNING_RESERVE: usize = 1_024;

/// Publishes the controller's Events through a background task.
#[derive(Clone)]
pub struct EventPublisher {
    queue: mpsc::Sender<Queued>,
    instance: Arc<str>,
    dropped: Arc<AtomicU64>,
    tallies: Arc<Tallies>,
}

/// An Event waiting in the queue. It holds only what differs between Events and builds the
/// Event when it is written: a built `Event` is a few kilobytes, a wave of hundreds of nodes
/// queues thousands, and both Events of a node's change share one [`NodeChange`].
struct Queued {
    at: Timestamp,
    about: About,
}

enum About {
    /// A node's state change, told on the policy (related: the node) or, with `on_node`, on
    /// the node (related: the policy).
    NodeChange {
        change: Arc<NodeChange>,
        policy: Arc<ObjectReference>,
        on_node: bool,
    },
    /// Any other Event, on the policy.
    Policy {
        policy: Arc<ObjectReference>,
        warning: bool,
        reason: String,
        note: String,
    },
}

/// What the Events of a node's state change tell.
struct NodeChange {
    node: String,
    from: Option<NodeState>,
    to: NodeState,
    message: Option<String>,
}

impl NodeChange {
    fn of(change: &StateChange) -> Self {
        Self {
            node: change.node.clone(),
            from: change.from,
            to: change.to,
            message: change.message.clone(),
        }
    }

    /// `node <name> <from> -> <to>[: <message>]`.
    fn note(&self) -> String {
        let from = self.from.map_or("new".to_owned(), |s| s.to_string());
        let detail = self
            .message
            .as_ref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        format!("node {} {from} -> {}{detail}", self.node, self.to)
    }
}

impl About {
    /// Whether the Event is a Warning.
    fn warning(&self) -> bool {
        match self {
            About::NodeChange { change, .. } => change.to == NodeState::Failed,
            About::Policy { warning, .. } => *warning,
        }
    }
}

impl Queued {
    /// The `events.k8s.io/v1` Event.
    fn event(self, instance: &str) -> K8sEvent {
        let warning = self.about.warning();
        let (reason, note, regarding, related) = match self.about {
            About::NodeChange {
                change,
                policy,
                on_node,
            } => {
                let node = node_ref(&change.node);
                let policy = Arc::unwrap_or_clone(policy);
                let (regarding, related) = if on_node {
                    (node, policy)
                } else {
                    (policy, node)
                };
                let reason = reason_for(change.to);
                (reason, change.note(), regarding, Some(related))
            }
            About::Policy {
                policy,
                reason,
                note,
                ..
            } => (reason, note, Arc::unwrap_or_clone(policy), None),
        };
        K8sEvent {
            action: Some("Reconcile".into()),
            reason: Some(reason),
            event_time: Some(MicroTime(self.at)),
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
                    self.at.as_nanosecond()
                )),
                ..Default::default()
            },
            regarding: Some(regarding),
            related,
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(instance.to_owned()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
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
        let pending = futures::stream::unfold(pending, |mut pending| async move {
            pending.recv().await.map(|queued| (queued, pending))
        });
        let publisher = Self {
            queue,
            instance,
            dropped: Arc::default(),
            tallies: Arc::default(),
        };
        tokio::spawn(end_windows(publisher.weak()));
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
        publisher
    }

    /// The publisher, without keeping its queue open.
    fn weak(&self) -> WeakPublisher {
        WeakPublisher {
            queue: self.queue.downgrade(),
            instance: self.instance.clone(),
            dropped: self.dropped.clone(),
            tallies: self.tallies.clone(),
        }
    }

    /// The Events for nodes' state changes: on the policy ([`on_policy`]) and on the node
    /// ([`on_node`]).
    pub fn nodes_changed(&self, policy: &TenstorrentDriverPolicy, changes: &[StateChange]) {
        let policy = Arc::new(policy.object_ref(&()));
        for c in changes {
            let change = Arc::new(NodeChange::of(c));
            let on_policy = on_policy(c) && self.told_on_its_own(&policy, c);
            let told = [(false, on_policy), (true, on_node(c))];
            for (on_node, _) in told.into_iter().filter(|(_, told)| *told) {
                self.send(About::NodeChange {
                    change: Arc::clone(&change),
                    policy: Arc::clone(&policy),
                    on_node,
                });
            }
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
        self.send(About::Policy {
            policy: Arc::new(policy.object_ref(&())),
            warning,
            reason: reason.to_owned(),
            note,
        });
    }

    /// Whether a step told on the policy goes out on its own: a failure always does, a routine
    /// step while the policy's share of the window lasts.
    fn told_on_its_own(&self, policy: &Arc<ObjectReference>, c: &StateChange) -> bool {
        if c.to == NodeState::Failed {
            return true;
        }
        let key = (
            policy.name.clone().unwrap_or_default(),
            policy.uid.clone().unwrap_or_default(),
        );
        let mut tallies = self.tallies.lock().unwrap_or_else(PoisonError::into_inner);
        let (_, tally) = tallies
            .entry(key)
            .or_insert_with(|| (policy.clone(), StepTally::default()));
        tally.admit(&c.node, c.to)
    }

    /// Ends every policy's window: one summary Event for the steps each counted.
    fn end_windows(&self) {
        let summaries: Vec<(Arc<ObjectReference>, String)> = {
            let mut tallies = self.tallies.lock().unwrap_or_else(PoisonError::into_inner);
            tallies.retain(|_, (_, tally)| !tally.is_idle());
            (tallies.values_mut())
                .filter_map(|(policy, tally)| Some((policy.clone(), tally.end_window()?)))
                .collect()
        };
        for (policy, note) in summaries {
            self.send(About::Policy {
                policy,
                warning: false,
                reason: NODES_PROGRESSED.to_owned(),
                note,
            });
        }
    }

    fn send(&self, about: About) {
        let queued = Queued {
            at: Timestamp::now(),
            about,
        };
        let routine = !queued.about.warning();
        let sent = if routine && self.queue.capacity() <= WARNING_RESERVE {
            Err("full")
        } else {
            self.queue.try_send(queued).map_err(|err| match err {
                mpsc::error::TrySendError::Full(_) => "full",
                mpsc::error::TrySendError::Closed(_) => "closed",
            })
        };
        if let Err(queue) = sent {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed);
            if dropped.is_multiple_of(DROPS_PER_WARNING) {
                warn!(
                    dropped = dropped + 1,
                    queue, "events dropped: the event queue is full or closed"
                );
            }
        }
    }
}

/// An [`EventPublisher`] that does not keep the queue, and so the writer, alive.
struct WeakPublisher {
    queue: mpsc::WeakSender<Queued>,
    instance: Arc<str>,
    dropped: Arc<AtomicU64>,
    tallies: Arc<Tallies>,
}

/// Ends the tallies' windows every [`event_tally::WINDOW`], while the publisher lives.
async fn end_windows(weak: WeakPublisher) {
    let mut every = tokio::time::interval(event_tally::WINDOW);
    every.tick().await;
    loop {
        every.tick().await;
        let Some(queue) = weak.queue.upgrade() else {
            return;
        };
        let publisher = EventPublisher {
            queue,
            instance: weak.instance.clone(),
            dropped: weak.dropped.clone(),
            tallies: weak.tallies.clone(),
        };
        publisher.end_windows();
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
        let policy = Arc::new(ObjectReference {
            kind: Some("TenstorrentDriverPolicy".into()),
            name: Some("fleet".into()),
            ..Default::default()
        });
        let at = Timestamp::now();
        let mut failed = change(Some(Upgrading), Failed);
        failed.message = Some("x".repeat(1200));
        let failed = Arc::new(NodeChange::of(&failed));
        let queued = |on_node| Queued {
            at,
            about: About::NodeChange {
                change: Arc::clone(&failed),
                policy: Arc::clone(&policy),
                on_node,
            },
        };
        let e = queued(true).event("ctl-0");
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            e.metadata.name,
            Some(format!("n1.{:x}", at.as_nanosecond()))
        );
        assert_eq!(e.regarding.unwrap().kind.as_deref(), Some("Node"));
        assert_eq!(e.related.unwrap().name.as_deref(), Some("fleet"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some("NodeFailed"));
        let note = e.note.unwrap();
        assert_eq!(note.len(), 1000);
        assert!(
            note.starts_with("node n1 Upgrading -> Failed: xxx"),
            "{note}"
        );
        assert_eq!(e.reporting_instance.as_deref(), Some("ctl-0"));
        assert_eq!(e.event_time.unwrap().0, at);
        let on_policy = queued(false).event("ctl-0");
        assert_eq!(on_policy.regarding.unwrap().name.as_deref(), Some("fleet"));
        assert_eq!(on_policy.related.unwrap().name.as_deref(), Some("n1"));
    }

    /// A publisher whose queue holds `capacity` Events, its queue's receiving end, and a
    /// policy.
    fn publisher(
        capacity: usize,
    ) -> (
        EventPublisher,
        mpsc::Receiver<Queued>,
        TenstorrentDriverPolicy,
    ) {
        let (queue, pending) = mpsc::channel(capacity);
        let publisher = EventPublisher {
            queue,
            instance: "ctl-0".into(),
            dropped: Arc::default(),
            tallies: Arc::default(),
        };
        let spec = serde_json::from_value(serde_json::json!({"version": "2.8.0"})).unwrap();
        (
            publisher,
            pending,
            TenstorrentDriverPolicy::new("fleet", spec),
        )
    }

    /// A publisher whose queue has room for two routine Events beyond the Warnings' reserve.
    fn publisher_with_room_for_two() -> (
        EventPublisher,
        mpsc::Receiver<Queued>,
        TenstorrentDriverPolicy,
    ) {
        publisher(WARNING_RESERVE + 2)
    }

    #[tokio::test]
    async fn a_full_queue_drops_events_instead_of_growing() {
        let (publisher, mut pending, policy) = publisher_with_room_for_two();
        let changes = vec![change(Some(Pending), Cordoning); 3];
        publisher.nodes_changed(&policy, &changes);
        assert_eq!(publisher.dropped.load(Ordering::Relaxed), 4);
        let mut told = 0;
        while pending.try_recv().is_ok() {
            told += 1;
        }
        assert_eq!(
            told, 2,
            "routine Events fill the queue up to the reserve and no more"
        );
    }

    #[tokio::test]
    async fn failures_are_told_when_routine_steps_have_filled_the_queue() {
        let (publisher, mut pending, policy) = publisher_with_room_for_two();
        // Draining -> Upgrading is told on the policy only: one Event each.
        let routine = vec![change(Some(Draining), Upgrading); 3];
        publisher.nodes_changed(&policy, &routine);
        assert_eq!(publisher.dropped.load(Ordering::Relaxed), 1);
        publisher.nodes_changed(&policy, &[change(Some(Upgrading), Failed)]);
        publisher.policy_event(&policy, true, "RolloutHalted", "halted".into());
        assert_eq!(publisher.dropped.load(Ordering::Relaxed), 1);
        let mut reasons = Vec::new();
        while let Ok(queued) = pending.try_recv() {
            reasons.push(queued.event("ctl-0").reason.unwrap_or_default());
        }
        assert_eq!(
            reasons,
            [
                "NodeUpgrading",
                "NodeUpgrading",
                "NodeFailed",
                "NodeFailed",
                "RolloutHalted"
            ]
        );
    }

    #[tokio::test]
    async fn past_its_share_a_policy_hears_of_its_routine_steps_in_one_summary() {
        let (publisher, mut pending, policy) = publisher(QUEUE_CAPACITY);
        // Draining -> Upgrading is told on the policy only.
        let routine = vec![change(Some(Draining), Upgrading); 25];
        publisher.nodes_changed(&policy, &routine);
        publisher.nodes_changed(&policy, &[change(Some(Upgrading), Failed)]);
        publisher.end_windows();
        let mut reasons = Vec::new();
        while let Ok(queued) = pending.try_recv() {
            let e = queued.event("ctl-0");
            reasons.push((e.reason.unwrap_or_default(), e.note.unwrap_or_default()));
        }
        let told = reasons.iter().filter(|(r, _)| r == "NodeUpgrading").count();
        assert_eq!(told, event_tally::TOLD_PER_WINDOW as usize);
        let failed = reasons.iter().filter(|(r, _)| r == "NodeFailed").count();
        assert_eq!(
            failed, 2,
            "a failure is told on the policy and the node, always"
        );
        let summary = &reasons.last().unwrap();
        assert_eq!(summary.0, NODES_PROGRESSED);
        assert!(summary.1.starts_with("5 more node steps"), "{}", summary.1);
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
