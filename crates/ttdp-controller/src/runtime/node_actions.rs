//! The writes the state machine's [`Action`](crate::pure::transition::Action)s stand for. Nodes and
//! pods are not ours, so each write is a minimal patch (or a delete), and each is idempotent.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::pure::cached::CachedPod;
use k8s_openapi::jiff::{self, Timestamp};
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

/// How many times a cordon or release re-reads the node after a write conflict.
const CONFLICT_RETRIES: usize = 5;

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

fn is_unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Cordons `node` for `policy` (someone else's cordon is left as it is, never claimed) and
/// closes the deploy gates (labels set to `"false"`, remembered in an annotation): one read and
/// one JSON merge patch carrying the node's `resourceVersion`, re-read and decided again on a
/// conflict. The cordon's ownership protocol is ttdp-drain's ([`ttdp_drain::cordon`]: the owner
/// and time annotations of [`cordon_owner`]); gates and cordon go in one write here.
pub async fn cordon_and_close_gates(
    client: &Client,
    policy: &str,
    node: &str,
    gates: &[String],
) -> Result<CordonOutcome, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let owner = cordon_owner(policy);
    let gates_value = gates.join(",");
    for _ in 0..CONFLICT_RETRIES {
        let current = api.get(node).await.map_err(|source| {
            drain_error(
                "cordon",
                node,
                ttdp_drain::DrainError::NodeRead {
                    node: node.to_owned(),
                    source,
                },
            )
        })?;
        let recorded = annotation(&current, &owner.owner_annotation);
        let outcome = match (
            is_unschedulable(&current),
            recorded == Some(owner.owner.as_str()),
        ) {
            (false, _) => CordonOutcome::Cordoned,
            (true, true) => CordonOutcome::AlreadyOwned,
            (true, false) => CordonOutcome::External {
                owner: recorded.map(str::to_owned),
            },
        };
        let gates_closed = gates.is_empty()
            || (gates
                .iter()
                .all(|g| label(&current, g) == Some(DEPLOY_GATE_CLOSED))
                && annotation(&current, annotations::DEPLOY_GATES) == Some(gates_value.as_str()));
        if outcome != CordonOutcome::Cordoned && gates_closed {
            return Ok(outcome);
        }
        let mut patch = json!({"metadata": {"resourceVersion": current.metadata.resource_version}});
        if outcome == CordonOutcome::Cordoned {
            let now = Timestamp::now()
                .round(jiff::Unit::Second)
                .unwrap_or_else(|_| Timestamp::now());
            patch["metadata"]["annotations"] = json!({
                owner.owner_annotation.as_str(): owner.owner,
                owner.time_annotation.as_str(): now.to_string(),
            });
            patch["spec"] = json!({"unschedulable": true});
        }
        if !gates.is_empty() {
            let labels: BTreeMap<&str, &str> = gates
                .iter()
                .map(|g| (g.as_str(), DEPLOY_GATE_CLOSED))
                .collect();
            patch["metadata"]["labels"] = json!(labels);
            patch["metadata"]["annotations"][annotations::DEPLOY_GATES] = json!(gates_value);
        }
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(
                    node,
                    policy,
                    ?outcome,
                    gates = gates.len(),
                    "node cordoned for upgrade"
                );
                return Ok(outcome);
            }
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(Error::kube(format!("cordon node {node}"), e)),
        }
    }
    Err(drain_error(
        "cordon",
        node,
        ttdp_drain::DrainError::NodeConflict {
            node: node.to_owned(),
            action: "cordon",
        },
    ))
}

/// Grants `node` the upgrade of `policy` to `version`: the annotation
/// [`annotations::UPGRADE_GRANT`] (`<policy>/<version>`), which the node's agent waits for before
/// it swaps a loaded module. One JSON merge patch; a node gone is nothing to grant.
pub async fn grant_upgrade(
    client: &Client,
    policy: &str,
    node: &str,
    version: &str,
) -> Result<(), Error> {
    let grant = names::upgrade_grant(policy, version);
    let patch = json!({"metadata": {"annotations": {annotations::UPGRADE_GRANT: grant}}});
    merge_patch_node(client, node, patch, "grant the upgrade").await?;
    info!(node, policy, version, "node granted its upgrade");
    Ok(())
}

/// Reopens the deploy gates the node's annotation lists (removing the labels and the
/// annotation), removes `policy`'s upgrade grant and lifts `policy`'s cordon (never someone
/// else's), in one JSON merge patch
/// carrying the node's `resourceVersion`, re-read and decided again on a conflict. The first
/// decision may come from `cached` (the controller's copy of the node, saving a read on the
/// hand-off from one node to the next): a patch from a stale copy fails its precondition and is
/// decided again from a fresh read, and a copy that shows nothing to do is confirmed by one, so
/// a stale cache never leaves a gate closed or a cordon in place.
pub async fn release(
    client: &Client,
    policy: &str,
    node: &str,
    cached: Option<Node>,
) -> Result<UncordonOutcome, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let owner = cordon_owner(policy);
    let mut first = cached;
    for _ in 0..CONFLICT_RETRIES {
        let from_cache = first.is_some();
        let current = match first.take() {
            Some(n) => n,
            None => match api.get_opt(node).await {
                Ok(Some(n)) => n,
                Ok(None) => return Ok(UncordonOutcome::NotCordoned),
                Err(e) => return Err(Error::kube(format!("get node {node}"), e)),
            },
        };
        let closed = crate::pure::observe::closed_gates(&current.metadata);
        let recorded = annotation(&current, &owner.owner_annotation);
        let ours = recorded == Some(owner.owner.as_str());
        let granted = crate::pure::observe::granted_by(&current.metadata, policy);
        let unschedulable = is_unschedulable(&current);
        let outcome = match (unschedulable, ours) {
            (true, true) => UncordonOutcome::Uncordoned,
            (true, false) => UncordonOutcome::External {
                owner: recorded.map(str::to_owned),
            },
            (false, _) => UncordonOutcome::NotCordoned,
        };
        if closed.is_empty() && !ours && !granted {
            if from_cache {
                continue;
            }
            return Ok(outcome);
        }
        let mut patch = json!({"metadata": {"resourceVersion": current.metadata.resource_version}});
        if !closed.is_empty() {
            let labels: BTreeMap<&str, Value> =
                closed.iter().map(|g| (g.as_str(), Value::Null)).collect();
            patch["metadata"]["labels"] = json!(labels);
            patch["metadata"]["annotations"] = json!({annotations::DEPLOY_GATES: null});
        }
        if granted {
            patch["metadata"]["annotations"][annotations::UPGRADE_GRANT] = Value::Null;
        }
        if ours {
            patch["metadata"]["annotations"][owner.owner_annotation.as_str()] = Value::Null;
            patch["metadata"]["annotations"][owner.time_annotation.as_str()] = Value::Null;
            if unschedulable {
                patch["spec"] = json!({"unschedulable": null});
            }
        }
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(node, policy, ?outcome, "node released");
                return Ok(outcome);
            }
            Err(e) if is_conflict(&e) => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(UncordonOutcome::NotCordoned),
            Err(e) => return Err(Error::kube(format!("release node {node}"), e)),
        }
    }
    Err(drain_error(
        "uncordon",
        node,
        ttdp_drain::DrainError::NodeConflict {
            node: node.to_owned(),
            action: "uncordon",
        },
    ))
}

/// Removes the retry annotation.
pub async fn clear_retry(client: &Client, node: &str) -> Result<(), Error> {
    let patch = json!({"metadata": {"annotations": {annotations::RETRY: null}}});
    merge_patch_node(client, node, patch, "clear retry annotation").await
}

/// Deletes an agent pod so the DaemonSet recreates it from the current template.
pub async fn delete_agent_pod(client: &Client, pod: &CachedPod) -> Result<(), Error> {
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
            info!(pod = %name, node = ?pod.node_name, "agent pod deleted for replacement");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete agent pod {ns}/{name}"), e)),
    }
}
