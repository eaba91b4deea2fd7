//! The rest of a control plane for workload pods, so that a separate test-server process can play
//! a whole cluster for the suites' real-cluster mode: a ReplicaSet controller (adopts matching
//! orphans, keeps `replicas` pods from the template, writes the replica counts) and a scheduler
//! (binds each unscheduled pod to the first Ready node, by name, it fits: node selector, required
//! node affinity, taints, `spec.unschedulable`).
//!
//! Simpler than Kubernetes on purpose: no Deployments, no scoring, no preemption, no resource
//! fitting, no back-off. It must not run against a real cluster, which has its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use ttdp_api::selector::Selector;

use super::background::BackgroundTask;
use super::error::SimError;
use super::node_fit::pod_fits_node;
use super::watched::{has_synced, next_batch, watched};

/// How long a created pod is counted as there before the caches show it.
const CREATION_EXPECTATION: Duration = Duration::from_secs(30);

/// A running ReplicaSet controller and scheduler. Stop it with
/// [`WorkloadControlPlane::shutdown`]; dropping it stops it too.
#[derive(Debug)]
pub struct WorkloadControlPlane(BackgroundTask);

impl WorkloadControlPlane {
    /// Starts both on `client`; they also reconcile every `resync` without events.
    pub fn start(client: Client, resync: Duration) -> Self {
        Self(BackgroundTask::spawn(|cancel| run(client, resync, cancel)))
    }

    /// Stops and waits for the loop to finish.
    pub async fn shutdown(self) {
        self.0.shutdown().await;
    }
}

struct Caches {
    sets: Store<ReplicaSet>,
    pods: Store<Pod>,
    nodes: Store<Node>,
}

async fn run(client: Client, resync: Duration, cancel: CancellationToken) {
    let (sets, set_events) = watched::<ReplicaSet>(&client);
    let (pods, pod_events) = watched::<Pod>(&client);
    let (nodes, node_events) = watched::<Node>(&client);
    let mut events = futures::stream::select_all([set_events, pod_events, node_events]);
    let caches = Caches { sets, pods, nodes };
    // Pods created per ReplicaSet uid that the caches have not shown yet.
    let mut created: HashMap<String, Vec<(String, Instant)>> = HashMap::new();
    info!("replicaset controller and scheduler stand-ins started");
    while next_batch(&mut events, &cancel, resync, Instant::now()).await {
        if !(has_synced(&caches.sets) && has_synced(&caches.pods) && has_synced(&caches.nodes)) {
            continue;
        }
        let pods = caches.pods.state();
        for rs in caches.sets.state() {
            if let Err(err) = reconcile_set(&client, &rs, &pods, &mut created).await {
                warn!(replicaset = %rs.name_any(), error = %err, "replicaset reconcile failed; retrying");
            }
        }
        if let Err(err) = schedule(&client, &pods, &caches.nodes.state()).await {
            warn!(error = %err, "scheduling failed; retrying");
        }
    }
    info!("replicaset controller and scheduler stand-ins stopped");
}

fn controller_uid(pod: &Pod) -> Option<&str> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

async fn reconcile_set(
    client: &Client,
    rs: &ReplicaSet,
    all_pods: &[Arc<Pod>],
    created: &mut HashMap<String, Vec<(String, Instant)>>,
) -> Result<(), SimError> {
    let (Some(uid), Some(spec)) = (rs.uid(), rs.spec.as_ref()) else {
        return Ok(());
    };
    if rs.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let namespace = rs.namespace().unwrap_or_default();
    let name = rs.name_any();
    let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let selector =
        Selector::from_label_selector(&spec.selector).map_err(|e| SimError::Malformed {
            object: format!("ReplicaSet {namespace}/{name}"),
            message: format!("its selector: {e}"),
        })?;
    let owner = OwnerReference {
        api_version: "apps/v1".to_owned(),
        kind: "ReplicaSet".to_owned(),
        name: name.clone(),
        uid: uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let live: Vec<&Arc<Pod>> = all_pods
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let mut owned: Vec<&Arc<Pod>> = Vec::new();
    for pod in live {
        match controller_uid(pod) {
            Some(c) if c == uid => owned.push(pod),
            None if !selector.is_empty() && selector.matches(pod.labels()) => {
                // Adopt the orphan, as the real controller does.
                let patch = json!({"metadata": {"ownerReferences": [owner]}});
                api.patch(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|e| SimError::api(format!("adopt pod {}", pod.name_any()), e))?;
                owned.push(pod);
            }
            _ => {}
        }
    }
    let pending = created.entry(uid.clone()).or_default();
    pending.retain(|(pod_uid, at)| {
        at.elapsed() < CREATION_EXPECTATION
            && !all_pods.iter().any(|p| p.uid().as_deref() == Some(pod_uid))
    });
    let want = i64::from(spec.replicas.unwrap_or(1));
    let have = (owned.len() + pending.len()) as i64;
    let template = spec.template.clone().unwrap_or_default();
    for _ in have..want {
        let mut meta = template.metadata.clone().unwrap_or_default();
        meta.generate_name = Some(format!("{name}-"));
        meta.owner_references = Some(vec![owner.clone()]);
        let pod = Pod {
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                ..meta
            },
            spec: template.spec.clone(),
            status: None,
        };
        let made = api
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| SimError::api(format!("create a pod of replicaset {name}"), e))?;
        info!(replicaset = %name, pod = %made.name_any(), "replica created");
        pending.push((made.uid().unwrap_or_default(), Instant::now()));
    }
    for extra in owned.iter().skip(usize::try_from(want).unwrap_or(0)) {
        match api
            .delete(&extra.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => info!(replicaset = %name, pod = %extra.name_any(), "replica deleted"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(SimError::api(format!("delete pod {}", extra.name_any()), e)),
        }
    }
    let ready = owned
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count() as i32;
    let status = json!({"status": {
        "replicas": owned.len(),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": rs.metadata.generation,
    }});
    let current = rs.status.as_ref();
    let unchanged = current.is_some_and(|s| {
        s.replicas as usize == owned.len()
            && s.ready_replicas.unwrap_or(0) == ready
            && s.observed_generation == rs.metadata.generation
    });
    if !unchanged {
        Api::<ReplicaSet>::namespaced(client.clone(), &namespace)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|e| SimError::api(format!("write the status of replicaset {name}"), e))?;
    }
    Ok(())
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn schedule(client: &Client, pods: &[Arc<Pod>], nodes: &[Arc<Node>]) -> Result<(), SimError> {
    let mut nodes: Vec<&Arc<Node>> = nodes.iter().filter(|n| is_ready(n)).collect();
    nodes.sort_by_key(|n| n.name_any());
    for pod in pods {
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        let ours = spec
            .scheduler_name
            .as_deref()
            .is_none_or(|s| s == "default-scheduler");
        if spec.node_name.is_some() || pod.metadata.deletion_timestamp.is_some() || !ours {
            continue;
        }
        let Some(node) = nodes.iter().find(|n| pod_fits_node(spec, n).can_schedule) else {
            continue;
        };
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(pod.name_any()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(node.name_any()),
                ..ObjectReference::default()
            },
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        match api
            .create_subresource::<Binding, serde_json::Value>(
                "binding",
                &pod.name_any(),
                &PostParams::default(),
                &binding,
            )
            .await
        {
            Ok(_) => info!(pod = %pod.name_any(), node = %node.name_any(), "pod bound"),
            // Bound meanwhile, or gone: the next pass sees it.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => return Err(SimError::api(format!("bind pod {}", pod.name_any()), e)),
        }
    }
    Ok(())
}
