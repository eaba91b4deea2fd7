//! What the programs and the test harnesses create before the controller runs, as the Helm chart
//! and a user would: the CRD, the operator namespace with the agents' ServiceAccount, and the
//! policy. Forced server-side applies where an object may be there already (a shared cluster).

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use ttdp_api::TenstorrentDriverPolicy;

use crate::sim::eventually;

/// The field manager of the programs' applies.
const FIELD_MANAGER: &str = "ttdp-testkit";
/// The agents' ServiceAccount (the chart creates it; a real server refuses pods naming one that
/// does not exist).
const AGENT_SERVICE_ACCOUNT: &str = "ttdp-agent";

/// Applies the ttdp CRD and waits until it is served.
pub async fn install_crd(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = ttdp_api::crd();
    crds.patch(&crd.name_any(), &apply(), &Patch::Apply(&crd))
        .await
        .context("cannot apply the TenstorrentDriverPolicy CRD")?;
    let policies = &Api::<TenstorrentDriverPolicy>::all(client.clone());
    let served = move || async move { policies.list(&ListParams::default()).await.ok().map(drop) };
    let what = "the TenstorrentDriverPolicy CRD to be served";
    Ok(eventually(what, Duration::from_secs(60), served).await?)
}

/// Applies the operator namespace `namespace` and the agents' ServiceAccount in it.
pub async fn create_operator_namespace(client: &Client, namespace: &str) -> Result<()> {
    apply_namespace(client, namespace).await?;
    apply_service_account(client, namespace, AGENT_SERVICE_ACCOUNT).await
}

/// Applies the namespace `name`.
pub async fn apply_namespace(client: &Client, name: &str) -> Result<()> {
    let body = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name } });
    Api::<Namespace>::all(client.clone())
        .patch(name, &apply(), &Patch::Apply(body))
        .await
        .with_context(|| format!("cannot create namespace {name}"))?;
    Ok(())
}

/// Applies the ServiceAccount `name` in `namespace`.
pub async fn apply_service_account(client: &Client, namespace: &str, name: &str) -> Result<()> {
    let body = json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": { "name": name, "namespace": namespace },
    });
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .patch(name, &apply(), &Patch::Apply(body))
        .await
        .with_context(|| format!("cannot create serviceaccount {namespace}/{name}"))?;
    Ok(())
}

/// Creates a TenstorrentDriverPolicy with `metadata` (its name at least) and `spec`.
pub async fn create_policy(client: &Client, metadata: Value, spec: Value) -> Result<()> {
    let name = metadata["name"].as_str().unwrap_or_default().to_owned();
    let policy: TenstorrentDriverPolicy = serde_json::from_value(json!({
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": metadata,
        "spec": spec,
    }))
    .with_context(|| format!("policy {name} does not deserialize"))?;
    Api::<TenstorrentDriverPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .with_context(|| format!("cannot create TenstorrentDriverPolicy {name}"))?;
    Ok(())
}

/// Sets policy `name`'s `spec.version` (starts a rollout).
pub async fn set_policy_version(client: &Client, name: &str, version: &str) -> Result<()> {
    let patch = json!({ "spec": { "version": version } });
    Api::<TenstorrentDriverPolicy>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("cannot set TenstorrentDriverPolicy {name} to {version}"))?;
    Ok(())
}

fn apply() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}
