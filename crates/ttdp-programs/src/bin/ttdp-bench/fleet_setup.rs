//! The simulated fleet's objects: `n` Tenstorrent nodes already running tt-kmd `from`
//! (labelled as an agent would have) and `n` plain nodes, and the policy.

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use ttdp_api::names::{self, install_mode, labels};
use ttdp_testkit::cluster_setup;

/// The policy every fleet benchmark runs.
pub const POLICY: &str = "bench";
/// Concurrent creations while populating.
const CREATE_CONCURRENCY: usize = 16;

/// Creates `tenstorrent` nodes with tt-kmd `version` loaded and `plain` nodes without devices,
/// Ready. The API server's admission taints a new node `node.kubernetes.io/not-ready` until the
/// node lifecycle controller sees it Ready; that taint is lifted here at once, as the
/// controller would, so that the fleet is settled before the policy is created.
pub async fn create_nodes(
    client: &Client,
    tenstorrent: usize,
    plain: usize,
    version: &str,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let driver = [
        (labels::NFD_TENSTORRENT, labels::NFD_PRESENT),
        (labels::KMD_VERSION, version),
        (labels::INSTALL_MODE, install_mode::CONTAINER),
    ];
    let tenstorrent = (0..tenstorrent).map(|i| (format!("tt-{i:05}"), &driver[..]));
    let plain = (0..plain).map(|i| (format!("cpu-{i:05}"), &[][..]));
    futures::stream::iter(tenstorrent.chain(plain))
        .map(|(name, driver)| create_node(&nodes, name, driver))
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect()
        .await
}

/// Creates a Ready node, with the capacity a real scheduler needs to place a pod on it, and
/// lifts its not-ready taint.
async fn create_node(nodes: &Api<Node>, name: String, driver: &[(&str, &str)]) -> Result<()> {
    let mut labels =
        serde_json::Map::from_iter(driver.iter().map(|(k, v)| (k.to_string(), json!(v))));
    labels.insert("kubernetes.io/hostname".to_owned(), json!(name));
    let capacity = json!({ "cpu": "8", "memory": "32Gi", "pods": "110" });
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "labels": labels },
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{ "type": "Ready", "status": "True" }],
        },
    }))?;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("cannot create node {name}"))?;
    let patch = json!({ "spec": { "taints": null } });
    nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("cannot lift the not-ready taint of {name}"))?;
    Ok(())
}

/// Creates the policy at `version` with `maxUnavailable`, its finalizer already set (the
/// controller adds none while it is measured).
pub async fn create_policy(client: &Client, version: &str, max_unavailable: usize) -> Result<()> {
    let metadata = json!({ "name": POLICY, "finalizers": [names::FINALIZER] });
    let spec = json!({
        "version": version,
        "nodeAffinity": {},
        "upgradePolicy": { "maxUnavailable": max_unavailable },
    });
    cluster_setup::create_policy(client, metadata, spec).await
}
