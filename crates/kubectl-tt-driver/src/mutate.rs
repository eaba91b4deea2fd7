//! The only writes the plugin makes, each behind its own explicit subcommand:
//! `pause` / `resume` (a merge patch of `spec.paused`), `retry` (an annotation on the Node) and
//! `skip` (the skip label on the Node).
//!
//! `retry` sets `driver.tenstorrent.com/retry=<now, RFC 3339>` on the Node. The controller
//! watches Nodes; when a node that is Failed in a policy carries the annotation, it retries the
//! upgrade at once instead of waiting for its back-off, and removes the annotation.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use ttdp_api::names::{annotations, labels};
use ttdp_api::{NodeState, TenstorrentDriverPolicy};

use crate::connection::Connection;
use crate::error::{Error, is_not_found};
use crate::fetch::POLICY_RESOURCE;
use crate::fleet::listed_nodes;

/// The field manager of the plugin's patches.
pub const FIELD_MANAGER: &str = "kubectl-tt-driver";

/// Sets `spec.paused` of a policy; returns the line to print, kubectl-style.
pub async fn set_paused(conn: &Connection, name: &str, paused: bool) -> Result<String, Error> {
    let policy = conn.policy(name).await?;
    let verb = if paused { "paused" } else { "resumed" };
    if policy.spec.paused == paused {
        let already = if paused { "paused" } else { "not paused" };
        return Ok(format!(
            "tenstorrentdriverpolicy.driver.tenstorrent.com/{name} is already {already} (no change)"
        ));
    }
    let api: Api<TenstorrentDriverPolicy> = Api::all(conn.client.clone());
    let patch = json!({ "spec": { "paused": paused } });
    api.patch(
        name,
        &PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        },
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| match e {
        e if is_not_found(&e) => Error::PolicyNotFound {
            name: name.to_owned(),
        },
        e => Error::from_kube(e, "patch", POLICY_RESOURCE, &conn.server),
    })?;
    Ok(format!(
        "tenstorrentdriverpolicy.driver.tenstorrent.com/{name} {verb}"
    ))
}

/// Asks the controller to retry `node` of `policy` now; returns the line to print.
pub async fn retry(
    conn: &Connection,
    policy_name: &str,
    node: &str,
    now: Timestamp,
) -> Result<String, Error> {
    let policy = conn.policy(policy_name).await?;
    let status = listed_nodes(&policy)
        .iter()
        .find(|n| n.name == node)
        .ok_or_else(|| Error::NodeNotInPolicy {
            policy: policy_name.to_owned(),
            node: node.to_owned(),
        })?;
    let halted_by_it = policy
        .status
        .as_ref()
        .and_then(|s| s.rollout.as_ref())
        .and_then(|r| r.halted_by.as_deref())
        .is_some_and(|h| h.starts_with(&format!("canary node {node} ")));
    if status.state != NodeState::Failed && !halted_by_it {
        return Err(Error::NotFailed {
            policy: policy_name.to_owned(),
            node: node.to_owned(),
            state: status.state.to_string(),
        });
    }
    let stamp = now.to_string();
    let patch = json!({ "metadata": { "annotations": { annotations::RETRY: stamp } } });
    patch_node(conn, node, &patch).await?;
    Ok(format!(
        "node/{node} annotated {}={stamp}: the controller retries the failed upgrade of policy {policy_name} on {node} now and then removes the annotation",
        annotations::RETRY
    ))
}

/// Sets (`on`) or removes the skip label of `node`; returns the line to print.
pub async fn skip(conn: &Connection, node: &str, on: bool) -> Result<String, Error> {
    let value = if on { json!("true") } else { json!(null) };
    let patch = json!({ "metadata": { "labels": { labels::SKIP: value } } });
    patch_node(conn, node, &patch).await?;
    Ok(if on {
        format!(
            "node/{node} labelled {}=true: no policy manages it now; its cordon and deploy gates are released and its driver stays loaded (undo: kubectl tt driver skip {node} --undo)",
            labels::SKIP
        )
    } else {
        format!(
            "node/{node} unlabelled {}: policies that select it manage it again",
            labels::SKIP
        )
    })
}

/// Merge-patches `node` as the plugin's field manager; a missing node is `NodeNotFound`.
async fn patch_node(conn: &Connection, node: &str, patch: &serde_json::Value) -> Result<(), Error> {
    let api: Api<Node> = Api::all(conn.client.clone());
    api.patch(
        node,
        &PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        },
        &Patch::Merge(patch),
    )
    .await
    .map_err(|e| match e {
        e if is_not_found(&e) => Error::NodeNotFound {
            name: node.to_owned(),
        },
        e => Error::from_kube(e, "patch", "nodes", &conn.server),
    })?;
    Ok(())
}
