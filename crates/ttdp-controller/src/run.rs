//! Wiring: reflector stores and watches, the kube-runtime `Controller`, the admin server, leader
//! election and graceful shutdown. [`run`] is what the binary (and in-process tests) call.
//!
//! Watches: policies; nodes (metadata only, triggering on label/annotation changes, mapped to
//! the policies that select the node, hold its cordon or list it in their status); agent pods
//! (label `app.kubernetes.io/name=ttdp-agent` in the operator namespace, mapped by their policy
//! label); DaemonSets (same label, for drift). A finished drain wakes its policy directly.
//!
//! RBAC the controller needs: `tenstorrentdriverpolicies` get/list/watch/patch and
//! `tenstorrentdriverpolicies/status` patch; nodes get/list/watch/patch; in the operator
//! namespace daemonsets get/list/watch/patch/delete and leases get/create/update/patch; pods
//! list/watch/delete in every namespace (drains list a node's pods, and agent pods are
//! replaced), `pods/eviction` create, poddisruptionbudgets list (to name blocking budgets);
//! events.k8s.io events create/patch.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::runtime::{Controller, Predicate, PredicateConfig, WatchStreamExt, predicates};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::labels;

use crate::context::Context;
use crate::daemonset::all_agent_pods_selector;
use crate::error::Error;
use crate::events::EventPublisher;
use crate::leader::{self, LeaderElection};
use crate::metrics::Metrics;
use crate::observe;
use crate::overlap::selection_of;
use crate::reconcile::{error_policy, reconcile};
use crate::server::{self, Readiness};
use crate::settings::Settings;

/// Bit of the synced mask: the policy list arrived.
const SYNCED_POLICIES: u8 = 1;
/// Bit of the synced mask: the node list arrived.
const SYNCED_NODES: u8 = 2;
/// Bit of the synced mask: the agent pod list arrived.
const SYNCED_PODS: u8 = 4;
/// Every initial list arrived.
pub const SYNCED_ALL: u8 = SYNCED_POLICIES | SYNCED_NODES | SYNCED_PODS;

/// A stream inspector that sets `bit` in the synced mask at the watch's first InitDone.
fn mark_synced<K>(
    tx: &tokio::sync::watch::Sender<u8>,
    bit: u8,
) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) + use<K> {
    let tx = tx.clone();
    move |event| {
        if matches!(event, Ok(watcher::Event::InitDone)) {
            tx.send_if_modified(|v| {
                let before = *v;
                *v |= bit;
                before != *v
            });
        }
    }
}

/// How the controller process runs, beyond [`Settings`].
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (`None`: no server).
    pub admin_address: Option<SocketAddr>,
    /// Leader election (`None`: act at once, for a single replica or tests).
    pub leader_election: Option<LeaderElection>,
    /// This replica's name on Events (the pod name).
    pub instance: Option<String>,
    /// Shared metrics (a fresh set when `None`).
    pub metrics: Option<Arc<Metrics>>,
    /// Readiness flag (a fresh one when `None`).
    pub readiness: Option<Readiness>,
}

/// The policies a node event concerns: those selecting the node, and the one whose cordon it
/// carries (so a node that left a selection is released).
fn policies_for_node(
    policies: &reflector::Store<TenstorrentDriverPolicy>,
    node: &kube::core::PartialObjectMeta<Node>,
    require_nfd: bool,
) -> Vec<ObjectRef<TenstorrentDriverPolicy>> {
    let name = node.name_any();
    let empty = BTreeMap::new();
    let node_labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    policies
        .state()
        .into_iter()
        .filter(|p| {
            observe::cordoned_by(&node.metadata, &p.name_any())
                || selection_of(p, require_nfd).is_some_and(|s| s.matches(&name, node_labels))
                || p.status
                    .as_ref()
                    .is_some_and(|s| s.nodes.iter().any(|n| n.name == name))
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
        Some(address) => Some(
            server::serve(
                address,
                metrics.clone(),
                readiness.clone(),
                shutdown.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let leadership = match &options.leader_election {
        Some(le) => match leader::acquire(client.clone(), le, &shutdown).await? {
            Some(l) => Some(l),
            None => return Ok(()),
        },
        None => None,
    };
    let stop = CancellationToken::new();
    {
        let stop = stop.clone();
        let shutdown = shutdown.clone();
        let lost = leadership.as_ref().map(|l| l.lost.clone());
        tokio::spawn(async move {
            match lost {
                Some(lost) => tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = lost.cancelled() => {}
                },
                None => shutdown.cancelled().await,
            }
            stop.cancel();
        });
    }

    let ns = settings.namespace.clone();
    let require_nfd = settings.require_nfd;
    let policies: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    // Which initial lists have arrived. (Several tasks awaiting one `Store::wait_until_ready`
    // can miss the wake-up, so the streams report their first InitDone here instead.)
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(0u8);
    let (policy_store, policy_writer) = reflector::store();
    let policy_stream = watcher::watcher(policies, watcher::Config::default().any_semantic())
        .default_backoff()
        .inspect(mark_synced(&synced_tx, SYNCED_POLICIES))
        .reflect(policy_writer)
        .touched_objects();
    let controller = Controller::for_stream(policy_stream, policy_store.clone());

    let (node_store, node_writer) = reflector::store();
    let node_stream = watcher::watcher(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .inspect(mark_synced(&synced_tx, SYNCED_NODES))
    .reflect(node_writer)
    .touched_objects()
    .predicate_filter(
        predicates::labels.combine(predicates::annotations),
        PredicateConfig::default(),
    );
    let (pod_store, pod_writer) = reflector::store();
    let pod_stream = watcher::watcher(
        Api::<Pod>::namespaced(client.clone(), &ns),
        watcher::Config::default()
            .labels(&all_agent_pods_selector())
            .any_semantic(),
    )
    .default_backoff()
    .inspect(mark_synced(&synced_tx, SYNCED_PODS))
    .reflect(pod_writer)
    .touched_objects();

    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded();
    let ctx = Arc::new(Context::new(
        client.clone(),
        settings,
        policy_store.clone(),
        node_store.clone(),
        pod_store.clone(),
        EventPublisher::new(client.clone(), options.instance.clone()),
        metrics,
        wake_tx,
        synced_rx.clone(),
    ));

    {
        let mut synced = synced_rx.clone();
        let readiness = readiness.clone();
        tokio::spawn(async move {
            if synced.wait_for(|v| *v == SYNCED_ALL).await.is_ok() {
                info!("initial watches synced; ready");
                readiness.set(true);
            }
        });
    }

    let node_policies = policy_store.clone();
    let ds_config = watcher::Config::default().labels(&format!(
        "{}={}",
        labels::APP_NAME,
        labels::APP_NAME_AGENT
    ));
    let graceful = stop.clone();
    // Owned DaemonSets, mapped by label: `owns` would give the cluster-scoped policy the
    // DaemonSet's namespace.
    controller
        .watches(
            Api::<DaemonSet>::namespaced(client.clone(), &ns),
            ds_config,
            |ds| {
                ds.labels()
                    .get(labels::POLICY)
                    .map(|p| ObjectRef::<TenstorrentDriverPolicy>::new(p))
            },
        )
        .watches_stream(node_stream, move |node| {
            policies_for_node(&node_policies, &node, require_nfd)
        })
        .watches_stream(pod_stream, |pod| {
            pod.labels()
                .get(labels::POLICY)
                .map(|p| ObjectRef::<TenstorrentDriverPolicy>::new(p))
        })
        .reconcile_on(wake_rx)
        .graceful_shutdown_on(async move { graceful.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                warn!(error = %err, "controller event");
            }
        })
        .await;
    readiness.set(false);
    info!("controller stopped");
    if let Some(l) = leadership {
        l.stop();
    }
    if let Some((_, task)) = admin {
        shutdown.cancel();
        let _ = task.await;
    }
    Ok(())
}
