//! What every reconcile shares: the client, settings, reflector stores, Events, metrics, the
//! background drains, the memory of recorded node states and the error back-off.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use ttdp_api::{NodeStatus, TenstorrentDriverPolicy, TenstorrentDriverPolicyStatus};

use crate::backoff::ErrorBackoff;
use crate::drain_tracker::DrainTracker;
use crate::events::EventPublisher;
use crate::metrics::Metrics;
use crate::settings::Settings;

/// The last status the controller wrote for a policy (by uid), uncompacted. The API server's copy
/// is the durable one; this only bridges the moment between a write and its watch event.
#[derive(Clone, Debug, Default)]
pub struct Written {
    /// The status as written.
    pub status: TenstorrentDriverPolicyStatus,
    /// Every node entry, including ones compacted out of the status.
    pub nodes: BTreeMap<String, NodeStatus>,
}

/// Shared by every reconcile.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The controller's settings.
    pub settings: Settings,
    /// Every policy (the controller's own store).
    pub policies: Store<TenstorrentDriverPolicy>,
    /// Every node's metadata.
    pub nodes: Store<PartialObjectMeta<Node>>,
    /// Every agent pod in the operator namespace.
    pub agent_pods: Store<Pod>,
    /// Event publishing.
    pub events: EventPublisher,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Background drains.
    pub drains: DrainTracker,
    /// Per-object error back-off.
    pub backoff: ErrorBackoff,
    /// Wakes a policy's reconcile (drain finished).
    pub wake: UnboundedSender<ObjectRef<TenstorrentDriverPolicy>>,
    /// Bit mask of the watches whose initial list arrived ([`crate::run::SYNCED_ALL`] when all).
    pub synced: tokio::sync::watch::Receiver<u8>,
    written: Mutex<HashMap<String, Written>>,
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
        settings: Settings,
        policies: Store<TenstorrentDriverPolicy>,
        nodes: Store<PartialObjectMeta<Node>>,
        agent_pods: Store<Pod>,
        events: EventPublisher,
        metrics: Arc<Metrics>,
        wake: UnboundedSender<ObjectRef<TenstorrentDriverPolicy>>,
        synced: tokio::sync::watch::Receiver<u8>,
    ) -> Self {
        Self {
            client,
            settings,
            policies,
            nodes,
            agent_pods,
            events,
            metrics,
            drains: DrainTracker::default(),
            backoff: ErrorBackoff::default(),
            wake,
            synced,
            written: Mutex::default(),
        }
    }

    /// What was last written for the policy with this uid.
    pub fn written(&self, uid: &str) -> Option<Written> {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .cloned()
    }

    /// Remembers what was written for the policy with this uid.
    pub fn remember(&self, uid: &str, written: Written) {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(uid.to_owned(), written);
    }

    /// Forgets a deleted policy.
    pub fn forget(&self, uid: &str) {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }
}
