//! The events that happen to the world, and how they are drawn. A node is named by an index
//! taken modulo the number of nodes, so any event applies to any world (which keeps shrinking
//! simple); an event that does not apply to the world as it is changes nothing.

use std::time::Duration;

use k8s_openapi::jiff::SignedDuration;
use proptest::prelude::*;
use proptest::sample::select;
use ttdp_api::driver::module_settings::{ModuleSettings, ModuleSigning};
use ttdp_api::names::{annotations, labels};

use super::{
    OtherPolicy, POLICY, SIGNING_SECRETS, Setup, VERSIONS, World, agent, controller, other,
};
use crate::pure::node_record;
use crate::pure::transition::DrainProgress;

/// Something that happens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Event {
    /// The controller reconciles our policy (one round).
    Reconcile,
    /// A quiet while: three times, a reconcile, then every agent acts and every drain running
    /// finishes.
    Progress,
    /// The DaemonSet controller and the agent on a node take a step.
    Agent(usize),
    /// The agent on a node fails; `unloaded`: nothing is loaded after the failure.
    AgentFails { node: usize, unloaded: bool },
    /// The node's kubelet stops (its agent stops with it).
    NodeNotReady(usize),
    /// The node is Ready again.
    NodeReady(usize),
    /// The node's drain finishes.
    DrainDone(usize),
    /// The node's drain is blocked (a PodDisruptionBudget).
    DrainBlocked(usize),
    /// The node's drain fails; `jobs`: the wait for its jobs timed out (`onTimeout: Fail`).
    DrainFails { node: usize, jobs: bool },
    /// `spec.version` changes to `VERSIONS[i]`.
    Version(usize),
    /// `spec.module.signing` names `SIGNING_SECRETS[i]`, or is removed (`None`).
    Signing(Option<usize>),
    /// `spec.paused` is set.
    Pause(bool),
    /// The maintenance window opens or closes.
    Window(bool),
    /// Time passes.
    Tick(u64),
    /// The controller restarts: its memory (drains, notes, the status it decided) is gone and
    /// it reads the status the API server has; `status`: that is gone too.
    Restart { status: bool },
    /// The skip label is put on or taken off the node.
    Skip { node: usize, on: bool },
    /// An admin asks for a retry of the node.
    Retry(usize),
    /// The next write to the node fails.
    NodeWriteFails(usize),
    /// The next status write fails.
    StatusWriteFails,
    /// A newer policy selecting the pool is created.
    OtherCreated,
    /// The other policy is deleted.
    OtherDeleted,
    /// The other policy reconciles.
    OtherReconciles,
    /// The other policy cordons a node it owns.
    OtherCordons(usize),
    /// The other policy releases a node it owns.
    OtherReleases(usize),
}

impl World {
    /// Applies `event`.
    pub(super) fn apply(&mut self, event: &Event) {
        let n = self.nodes.len();
        match *event {
            Event::Reconcile => controller::reconcile(self),
            Event::Progress => self.progress(),
            Event::Agent(i) => agent::act(self, i % n),
            Event::AgentFails { node, unloaded } => agent::fail(self, node % n, unloaded),
            Event::NodeNotReady(i) => {
                let node = &mut self.nodes[i % n];
                node.not_ready = true;
                if let Some(pod) = node.pod.as_mut() {
                    pod.ready = false;
                }
            }
            Event::NodeReady(i) => self.nodes[i % n].not_ready = false,
            Event::DrainDone(i) => self.drain_ends(i % n, None),
            Event::DrainBlocked(i) => self.drain_blocked(i % n),
            Event::DrainFails { node, jobs } => {
                let reason = if jobs {
                    "WaitForCompletionTimeout"
                } else {
                    "DrainTimeout"
                };
                self.drain_ends(node % n, Some(reason));
            }
            Event::Version(v) => self.spec.version = VERSIONS[v % VERSIONS.len()].to_owned(),
            Event::Signing(secret) => self.sign_with(secret),
            Event::Pause(on) => self.spec.paused = on,
            Event::Window(open) => self.window_open = open,
            Event::Tick(secs) => {
                self.now += SignedDuration::try_from(Duration::from_secs(secs)).unwrap_or_default();
            }
            Event::Restart { status } => self.restart(status),
            Event::Skip { node, on } => self.skip(node % n, on),
            Event::Retry(i) => {
                let node = &mut self.nodes[i % n];
                node.annotations
                    .insert(annotations::RETRY.into(), "now".into());
            }
            Event::NodeWriteFails(i) => self.nodes[i % n].fail_next_write = true,
            Event::StatusWriteFails => self.fail_next_status_write = true,
            Event::OtherCreated => {
                self.other.get_or_insert(OtherPolicy { older: false });
            }
            Event::OtherDeleted => other::delete(self),
            Event::OtherReconciles => other::reconcile(self),
            Event::OtherCordons(i) => other::cordon(self, i % n),
            Event::OtherReleases(i) => other::release(self, i % n),
        }
    }

    /// `spec.module.signing` names `SIGNING_SECRETS[i]`, or none.
    fn sign_with(&mut self, secret: Option<usize>) {
        let signing = secret.map(|i| ModuleSigning {
            secret_name: SIGNING_SECRETS[i % SIGNING_SECRETS.len()].to_owned(),
        });
        match (self.spec.module.as_mut(), signing) {
            (Some(module), signing) => module.signing = signing,
            (None, None) => {}
            (None, signing) => {
                self.spec.module = Some(ModuleSettings {
                    signing,
                    ..ModuleSettings::default()
                });
            }
        }
    }

    /// A running drain of node `i` ends: succeeded (`failed` None) or failed for that reason.
    fn drain_ends(&mut self, i: usize, failed: Option<&str>) {
        let node = &mut self.nodes[i];
        let Some(progress) = self.drains.get_mut(&node.name) else {
            return;
        };
        if !matches!(progress, DrainProgress::Running { .. }) {
            return;
        }
        *progress = match failed {
            None => {
                node.drained = node.unschedulable;
                DrainProgress::Succeeded {
                    skipped: Vec::new(),
                }
            }
            Some(reason) => DrainProgress::Failed {
                reason: reason.to_owned(),
                message: format!("{reason}: the drain of {} did not finish", node.name),
            },
        };
    }

    fn progress(&mut self) {
        for _ in 0..3 {
            controller::reconcile(self);
            for i in 0..self.nodes.len() {
                agent::act(self, i);
                self.drain_ends(i, None);
            }
        }
    }

    fn drain_blocked(&mut self, i: usize) {
        if let Some(progress @ DrainProgress::Running { .. }) =
            self.drains.get_mut(&self.nodes[i].name)
        {
            *progress = DrainProgress::Running {
                message: "evicting 1 pod: blocked by a PodDisruptionBudget".into(),
            };
        }
    }

    fn restart(&mut self, status: bool) {
        self.drains.clear();
        self.lifted_unrecorded.clear();
        if status {
            self.view = Default::default();
        }
        (self.status, self.entries) = self.view.clone();
        // What `reconcile::last_recorded` reads: the status, with the nodes' records over it.
        let metas: Vec<_> = self
            .nodes
            .iter()
            .map(|n| controller::cached_node(n).metadata)
            .collect();
        let on_nodes = self
            .nodes
            .iter()
            .zip(&metas)
            .map(|(n, m)| (n.name.as_str(), m));
        node_record::overlay(&mut self.entries, on_nodes, POLICY);
    }

    fn skip(&mut self, i: usize, on: bool) {
        let node = &mut self.nodes[i];
        if on {
            node.labels.insert(labels::SKIP.into(), "true".into());
        } else {
            node.labels.remove(labels::SKIP);
        }
    }
}

/// The model's fixed choices.
pub(super) fn setup() -> impl Strategy<Value = Setup> {
    (
        2usize..=4,
        1usize..=2,
        any::<bool>(),
        proptest::option::weighted(0.4, (1usize..=2, select(vec![0i64, 300]), any::<bool>())),
        proptest::bool::weighted(0.25),
        proptest::bool::weighted(0.25),
        proptest::collection::vec(0usize..4, 0..=1),
        proptest::option::weighted(0.2, any::<bool>()),
    )
        .prop_map(
            |(nodes, max, drain, canary, schedule, wait_fail, fresh, other)| Setup {
                nodes,
                max_unavailable: max,
                drain,
                canary,
                schedule,
                wait_fail,
                fresh,
                other_older: other,
            },
        )
}

/// One event, the common ones more often.
pub(super) fn event() -> impl Strategy<Value = Event> {
    let node = 0usize..4;
    prop_oneof![
        12 => Just(Event::Reconcile),
        4 => Just(Event::Progress),
        12 => node.clone().prop_map(Event::Agent),
        2 => (node.clone(), any::<bool>()).prop_map(|(node, unloaded)| Event::AgentFails { node, unloaded }),
        1 => node.clone().prop_map(Event::NodeNotReady),
        1 => node.clone().prop_map(Event::NodeReady),
        4 => node.clone().prop_map(Event::DrainDone),
        1 => node.clone().prop_map(Event::DrainBlocked),
        1 => (node.clone(), any::<bool>()).prop_map(|(node, jobs)| Event::DrainFails { node, jobs }),
        3 => prop_oneof![3 => 1usize..3, 1 => Just(0)].prop_map(Event::Version),
        1 => prop_oneof![Just(None), (0usize..2).prop_map(Some)].prop_map(Event::Signing),
        1 => any::<bool>().prop_map(Event::Pause),
        1 => any::<bool>().prop_map(Event::Window),
        3 => select(vec![30u64, 30, 300, 700]).prop_map(Event::Tick),
        1 => any::<bool>().prop_map(|status| Event::Restart { status }),
        1 => (node.clone(), any::<bool>()).prop_map(|(node, on)| Event::Skip { node, on }),
        1 => node.clone().prop_map(Event::Retry),
        1 => node.clone().prop_map(Event::NodeWriteFails),
        1 => Just(Event::StatusWriteFails),
        1 => Just(Event::OtherCreated),
        1 => Just(Event::OtherDeleted),
        1 => Just(Event::OtherReconciles),
        1 => node.clone().prop_map(Event::OtherCordons),
        1 => node.prop_map(Event::OtherReleases),
    ]
}
