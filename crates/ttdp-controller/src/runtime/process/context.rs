//! What every reconcile shares: the client, settings, reflector stores, Events, metrics, the
//! background drains and node tasks, the writers (each with its memory), and the error back-off.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use ttdp_api::{TenstorrentDriverPolicy, names};
use ttdp_kmd_types::KmdVersion;

use crate::error::Error;
use crate::pure::cached::{CachedNode, CachedPod};
use crate::pure::rollout::RolloutPlan;
use crate::pure::status::{PolicyFacts, ReconcileFailure};
use crate::runtime::process::initial_lists::InitialLists;
use crate::runtime::process::watch_changes::WatchChanges;
use crate::runtime::writes::agent_daemonset::{AgentDaemonSet, AppliedDaemonSets};
use crate::runtime::writes::status_view::StatusViews;

use crate::runtime::node_work::drain_tracker::DrainTracker;
use crate::runtime::node_work::node_tasks::NodeTasks;
use crate::runtime::process::metrics::Metrics;
use crate::runtime::reconcile::backoff::ErrorBackoff;
use crate::runtime::writes::events::EventPublisher;
use crate::settings::Settings;

/// What the watches keep: reflector stores, which watches have listed once, and what they
/// changed since (for reconciles following the fleet).
#[derive(Clone)]
pub struct Caches {
    /// Every (selected) policy.
    pub policies: Store<TenstorrentDriverPolicy>,
    /// Every node, as much as the controller reads of it.
    pub nodes: Store<CachedNode>,
    /// Every agent pod in the operator namespace, as much as the controller reads of it.
    pub agent_pods: Store<CachedPod>,
    /// The agent DaemonSets in the operator namespace, trimmed ([`crate::pure::cached::daemonset`]).
    pub daemonsets: Store<DaemonSet>,
    /// Which watches have listed their objects once.
    pub initial_lists: InitialLists,
    /// What the node and agent-pod watches changed.
    pub changes: Arc<WatchChanges>,
}

/// How long a deleted agent pod is not deleted again (its cached copy may lag its deletion).
const DELETION_MEMORY: Duration = Duration::from_secs(30);

/// Shared by every reconcile.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The client drains use: without kube's built-in retry of 429 responses, so an eviction a
    /// PodDisruptionBudget refuses is retried at ttdp-drain's back-off, not within milliseconds.
    pub drain_client: Client,
    /// The controller's settings.
    pub settings: Settings,
    /// The watched objects.
    pub caches: Caches,
    /// Event publishing.
    pub events: EventPublisher,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Background drains.
    pub drains: DrainTracker,
    /// Background node actions.
    pub node_tasks: NodeTasks,
    /// Per-object error back-off.
    pub backoff: ErrorBackoff,
    /// Wakes a policy's reconcile (drain finished).
    pub wake: UnboundedSender<ObjectRef<TenstorrentDriverPolicy>>,
    /// The policies' status writers, with the status each policy last decided.
    pub status_views: StatusViews,
    /// What was last applied of each agent DaemonSet.
    pub daemonsets: AppliedDaemonSets,
    failures: Mutex<HashMap<String, ReconcileFailure>>,
    deleted_pods: Mutex<HashMap<String, Instant>>,
    /// By policy, the nodes whose cordon a reconcile lifted before the status write that
    /// records their Uncordoning, while that write has not succeeded.
    lifted_unrecorded: Mutex<HashMap<String, HashSet<String>>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .field("drains", &self.drains)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context with empty memory.
    pub fn new(
        client: Client,
        drain_client: Client,
        settings: Settings,
        caches: Caches,
        events: EventPublisher,
        metrics: Arc<Metrics>,
        wake: UnboundedSender<ObjectRef<TenstorrentDriverPolicy>>,
    ) -> Self {
        let node_tasks = NodeTasks::default();
        Self {
            client,
            drain_client,
            settings,
            caches,
            events,
            metrics,
            drains: DrainTracker::default(),
            status_views: StatusViews::new(node_tasks.clone()),
            node_tasks,
            backoff: ErrorBackoff::default(),
            wake,
            failures: Mutex::default(),
            daemonsets: AppliedDaemonSets::default(),
            deleted_pods: Mutex::default(),
            lifted_unrecorded: Mutex::default(),
        }
    }

    /// The policy-wide facts of the status and the planner's inputs, under these settings.
    pub fn plan_of(
        &self,
        policy: &TenstorrentDriverPolicy,
        target: &KmdVersion,
        managed: usize,
    ) -> Result<(PolicyFacts, RolloutPlan), Error> {
        let spec = &policy.spec;
        let gates_configured = !self.settings.deploy_gates.is_empty();
        let plan = RolloutPlan::of(spec, target, managed, gates_configured).map_err(|source| {
            Error::InvalidSpec {
                policy: policy.name_any(),
                source,
            }
        })?;
        let max_unavailable = plan.max_unavailable;
        let facts = PolicyFacts {
            generation: policy.metadata.generation,
            target_version: spec.version.clone(),
            paused: spec.paused,
            invalid_spec: None,
            max_unavailable,
            failure: self.failure(&policy.uid().unwrap_or_default()),
            canary_halt: None,
        };
        Ok((facts, plan))
    }

    /// The failure the last reconcile of the policy with this uid reported, if it failed.
    pub fn failure(&self, uid: &str) -> Option<ReconcileFailure> {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .cloned()
    }

    /// Remembers the policy's failure (`None`: it reconciled); returns the one it replaces.
    pub fn remember_failure(
        &self,
        uid: &str,
        failure: Option<ReconcileFailure>,
    ) -> Option<ReconcileFailure> {
        let mut map = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        match failure {
            Some(f) => map.insert(uid.to_owned(), f),
            None => map.remove(uid),
        }
    }

    /// `policy`'s agent DaemonSet as the caches show it, with what applying it needs.
    pub fn agent_daemonset(&self, policy: &str) -> AgentDaemonSet<'_> {
        let name = names::daemonset_name(policy);
        let key = ObjectRef::<DaemonSet>::new(&name).within(&self.settings.namespace);
        AgentDaemonSet {
            client: &self.client,
            settings: &self.settings,
            applied: &self.daemonsets,
            cached: self.caches.daemonsets.get(&key),
            all_cached: &self.caches.daemonsets,
            agent_pods: &self.caches.agent_pods,
            policy: policy.to_owned(),
            name,
        }
    }

    /// Whether the agent pod with this uid is to be deleted now: false when it was deleted in
    /// the last 30 s (an empty uid is always deleted).
    pub fn first_deletion(&self, uid: &str) -> bool {
        if uid.is_empty() {
            return true;
        }
        let now = Instant::now();
        let mut map = self
            .deleted_pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, at| now.duration_since(*at) < DELETION_MEMORY);
        map.insert(uid.to_owned(), now).is_none()
    }

    /// Forgets a deletion that failed, so the next reconcile tries again.
    pub fn forget_deletion(&self, uid: &str) {
        self.deleted_pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }

    /// Remembers that the cordons of `nodes` were lifted and their Uncordoning is not recorded
    /// yet (`unrecorded`), or that it is now. A node lifted before a status write that failed
    /// counts as cordoned by us until then, so its Uncordoning is still shown.
    pub fn note_lifted(&self, policy: &str, nodes: &[String], unrecorded: bool) {
        if nodes.is_empty() {
            return;
        }
        let mut lifted = self
            .lifted_unrecorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if unrecorded {
            let of_policy = lifted.entry(policy.to_owned()).or_default();
            of_policy.extend(nodes.iter().cloned());
        } else if let Some(of_policy) = lifted.get_mut(policy) {
            for node in nodes {
                of_policy.remove(node);
            }
            if of_policy.is_empty() {
                lifted.remove(policy);
            }
        }
    }

    /// Whether `node`'s cordon was lifted by a reconcile whose status write then failed.
    pub fn lifted_unrecorded(&self, policy: &str, node: &str) -> bool {
        self.lifted_unrecorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(policy)
            .is_some_and(|nodes| nodes.contains(node))
    }

    /// Forgets a deleted policy.
    pub fn forget(&self, uid: &str) {
        self.status_views.forget(uid);
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }
}
