//! The DaemonSet controller and scheduler stand-in of the demo's imitation API server: a kube-rs
//! client that watches DaemonSets, pods and nodes, keeps one bound pod per eligible node (a pod of
//! an older template stays until deleted, as `OnDelete` asks), and writes the DaemonSet status.
//!
//! The decisions are made by [`plan_daemonset`]; this file
//! only watches and writes. Like the real controller it remembers the creations and deletions it
//! sent until its watches show them ("expectations"), so a slow watch never doubles a pod: a
//! creation the watch still has not delivered after `EXPECTATION_TIMEOUT` (30 s) is looked up on
//! the server, and only forgotten when the pod is really not there. A pod the watch delivered
//! counts even if it was deleted before the next pass, as in the real controller, which lowers
//! its expectations in the watch's event handlers. It must not run against a real cluster,
//! which has its own DaemonSet controller.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::background::BackgroundTask;
use super::daemonset_plan::{DaemonSetView, plan_daemonset};
use super::daemonset_pod::render_daemon_pod;
use super::error::{SimError, is_not_found};
use super::watched::{has_synced, next_batch, watched, watched_observing};

/// How long a sent creation or deletion is waited for in the caches before it is checked on the
/// server (a creation) or assumed done (a deletion: deleting again is harmless).
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(30);

/// A running DaemonSet controller stand-in. Stop it with [`DaemonSetController::shutdown`];
/// dropping it stops it too.
#[derive(Debug)]
pub struct DaemonSetController(BackgroundTask);

impl DaemonSetController {
    /// Starts the controller on `client`; it also reconciles every `resync` without events.
    pub fn start(client: Client, resync: Duration) -> Self {
        Self(BackgroundTask::spawn(|cancel| run(client, resync, cancel)))
    }

    /// Stops the controller and waits for it to finish.
    pub async fn shutdown(self) {
        self.0.shutdown().await;
    }
}

struct Caches {
    daemonsets: Store<DaemonSet>,
    pods: Store<Pod>,
    nodes: Store<Node>,
}

/// A pod creation the caches have not shown yet.
struct SentCreation {
    pod: String,
    uid: String,
    at: Instant,
}

#[derive(Default)]
struct Expectations {
    /// (DaemonSet uid, node) -> the pod created there.
    creating: HashMap<(String, String), SentCreation>,
    /// Pod uid -> when the deletion was sent.
    deleting: HashMap<String, Instant>,
}

async fn run(client: Client, resync: Duration, cancel: CancellationToken) {
    let (daemonsets, ds_events) = watched::<DaemonSet>(&client);
    // The uids of the pods the watch delivered since the last pass.
    let delivered: Arc<Mutex<HashSet<String>>> = Arc::default();
    let (pods, pod_events) = watched_observing::<Pod>(&client, {
        let delivered = Arc::clone(&delivered);
        move |pod| {
            if let Some(uid) = pod.uid() {
                lock(&delivered).insert(uid);
            }
        }
    });
    let (nodes, node_events) = watched::<Node>(&client);
    let mut events = futures::stream::select_all([ds_events, pod_events, node_events]);
    let caches = Caches {
        daemonsets,
        pods,
        nodes,
    };
    let mut expectations = Expectations::default();
    // After a failed reconcile (an API error), try again soon instead of at the next resync,
    // as the real controller requeues with back-off.
    let mut wait = resync;
    info!("daemonset controller stand-in started");
    // The next pass starts no sooner than the last one took (at most MAX_PAUSE: a pass that
    // waited on a busy server must not delay the next one as long), which gathers the events
    // meanwhile into one pass and leaves the API server, in the same process, at least half the
    // time.
    let mut not_before = Instant::now();
    while next_batch(&mut events, &cancel, wait, not_before).await {
        let ready =
            has_synced(&caches.daemonsets) && has_synced(&caches.pods) && has_synced(&caches.nodes);
        let started = Instant::now();
        // A creation is seen once the watch delivered the pod, even if it is gone by now.
        let delivered = std::mem::take(&mut *lock(&delivered));
        expectations
            .creating
            .retain(|_, sent| !delivered.contains(&sent.uid));
        wait = if ready && reconcile_all(&client, &caches, &mut expectations).await {
            resync
        } else {
            RETRY_AFTER_ERROR.min(resync)
        };
        not_before = Instant::now() + started.elapsed().min(MAX_PAUSE);
    }
    info!("daemonset controller stand-in stopped");
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The longest pause between two passes.
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// How soon a failed reconcile is retried.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(500);

/// Reconciles every DaemonSet; false when any reconcile failed.
async fn reconcile_all(client: &Client, caches: &Caches, expectations: &mut Expectations) -> bool {
    let now = Instant::now();
    expectations
        .deleting
        .retain(|_, sent| now.duration_since(*sent) < EXPECTATION_TIMEOUT);
    let nodes = caches.nodes.state();
    let all_pods = caches.pods.state();
    let seen = SeenPods::index(&all_pods);
    // A deletion is seen once the pod is gone or terminating.
    expectations
        .deleting
        .retain(|uid, _| seen.live.contains(uid.as_str()));
    let mut ok = true;
    for ds in caches.daemonsets.state() {
        if ds.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Err(err) = reconcile(client, &ds, &nodes, &all_pods, &seen, expectations).await {
            warn!(daemonset = %ds.name_any(), error = %err, "daemonset reconcile failed; retrying");
            ok = false;
        }
    }
    ok
}

/// What the pod cache shows, indexed once per pass (thousands of pods, hundreds of expectations).
struct SeenPods<'a> {
    /// Every cached pod's uid.
    all: HashSet<&'a str>,
    /// The uids of pods not being deleted.
    live: HashSet<&'a str>,
    /// (controller uid, node) of every pod not being deleted.
    live_on: HashSet<(&'a str, &'a str)>,
}

impl<'a> SeenPods<'a> {
    fn index(pods: &'a [Arc<Pod>]) -> Self {
        let mut seen = SeenPods {
            all: HashSet::new(),
            live: HashSet::new(),
            live_on: HashSet::new(),
        };
        for pod in pods {
            let Some(uid) = pod.metadata.uid.as_deref() else {
                continue;
            };
            seen.all.insert(uid);
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            seen.live.insert(uid);
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            let owner = pod
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true));
            if let (Some(node), Some(owner)) = (node, owner) {
                seen.live_on.insert((owner.uid.as_str(), node));
            }
        }
        seen
    }
}

async fn reconcile(
    client: &Client,
    ds: &DaemonSet,
    nodes: &[Arc<Node>],
    all_pods: &[Arc<Pod>],
    seen: &SeenPods<'_>,
    expectations: &mut Expectations,
) -> Result<(), SimError> {
    let Some(uid) = ds.uid() else {
        return Ok(());
    };
    let namespace = ds.namespace().unwrap_or_default();
    let pods: Vec<Arc<Pod>> = all_pods
        .iter()
        .filter(|p| controlled_by(p, &uid))
        .cloned()
        .collect();
    // A creation is seen once the caches have the pod, or a live pod of this DaemonSet is on
    // the node.
    expectations.creating.retain(|(ds_uid, node), sent| {
        ds_uid != &uid
            || !(seen.all.contains(sent.uid.as_str())
                || seen.live_on.contains(&(uid.as_str(), node.as_str())))
    });
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    confirm_overdue_creations(&pod_api, &uid, &mut expectations.creating).await?;
    let creating_on: HashSet<String> = expectations
        .creating
        .keys()
        .filter(|(ds_uid, _)| ds_uid == &uid)
        .map(|(_, node)| node.clone())
        .collect();
    let deleting: HashSet<String> = expectations.deleting.keys().cloned().collect();
    let plan = plan_daemonset(DaemonSetView {
        ds,
        nodes,
        pods: &pods,
        creating_on: &creating_on,
        deleting: &deleting,
    })?;

    for node in &plan.create_on {
        let pod = render_daemon_pod(ds, node, &plan.revision_hash)?;
        let created = pod_api
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| {
                SimError::api(
                    format!(
                        "create the pod of daemonset {namespace}/{} on node {node}",
                        ds.name_any()
                    ),
                    e,
                )
            })?;
        info!(daemonset = %ds.name_any(), node = %node, pod = %created.name_any(), "daemon pod created");
        expectations.creating.insert(
            (uid.clone(), node.clone()),
            SentCreation {
                pod: created.name_any(),
                uid: created.uid().unwrap_or_default(),
                at: Instant::now(),
            },
        );
    }
    for doomed in &plan.delete {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(doomed.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match pod_api.delete(&doomed.name, &params).await {
            Ok(_) => {
                info!(daemonset = %ds.name_any(), pod = %doomed.name, reason = doomed.reason, "daemon pod deleted");
                expectations
                    .deleting
                    .insert(doomed.uid.clone(), Instant::now());
            }
            Err(err) if is_not_found(&err) => {}
            Err(err) => {
                return Err(SimError::api(
                    format!("delete daemon pod {namespace}/{}", doomed.name),
                    err,
                ));
            }
        }
    }
    write_status(client, ds, plan.status).await
}

/// For creations the caches have missed for [`EXPECTATION_TIMEOUT`], ask the server: a pod that
/// exists means the watch is behind (keep waiting, do not create a second one); a pod that does
/// not means it is gone and may be created again.
async fn confirm_overdue_creations(
    pod_api: &Api<Pod>,
    ds_uid: &str,
    creating: &mut HashMap<(String, String), SentCreation>,
) -> Result<(), SimError> {
    let now = Instant::now();
    let mut gone = Vec::new();
    for (key, sent) in creating.iter_mut() {
        if key.0 != ds_uid || now.duration_since(sent.at) < EXPECTATION_TIMEOUT {
            continue;
        }
        let found = pod_api
            .get_opt(&sent.pod)
            .await
            .map_err(|e| SimError::api(format!("look up the daemon pod {}", sent.pod), e))?;
        if found.is_some_and(|p| p.uid().as_deref() == Some(sent.uid.as_str())) {
            debug!(pod = %sent.pod, "daemon pod exists but is not in the cache yet; waiting");
            sent.at = now;
        } else {
            gone.push(key.clone());
        }
    }
    for key in gone {
        creating.remove(&key);
    }
    Ok(())
}

fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

async fn write_status(
    client: &Client,
    ds: &DaemonSet,
    computed: DaemonSetStatus,
) -> Result<(), SimError> {
    let current = ds.status.clone().unwrap_or_default();
    let wanted = DaemonSetStatus {
        collision_count: current.collision_count,
        conditions: current.conditions.clone(),
        ..computed
    };
    if wanted == current {
        return Ok(());
    }
    let namespace = ds.namespace().unwrap_or_default();
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), &namespace);
    let patch = serde_json::json!({ "status": wanted });
    match api
        .patch_status(
            &ds.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if is_not_found(&err) => Ok(()),
        Err(err) => Err(SimError::api(
            format!(
                "write the status of daemonset {namespace}/{}",
                ds.name_any()
            ),
            err,
        )),
    }
}
