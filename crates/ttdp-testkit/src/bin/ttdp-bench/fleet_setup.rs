//! The simulated fleet's objects: the CRD, the operator namespace and the agents'
//! ServiceAccount, `n` Tenstorrent nodes already running tt-kmd `from` (labelled as an agent
//! would have) and `n` plain nodes, and the policy.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::{self, install_mode, labels};

/// The policy every fleet benchmark runs.
pub const POLICY: &str = "bench";
/// Concurrent creations while populating.
const CREATE_CONCURRENCY: usize = 16;
/// The agents' ServiceAccount (the controller's default `--agent-service-account`).
const AGENT_SERVICE_ACCOUNT: &str = "ttdp-agent";

/// Name of the `i`-th Tenstorrent node.
pub fn tenstorrent_node(i: usize) -> String {
    format!("tt-{i:05}")
}

/// Installs the CRD and waits until it is served; creates the operator namespace.
pub async fn install_crd_and_namespace(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &ttdp_api::crd())
        .await
        .context("cannot create the TenstorrentDriverPolicy CRD")?;
    let policies: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while policies
        .list(&ListParams::default().limit(1))
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            bail!("the TenstorrentDriverPolicy CRD was not served within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": names::DEFAULT_NAMESPACE },
    }))?;
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .with_context(|| format!("cannot create namespace {}", names::DEFAULT_NAMESPACE))?;
    // A real server refuses pods naming a ServiceAccount that does not exist.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), names::DEFAULT_NAMESPACE);
    let account: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": { "name": AGENT_SERVICE_ACCOUNT },
    }))?;
    accounts
        .create(&PostParams::default(), &account)
        .await
        .with_context(|| format!("cannot create serviceaccount {AGENT_SERVICE_ACCOUNT}"))?;
    Ok(())
}

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
    let bodies = (0..tenstorrent)
        .map(|i| {
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": tenstorrent_node(i), "labels": {
                    "kubernetes.io/hostname": tenstorrent_node(i),
                    labels::NFD_TENSTORRENT: labels::NFD_PRESENT,
                    labels::KMD_VERSION: version,
                    labels::INSTALL_MODE: install_mode::CONTAINER,
                }},
                "status": node_status(),
            })
        })
        .chain((0..plain).map(|i| {
            let name = format!("cpu-{i:05}");
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": name, "labels": { "kubernetes.io/hostname": name } },
                "status": node_status(),
            })
        }))
        .collect::<Vec<_>>();
    futures::stream::iter(bodies)
        .map(|body| {
            let nodes = nodes.clone();
            async move {
                let node: Node = serde_json::from_value(body)?;
                let name = node.metadata.name.clone().unwrap_or_default();
                nodes
                    .create(&PostParams::default(), &node)
                    .await
                    .with_context(|| format!("cannot create node {name}"))?;
                let patch = json!({ "spec": { "taints": null } });
                nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .with_context(|| format!("cannot lift the not-ready taint of {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// A Ready node's status, with the capacity a real scheduler needs to place a pod on it.
fn node_status() -> serde_json::Value {
    let capacity = json!({ "cpu": "8", "memory": "32Gi", "pods": "110" });
    json!({
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [{ "type": "Ready", "status": "True" }],
    })
}

/// Creates the policy at `version` with `maxUnavailable` (the finalizer already set, as the demo
/// does: the test server rejects kube-runtime's JSON-patch test on an absent field).
pub async fn create_policy(client: &Client, version: &str, max_unavailable: usize) -> Result<()> {
    let api: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    let policy: TenstorrentDriverPolicy = serde_json::from_value(json!({
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": { "name": POLICY, "finalizers": [names::FINALIZER] },
        "spec": {
            "version": version,
            "nodeAffinity": {},
            "upgradePolicy": { "maxUnavailable": max_unavailable },
        },
    }))
    .context("the benchmark's policy does not deserialize")?;
    api.create(&PostParams::default(), &policy)
        .await
        .with_context(|| format!("cannot create TenstorrentDriverPolicy {POLICY}"))?;
    Ok(())
}

/// Sets the policy's version (starts the rollout).
pub async fn set_version(client: &Client, version: &str) -> Result<()> {
    let api: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    api.patch(
        POLICY,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "version": version } })),
    )
    .await
    .with_context(|| format!("cannot set TenstorrentDriverPolicy {POLICY} to {version}"))?;
    Ok(())
}
