//! Wiring: reflector stores and watches, the kube-runtime `Controller`, the admin server, leader
//! election and graceful shutdown. [`run`] is what the binary (and in-process tests) call.
//!
//! Watches, each converted or trimmed before it is cached ([`crate::pure::cached`]) so memory stays
//! small at fleet scale: policies (triggering on spec, finalizer and deletion changes, not on the controller's
//! own status writes); nodes (labels, ttdp's annotations and `spec.unschedulable`, triggering on
//! changes of those, mapped to the policies that select the node, hold its cordon or list it in
//! their status); agent pods (label `app.kubernetes.io/name=ttdp-agent` in the operator
//! namespace, mapped by their policy label); DaemonSets (same label, triggering on spec changes
//! and deletion, for drift). A finished drain wakes its policy directly.
//!
//! RBAC the controller needs: `tenstorrentdriverpolicies` get/list/watch/patch and
//! `tenstorrentdriverpolicies/status` patch; nodes get/list/watch/patch; in the operator
//! namespace daemonsets get/list/watch/patch/delete and leases get/create/update/patch; pods
//! list/watch/delete in every namespace (drains list a node's pods, and agent pods are
//! replaced), `pods/eviction` create, poddisruptionbudgets list (to name blocking budgets);
//! events.k8s.io events create; core events list in the operator namespace (to quote the
//! DaemonSet controller's `FailedCreate` on nodes left without an agent; without it those
//! nodes only say they wait).
//!
//! With `policy_selector` ([`Settings::policy_selector`]) only the selected policies are
//! watched, reconciled and weighed for overlaps.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::runtime::{Controller, PredicateConfig, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::labels;

use crate::error::Error;
use crate::pure::cached::{self, CachedNode, CachedPod};
use crate::pure::daemonset::all_agent_pods_selector;
use crate::pure::observe;
use crate::pure::overlap::selection_of;
use crate::runtime::process::context::{Caches, Context};
use crate::runtime::process::initial_lists::{InitialLists, Watched};
use crate::runtime::process::leader::{self, LeaderElection};
use crate::runtime::process::metrics::Metrics;
use crate::runtime::process::server::{self, Readiness};
use crate::runtime::process::watch_changes::WatchChanges;
use crate::runtime::reconcile::{error_policy, reconcile};
use crate::runtime::writes::events::EventPublisher;
use crate::settings::Settings;

/// Objects per page of the initial lists (bounds the memory a large fleet's list takes).
const LIST_PAGE: u32 = 250;

fn hash_of(value: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// What of a policy wakes its reconcile: spec (generation), finalizers, deletion, identity. The
/// controller's own status writes do not.
fn policy_trigger(p: &TenstorrentDriverPolicy) -> Option<u64> {
    let m = &p.metadata;
    Some(hash_of((
        &m.uid,
        m.generation,
        m.deletion_timestamp.as_ref().map(|t| t.0),
        &m.finalizers,
    )))
}

/// What of a cached node wakes reconciles: labels, ttdp's annotations, `spec.unschedulable`,
/// and its Ready condition when not True (the node's message names it); its deletion always
/// (no hash: the filter lets it through).
fn node_trigger(n: &CachedNode) -> Option<u64> {
    if n.deleted {
        return None;
    }
    Some(hash_of((
        &n.metadata.labels,
        &n.metadata.annotations,
        n.unschedulable,
        &n.not_ready,
    )))
}

/// Passes a DaemonSet on when it is new, deleted, or its spec (generation), uid or labels
/// changed; its status updates are not the controller's business.
fn daemonset_trigger(
    seen: &mut HashMap<String, u64>,
    event: Result<watcher::Event<DaemonSet>, watcher::Error>,
) -> Option<Result<DaemonSet, watcher::Error>> {
    match event {
        Ok(watcher::Event::Apply(ds) | watcher::Event::InitApply(ds)) => {
            let m = &ds.metadata;
            let key = hash_of((&m.uid, m.generation, &m.labels));
            (seen.insert(ds.name_any(), key) != Some(key)).then_some(Ok(ds))
        }
        Ok(watcher::Event::Delete(ds)) => {
            seen.remove(&ds.name_any());
            Some(Ok(ds))
        }
        Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
        Err(e) => Some(Err(e)),
    }
}

/// How the controller process runs, beyond [`Settings`].
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (`None`: no server).
    pub admin_address: Option<SocketAddr>,
    /// Leader election (`None`: act at once, for a single replica or tests).
    pub leader_election: Option<LeaderElection>,
    /// This replica's name on Events (the pod name).
    pub instance: Option<String>,
    /// The client drains use (`None`: the main client). It should have kube's built-in retry
    /// of 429/503/504 turned off (`kube::Config::default_retry = false`): with it, an eviction
    /// a PodDisruptionBudget refuses is retried within milliseconds, up to 15 times, instead of
    /// at ttdp-drain's back-off.
    pub drain_client: Option<Client>,
    /// Shared metrics (a fresh set when `None`).
    pub metrics: Option<Arc<Metrics>>,
    /// Readiness flag (a fresh one when `None`).
    pub readiness: Option<Readiness>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("admin_address", &self.admin_address)
            .field("leader_election", &self.leader_election)
            .field("instance", &self.instance)
            .field("drain_client", &self.drain_client.is_some())
            .finish_non_exhaustive()
    }
}

/// The policies a node event concerns: those selecting the node, the one whose cordon it
/// carries (so a node that left a selection is released), and those whose last written status
/// lists it.
fn policies_for_node(
    ctx: &Context,
    node: &CachedNode,
    require_nfd: bool,
) -> Vec<ObjectRef<TenstorrentDriverPolicy>> {
    let name = node.name();
    let node_labels = node.labels();
    ctx.caches
        .policies
        .state()
        .into_iter()
        .filter(|p| {
            observe::cordoned_by(&node.metadata, &p.name_any())
                || selection_of(p, require_nfd).is_some_and(|s| s.matches(name, node_labels))
                || ctx
                    .status_views
                    .decided(&p.uid().unwrap_or_default())
                    .is_some_and(|r| r.nodes.contains_key(name))
        })
        .map(|p| ObjectRef::from_obj(&*p))
        .collect()
}

/// Runs the controller until `shutdown` is cancelled (or leadership is lost).
pub async fn run(
    client: Client,
    settings: Settings,
    options: RunOptions,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let metrics = options.metrics.clone().unwrap_or_else(Metrics::shared);
    let readiness = options.readiness.clone().unwrap_or_default();
    let admin = match options.admin_address {
        Some(address) => {
            let serving = server::serve(
                address,
                metrics.clone(),
                readiness.clone(),
                shutdown.clone(),
            );
            Some(serving.await?)
        }
        None => None,
    };
    let leadership = match &options.leader_election {
        Some(le) => match leader::acquire(client.clone(), le, &readiness, &shutdown).await? {
            Some(l) => Some(l),
            None => return Ok(()),
        },
        None => None,
    };
    let stop = stop_on(&shutdown, leadership.as_ref().map(|l| l.lost.clone()));
    // This replica acts from here until `stop`: it holds the lease, or runs without election.
    metrics.set_leading(true);
    let leading = metrics.clone();
    watch_and_reconcile(client, settings, &options, metrics, readiness.clone(), stop).await;
    leading.set_leading(false);
    readiness.set(false);
    info!("controller stopped");
    if let Some(l) = leadership {
        l.stop().await;
    }
    if let Some((_, task)) = admin {
        shutdown.cancel();
        let _ = task.await;
    }
    Ok(())
}

/// A token cancelled at `shutdown` or when leadership is `lost`.
fn stop_on(shutdown: &CancellationToken, lost: Option<CancellationToken>) -> CancellationToken {
    let stop = CancellationToken::new();
    let (token, shutdown) = (stop.clone(), shutdown.clone());
    tokio::spawn(async move {
        match lost {
            Some(lost) => tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = lost.cancelled() => {}
            },
            None => shutdown.cancelled().await,
        }
        token.cancel();
    });
    stop
}

/// Watches policies, nodes, agent pods and DaemonSets and reconciles until `stop`.
async fn watch_and_reconcile(
    client: Client,
    settings: Settings,
    options: &RunOptions,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    stop: CancellationToken,
) {
    let ns = settings.namespace.clone();
    let require_nfd = settings.require_nfd;
    let initial_lists = InitialLists::default();
    let changes = Arc::new(WatchChanges::default());
    let (policies, policy_stream) =
        watch_policies(&client, &settings, &initial_lists, changes.clone());
    let changes_for_stop = changes.clone();
    let (nodes, node_stream) = watch_nodes(&client, require_nfd, &initial_lists, changes.clone());
    let (agent_pods, pod_stream) = watch_agent_pods(&client, &ns, &initial_lists, changes.clone());
    let (daemonsets, ds_stream) = watch_daemonsets(&client, &ns, &initial_lists, changes.clone());
    let caches = Caches {
        policies: policies.clone(),
        nodes,
        agent_pods,
        daemonsets,
        initial_lists: initial_lists.clone(),
        changes,
    };
    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded();
    let drain_client = options
        .drain_client
        .clone()
        .unwrap_or_else(|| client.clone());
    let events = EventPublisher::new(client.clone(), options.instance.clone());
    let ctx = Arc::new(Context::new(
        client,
        drain_client,
        settings,
        caches,
        events,
        metrics,
        wake_tx,
    ));
    tokio::spawn(async move {
        if initial_lists.wait(Duration::MAX).await {
            info!("initial watches synced; ready");
            readiness.set(true);
        }
    });
    let closing = (changes_for_stop, stop.clone());
    tokio::spawn(async move {
        closing.1.cancelled().await;
        closing.0.close();
    });
    let node_ctx = ctx.clone();
    // Owned DaemonSets, mapped by label: `owns` would give the cluster-scoped policy the
    // DaemonSet's namespace.
    Controller::for_stream(policy_stream, policies)
        .watches_stream(ds_stream, |ds| policy_label_of(&ds))
        .watches_stream(node_stream, move |node| {
            policies_for_node(&node_ctx, &node, require_nfd)
        })
        .watches_stream(pod_stream, |pod| policy_label_of(&pod))
        .reconcile_on(wake_rx)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                warn!(error = %err, "controller event");
            }
        })
        .await;
}

/// The policy an object of ours belongs to, by its policy label.
fn policy_label_of(object: &impl ResourceExt) -> Option<ObjectRef<TenstorrentDriverPolicy>> {
    let policy = object.labels().get(labels::POLICY)?;
    Some(ObjectRef::new(policy))
}

/// The policies (with `policy_selector`, the selected ones), cached without their node entries,
/// triggering on spec, finalizer and deletion changes (each wakes the passes following a fleet).
fn watch_policies(
    client: &Client,
    settings: &Settings,
    lists: &InitialLists,
    changes: Arc<WatchChanges>,
) -> (
    Store<TenstorrentDriverPolicy>,
    impl Stream<Item = Result<TenstorrentDriverPolicy, watcher::Error>> + use<>,
) {
    let (store, writer) = reflector::store();
    let mut config = watcher::Config::default();
    if let Some(selector) = &settings.policy_selector {
        config = config.labels(selector);
    }
    let stream = watcher::watcher(Api::<cached::WatchedPolicy>::all(client.clone()), config)
        .default_backoff()
        .map_ok(cached::policy_event)
        .inspect(lists.recorder(Watched::Policies))
        .reflect(writer)
        .touched_objects()
        .predicate_filter(policy_trigger, PredicateConfig::default())
        // A pass following a fleet ends on a policy change it has not seen.
        .inspect(move |_| changes.poke());
    (store, stream)
}

/// Every node that matters ([`cached::node_matters`]), trimmed, recording its changes for
/// reconciles following the fleet.
fn watch_nodes(
    client: &Client,
    require_nfd: bool,
    lists: &InitialLists,
    changes: Arc<WatchChanges>,
) -> (
    Store<CachedNode>,
    impl Stream<Item = Result<CachedNode, watcher::Error>> + use<>,
) {
    let (store, writer) = reflector::store();
    let stored = store.clone();
    let config = watcher::Config::default().page_size(LIST_PAGE);
    let stream = watcher::watcher(Api::<Node>::all(client.clone()), config)
        .default_backoff()
        .map_ok(move |event| cached::node_event(event, require_nfd))
        .inspect(lists.recorder(Watched::Nodes))
        .try_filter_map(move |event| {
            let in_store = |name: &str| stored.get(&ObjectRef::new(name)).is_some();
            futures::future::ready(Ok(cached::node_store_event(event, require_nfd, in_store)))
        })
        .reflect(writer)
        .inspect(move |event| changes.node_event(event))
        .touched_objects()
        .predicate_filter(node_trigger, PredicateConfig::default());
    (store, stream)
}

/// The agent pods in the operator namespace, trimmed, recording their changes.
fn watch_agent_pods(
    client: &Client,
    ns: &str,
    lists: &InitialLists,
    changes: Arc<WatchChanges>,
) -> (
    Store<CachedPod>,
    impl Stream<Item = Result<CachedPod, watcher::Error>> + use<>,
) {
    let (store, writer) = reflector::store();
    let config = watcher::Config::default()
        .labels(&all_agent_pods_selector())
        .page_size(LIST_PAGE);
    let stream = watcher::watcher(Api::<Pod>::namespaced(client.clone(), ns), config)
        .default_backoff()
        .map_ok(cached::agent_pod_event)
        .inspect(lists.recorder(Watched::AgentPods))
        .reflect(writer)
        .inspect(move |event| changes.pod_event(event))
        .touched_objects();
    (store, stream)
}

/// The agent DaemonSets in the operator namespace, trimmed, passed on when their spec changes.
fn watch_daemonsets(
    client: &Client,
    ns: &str,
    lists: &InitialLists,
    changes: Arc<WatchChanges>,
) -> (
    Store<DaemonSet>,
    impl Stream<Item = Result<DaemonSet, watcher::Error>> + use<>,
) {
    let (store, writer) = reflector::store();
    let mut seen = HashMap::new();
    let config = watcher::Config::default().labels(&format!(
        "{}={}",
        labels::APP_NAME,
        labels::APP_NAME_AGENT
    ));
    let stream = watcher::watcher(Api::<DaemonSet>::namespaced(client.clone(), ns), config)
        .default_backoff()
        .modify(cached::daemonset)
        .inspect(lists.recorder(Watched::DaemonSets))
        .reflect(writer)
        .filter_map(move |event| futures::future::ready(daemonset_trigger(&mut seen, event)))
        .inspect(move |ds| {
            if let Some(policy) = ds
                .as_ref()
                .ok()
                .and_then(|d| d.labels().get(labels::POLICY))
            {
                changes.daemonset_changed(policy);
            }
        });
    (store, stream)
}
