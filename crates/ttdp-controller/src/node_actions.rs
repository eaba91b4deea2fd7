//! The writes the state machine's [`Action`](crate::transition::Action)s stand for. Nodes and
//! pods are not ours, so each write is a minimal patch (or a delete), and each is idempotent.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tracing::info;
use ttdp_api::names::{self, DEPLOY_GATE_CLOSED, annotations};
use ttdp_drain::{CordonOutcome, CordonOwner, UncordonOutcome};

use crate::error::Error;

/// The cordon owner of `policy`, recorded in ttdp's annotations.
pub fn cordon_owner(policy: &str) -> CordonOwner {
    CordonOwner {
        owner: names::cordon_owner(policy),
        owner_annotation: annotations::CORDONED_BY.to_owned(),
        time_annotation: annotations::CORDONED_AT.to_owned(),
    }
}

fn drain_error(action: &str, node: &str, err: ttdp_drain::DrainError) -> Error {
    Error::NodeAction {
        action: format!("{action} node {node}"),
        source: Box::new(err),
    }
}

async fn merge_patch_node(
    client: &Client,
    node: &str,
    patch: Value,
    what: &str,
) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    match api
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("{what} on node {node}"), e)),
    }
}

/// Cordons `node` for `policy` (someone else's cordon is left as it is) and closes the deploy
/// gates (labels set to `"false"`, remembered in an annotation).
pub async fn cordon_and_close_gates(
    client: &Client,
    policy: &str,
    node: &str,
    gates: &[String],
) -> Result<CordonOutcome, Error> {
    let outcome = ttdp_drain::cordon(client, node, &cordon_owner(policy))
        .await
        .map_err(|e| drain_error("cordon", node, e))?;
    if !gates.is_empty() {
        let labels: BTreeMap<&str, &str> = gates
            .iter()
            .map(|g| (g.as_str(), DEPLOY_GATE_CLOSED))
            .collect();
        let patch = json!({"metadata": {
            "labels": labels,
            "annotations": {annotations::DEPLOY_GATES: gates.join(",")},
        }});
        merge_patch_node(client, node, patch, "close deploy gates").await?;
    }
    info!(
        node,
        policy,
        ?outcome,
        gates = gates.len(),
        "node cordoned for upgrade"
    );
    Ok(outcome)
}

/// Reopens the deploy gates the node's annotation lists (removing the labels and the
/// annotation), then lifts `policy`'s cordon (never someone else's). Reads the node first, so a
/// stale cache never leaves a gate closed.
pub async fn release(client: &Client, policy: &str, node: &str) -> Result<UncordonOutcome, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let current = match api.get_opt(node).await {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(UncordonOutcome::NotCordoned),
        Err(e) => return Err(Error::kube(format!("get node {node}"), e)),
    };
    let closed = crate::observe::closed_gates(&current.metadata);
    if !closed.is_empty() {
        let labels: BTreeMap<&str, Value> =
            closed.iter().map(|g| (g.as_str(), Value::Null)).collect();
        let patch = json!({"metadata": {
            "labels": labels,
            "annotations": {annotations::DEPLOY_GATES: null},
        }});
        merge_patch_node(client, node, patch, "reopen deploy gates").await?;
    }
    let outcome = match ttdp_drain::uncordon(client, node, &cordon_owner(policy)).await {
        Ok(o) => o,
        Err(ttdp_drain::DrainError::NodeRead {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 404 => UncordonOutcome::NotCordoned,
        Err(e) => return Err(drain_error("uncordon", node, e)),
    };
    info!(node, policy, ?outcome, "node released");
    Ok(outcome)
}

/// Removes the retry annotation.
pub async fn clear_retry(client: &Client, node: &str) -> Result<(), Error> {
    let patch = json!({"metadata": {"annotations": {annotations::RETRY: null}}});
    merge_patch_node(client, node, patch, "clear retry annotation").await
}

/// Deletes an agent pod so the DaemonSet recreates it from the current template.
pub async fn delete_agent_pod(client: &Client, pod: &Pod) -> Result<(), Error> {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let params = DeleteParams {
        preconditions: pod
            .metadata
            .uid
            .clone()
            .map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &params).await {
        Ok(_) => {
            info!(pod = %name, node = ?pod.spec.as_ref().and_then(|s| s.node_name.clone()), "agent pod deleted for replacement");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete agent pod {ns}/{name}"), e)),
    }
}
