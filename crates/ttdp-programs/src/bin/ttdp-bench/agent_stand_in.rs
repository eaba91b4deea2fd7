//! A cheap stand-in for thousands of `ttdp-agent` pods: one watch on the operator namespace's
//! pods. For each new agent pod bound to a node it does what the real agent does as seen from the
//! API: when the node does not report the pod's `TT_KMD_VERSION` yet, it "works" for a fixed
//! simulated time and then labels the node (`kmd-version`, `install-mode=container`); then it
//! marks the pod Ready. The pod keeps its DaemonSet template hash, which is what the controller
//! compares (see `crates/ttdp-controller/src/pure/observe.rs`).
//!
//! It also plays the kubelet's part in a pod's deletion: [`POD_TERMINATION`] after a pod is
//! marked for deletion it deletes it for good (grace period 0), as a kubelet does once the
//! containers have stopped.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;
use ttdp_api::names::{self, env, install_mode, labels};
use ttdp_testkit::sim::pod_is_ready;

/// How long a deleted agent pod takes to terminate.
pub const POD_TERMINATION: Duration = Duration::from_millis(200);

/// One agent finishing its work on a node: the version the node now reports, when the pod was
/// marked Ready, and whether it "worked" (the node reported another version).
#[derive(Debug, Clone)]
pub struct AgentReady {
    pub node: String,
    pub version: String,
    pub at: Instant,
    pub worked: bool,
}

/// The running stand-in; dropping it stops it.
#[derive(Debug)]
pub struct AgentStandIn {
    ready: Arc<Mutex<Vec<AgentReady>>>,
    /// When the watch saw each pod Ready (by node): how long the server takes to tell a
    /// watcher, the controller's pod watch included, of an agent's Ready.
    ready_seen: Arc<Mutex<Vec<(String, Instant)>>>,
    task: JoinHandle<()>,
}

impl Drop for AgentStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AgentStandIn {
    /// Starts watching; each swap takes `work`. Deleted pods are removed for good after
    /// [`POD_TERMINATION`] (a real server waits for a kubelet to do that).
    pub fn start(client: Client, work: Duration) -> Self {
        let ready = Arc::new(Mutex::new(Vec::new()));
        let ready_seen = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::clone(&ready);
        let seen_ready = Arc::clone(&ready_seen);
        let task = tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client.clone(), names::DEFAULT_NAMESPACE);
            let mut seen = HashSet::new();
            let mut terminating = HashSet::new();
            let mut ready_pods = HashSet::new();
            let mut stream = watcher(pods.clone(), watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(item) = stream.next().await {
                let Ok(pod) = item else { continue };
                if pod.metadata.deletion_timestamp.is_some() {
                    if let Some(uid) = pod.uid()
                        && terminating.insert(uid.clone())
                    {
                        tokio::spawn(finish_deletion(pods.clone(), pod.name_any(), uid));
                    }
                    continue;
                }
                // Once per pod, when it is bound and not Ready yet.
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                if pod_is_ready(&pod) {
                    // The first Ready of a pod this stand-in made Ready.
                    let uid = pod.uid().unwrap_or_default();
                    if let Some(node) = node
                        && seen.contains(&uid)
                        && ready_pods.insert(uid)
                    {
                        lock(&seen_ready).push((node, Instant::now()));
                    }
                    continue;
                }
                let Some(node) = node else {
                    continue;
                };
                if !pod.uid().is_some_and(|uid| seen.insert(uid)) {
                    continue;
                }
                let client = client.clone();
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    match act(&client, &pod, &node, work).await {
                        Ok(done) => lock(&shared).push(done),
                        Err(e) => {
                            tracing::warn!(pod = %pod.name_any(), error = %e, "agent stand-in failed")
                        }
                    }
                });
            }
        });
        Self {
            ready,
            ready_seen,
            task,
        }
    }

    /// When the watch first saw each node's agent Ready at or after `since`.
    pub fn ready_seen(&self, since: Instant) -> BTreeMap<String, Instant> {
        let mut first = BTreeMap::new();
        for (node, at) in lock(&self.ready_seen).iter().filter(|(_, at)| *at >= since) {
            first.entry(node.clone()).or_insert(*at);
        }
        first
    }

    /// Every agent that finished so far, oldest first.
    pub fn finished(&self) -> Vec<AgentReady> {
        lock(&self.ready).clone()
    }
}

/// What a kubelet does once a deleted pod's containers have stopped.
async fn finish_deletion(pods: Api<Pod>, name: String, uid: String) {
    tokio::time::sleep(POD_TERMINATION).await;
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    if let Err(e) = pods.delete(&name, &now).await
        && !matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
    {
        tracing::warn!(pod = %name, error = %e, "agent stand-in could not finish a deletion");
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn target_version(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == names::AGENT_CONTAINER)?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == env::TT_KMD_VERSION)?
        .value
        .clone()
}

async fn act(
    client: &Client,
    pod: &Pod,
    node: &str,
    work: Duration,
) -> Result<AgentReady, kube::Error> {
    let version = target_version(pod).unwrap_or_default();
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes.get(node).await?;
    let loaded = current.labels().get(labels::KMD_VERSION).cloned();
    let worked = loaded.as_deref() != Some(version.as_str());
    if worked {
        tokio::time::sleep(work).await;
        let patch = json!({ "metadata": { "labels": {
            labels::KMD_VERSION: version,
            labels::INSTALL_MODE: install_mode::CONTAINER,
        }}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), names::DEFAULT_NAMESPACE);
    let image = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let status = json!({ "status": {
        "phase": "Running",
        "conditions": [{ "type": "Ready", "status": "True" }],
        "containerStatuses": [{
            "name": names::AGENT_CONTAINER, "image": image, "imageID": "", "ready": true,
            "restartCount": 0, "started": true, "state": { "running": {} },
        }],
    }});
    pods.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&status),
    )
    .await?;
    Ok(AgentReady {
        node: node.to_owned(),
        version,
        at: Instant::now(),
        worked,
    })
}
