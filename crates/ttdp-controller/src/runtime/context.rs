//! What every reconcile shares: the client, settings, reflector stores, Events, metrics, the
//! background drains, the memory of recorded node states and the error back-off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use ttdp_api::{TenstorrentDriverPolicy, TenstorrentDriverPolicyStatus};

use crate::pure::cached::{CachedNode, CachedPod};
use crate::pure::status::ReconcileFailure;
use crate::runtime::backoff::ErrorBackoff;
use crate::runtime::drain_tracker::DrainTracker;
use crate::runtime::events::EventPublisher;
use crate::runtime::metrics::Metrics;
use crate::runtime::node_tasks::NodeTasks;
use crate::settings::Settings;

/// The last status the controller wrote for a policy (by uid), uncompacted. The API server's copy
/// is the durable one; this only bridges the moment between a write and its watch event.
#[derive(Clone, Debug, Default)]
pub struct Written {
    /// The status as written, without its node entries (those are in `nodes`).
    pub status: TenstorrentDriverPolicyStatus,
    /// Every node entry, including ones compacted out of the status.
    pub nodes: crate::pure::status::Entries,
    /// The policy's `resourceVersion` right after that write (or when the status was read):
    /// while the policy still has it, the next write can send only what changed.
    pub resource_version: Option<String>,
    /// When that write started (None: not written by this process).
    pub written_at: Option<Instant>,
}

/// A DaemonSet as the controller last applied it: skipping an apply is safe while the cached
/// DaemonSet is still this object at this generation and the desired one has not changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// sha256 of the desired DaemonSet's JSON.
    pub digest: String,
    /// The DaemonSet's uid after the apply.
    pub uid: Option<String>,
    /// Its `metadata.generation` after the apply.
    pub generation: Option<i64>,
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
    /// Every policy (the controller's own store).
    pub policies: Store<TenstorrentDriverPolicy>,
    /// Every node, as much as the controller reads of it.
    pub nodes: Store<CachedNode>,
    /// Every agent pod in the operator namespace, as much as the controller reads of it.
    pub agent_pods: Store<CachedPod>,
    /// The agent DaemonSets in the operator namespace, trimmed ([`crate::pure::cached::daemonset`]).
    pub daemonsets: Store<DaemonSet>,
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
    /// Bit mask of the watches whose initial list arrived ([`crate::runtime::run::SYNCED_ALL`] when all).
    pub synced: tokio::sync::watch::Receiver<u8>,
    /// What the node and agent-pod watches changed, for reconciles following the fleet.
    pub changes: Arc<crate::runtime::refresh::Changes>,
    written: Mutex<HashMap<String, Arc<Written>>>,
    failures: Mutex<HashMap<String, ReconcileFailure>>,
    applied: Mutex<HashMap<String, Applied>>,
    deleted_pods: Mutex<HashMap<String, Instant>>,
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
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        drain_client: Client,
        settings: Settings,
        policies: Store<TenstorrentDriverPolicy>,
        nodes: Store<CachedNode>,
        agent_pods: Store<CachedPod>,
        daemonsets: Store<DaemonSet>,
        events: EventPublisher,
        metrics: Arc<Metrics>,
        wake: UnboundedSender<ObjectRef<TenstorrentDriverPolicy>>,
        synced: tokio::sync::watch::Receiver<u8>,
        changes: Arc<crate::runtime::refresh::Changes>,
    ) -> Self {
        Self {
            client,
            drain_client,
            settings,
            policies,
            nodes,
            agent_pods,
            daemonsets,
            events,
            metrics,
            drains: DrainTracker::default(),
            node_tasks: NodeTasks::default(),
            backoff: ErrorBackoff::default(),
            wake,
            synced,
            changes,
            written: Mutex::default(),
            failures: Mutex::default(),
            applied: Mutex::default(),
            deleted_pods: Mutex::default(),
        }
    }

    /// What was last written for the policy with this uid.
    pub fn written(&self, uid: &str) -> Option<Arc<Written>> {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .cloned()
    }

    /// Remembers what was written for the policy with this uid.
    pub fn remember(&self, uid: &str, written: Arc<Written>) {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(uid.to_owned(), written);
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

    /// What was last applied as DaemonSet `name`.
    pub fn applied(&self, name: &str) -> Option<Applied> {
        self.applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Remembers what was applied as DaemonSet `name` (`None`: forget it).
    pub fn remember_applied(&self, name: &str, applied: Option<Applied>) {
        let mut map = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        match applied {
            Some(a) => map.insert(name.to_owned(), a),
            None => map.remove(name),
        };
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

    /// Forgets a deleted policy.
    pub fn forget(&self, uid: &str) {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }
}
