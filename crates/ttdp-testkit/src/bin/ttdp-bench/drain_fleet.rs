//! The objects of the drain benchmark: a node with `n` pods of mixed controllers (ReplicaSets,
//! pods with emptyDir, a DaemonSet's pods, bare pods) and a PodDisruptionBudget over some of them;
//! and a node whose only pod a budget blocks.

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Namespace of the drained workloads.
pub const NAMESPACE: &str = "default";
/// Concurrent creations.
const CONCURRENCY: usize = 16;

/// What kind of pod the `i`-th of `n` is: 60 % ReplicaSet, 20 % ReplicaSet with emptyDir, 10 %
/// DaemonSet, 10 % bare (no controller).
fn kind_of(i: usize) -> &'static str {
    match i % 10 {
        0..=5 => "replicaset",
        6 | 7 => "emptydir",
        8 => "daemonset",
        _ => "bare",
    }
}

async fn create<K>(api: &Api<K>, body: Value) -> Result<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body)?;
    api.create(&PostParams::default(), &object)
        .await
        .context("cannot create a drain benchmark object")
}

fn owner(kind: &str, name: &str, uid: &str) -> Value {
    json!([{ "apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": true }])
}

/// Creates node `node` with `pods` pods on it and a budget (`minAvailable: 0`, so it is checked
/// on every eviction but never blocks) over its ReplicaSet pods.
pub async fn populate(client: &Client, node: &str, pods: usize) -> Result<()> {
    create(
        &Api::<Node>::all(client.clone()),
        json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": node } }),
    )
    .await?;
    let template = |app: &str| json!({ "metadata": { "labels": { "app": app } }, "spec": { "containers": [{ "name": "c", "image": "busybox" }] } });
    let rs_name = format!("{node}-web");
    let rs = create(&Api::<ReplicaSet>::namespaced(client.clone(), NAMESPACE), json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": { "name": rs_name, "namespace": NAMESPACE },
        "spec": { "replicas": pods, "selector": { "matchLabels": { "app": rs_name } }, "template": template(&rs_name) },
    })).await?;
    let ds_name = format!("{node}-logs");
    let ds = create(&Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE), json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": { "name": ds_name, "namespace": NAMESPACE },
        "spec": { "selector": { "matchLabels": { "app": ds_name } }, "template": template(&ds_name) },
    })).await?;
    create(&Api::<PodDisruptionBudget>::namespaced(client.clone(), NAMESPACE), json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": { "name": rs_name, "namespace": NAMESPACE },
        "spec": { "minAvailable": 0, "selector": { "matchLabels": { "app": rs_name } } },
    })).await?;
    let rs_uid = rs.metadata.uid.unwrap_or_default();
    let ds_uid = ds.metadata.uid.unwrap_or_default();
    let bodies: Vec<Value> = (0..pods)
        .map(|i| {
            let name = format!("{node}-p{i:04}");
            let (labels, owners, volumes) = match kind_of(i) {
                "replicaset" => (json!({ "app": rs_name }), owner("ReplicaSet", &rs_name, &rs_uid), json!([])),
                "emptydir" => (json!({ "app": rs_name }), owner("ReplicaSet", &rs_name, &rs_uid), json!([{ "name": "scratch", "emptyDir": {} }])),
                "daemonset" => (json!({ "app": ds_name }), owner("DaemonSet", &ds_name, &ds_uid), json!([])),
                _ => (json!({ "app": "bare" }), json!([]), json!([])),
            };
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": name, "namespace": NAMESPACE, "labels": labels, "ownerReferences": owners },
                "spec": { "nodeName": node, "volumes": volumes, "containers": [{ "name": "main", "image": "busybox" }] },
            })
        })
        .collect();
    create_running_pods(client, bodies).await
}

/// Creates node `node` with one pod that budget `minAvailable: 1` protects: every eviction is
/// refused (429).
pub async fn populate_blocked(client: &Client, node: &str) -> Result<()> {
    create(
        &Api::<Node>::all(client.clone()),
        json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": node } }),
    )
    .await?;
    let app = format!("{node}-db");
    let rs = create(&Api::<ReplicaSet>::namespaced(client.clone(), NAMESPACE), json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": { "name": app, "namespace": NAMESPACE },
        "spec": { "replicas": 1, "selector": { "matchLabels": { "app": app } },
            "template": { "metadata": { "labels": { "app": app } }, "spec": { "containers": [{ "name": "c", "image": "busybox" }] } } },
    })).await?;
    create(&Api::<PodDisruptionBudget>::namespaced(client.clone(), NAMESPACE), json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": { "name": app, "namespace": NAMESPACE },
        "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": app } } },
    })).await?;
    let body = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": format!("{app}-0"), "namespace": NAMESPACE, "labels": { "app": app },
            "ownerReferences": owner("ReplicaSet", &app, &rs.metadata.uid.unwrap_or_default()) },
        "spec": { "nodeName": node, "containers": [{ "name": "main", "image": "busybox" }] },
    });
    create_running_pods(client, vec![body]).await
}

async fn create_running_pods(client: &Client, bodies: Vec<Value>) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let status = json!({ "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] } });
    futures::stream::iter(bodies)
        .map(|body| {
            let pods = pods.clone();
            let status = status.clone();
            async move {
                let pod: Pod = create(&pods, body).await?;
                let name = pod.metadata.name.unwrap_or_default();
                pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("cannot mark pod {name} running"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Pods still on `node` (any phase, terminating included).
pub async fn pods_left(client: &Client, node: &str) -> Result<usize> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .with_context(|| format!("cannot list the pods on {node}"))?;
    Ok(list.items.len())
}
