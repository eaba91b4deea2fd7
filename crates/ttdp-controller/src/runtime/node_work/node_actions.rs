//! The writes the state machine's `Action`s stand for. Nodes and
//! pods are not ours, so each write is a minimal patch (or a delete), and each is idempotent.
//! Cordon and release are ttdp-drain's cordon with ownership, the deploy gates and the upgrade
//! grant riding along in the same patch as its extras.

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::pure::cached::CachedPod;
use crate::pure::{node_record, observe};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tracing::info;
use ttdp_api::names::{self, DEPLOY_GATE_CLOSED, annotations, labels};
use ttdp_api::node_record::NodeRecord;
use ttdp_drain::{CordonOutcome, CordonOwner, DrainError, NodePatchExtras, UncordonOutcome};

use crate::error::Error;

/// The cordon owner of `policy`, recorded in ttdp's annotations.
pub fn cordon_owner(policy: &str) -> CordonOwner {
    CordonOwner {
        owner: names::cordon_owner(policy),
        owner_annotation: annotations::CORDONED_BY.to_owned(),
        time_annotation: annotations::CORDONED_AT.to_owned(),
    }
}

fn drain_error(action: &str, node: &str, err: DrainError) -> Error {
    Error::NodeAction {
        action: format!("{action} node {node}"),
        source: Box::new(err),
    }
}

pub(crate) async fn merge_patch_node(
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

/// The extras of a cordon for `policy`'s upgrade: each deploy gate closed (its label set to
/// [`DEPLOY_GATE_CLOSED`]) and the policy with the list of closed gates remembered in
/// [`annotations::DEPLOY_GATES`], so [`release`] knows what to reopen and another policy's
/// release reopens none of them. Nothing without gates.
fn closing_gates(policy: &str, gates: &[String]) -> NodePatchExtras {
    if gates.is_empty() {
        return NodePatchExtras::new();
    }
    gates
        .iter()
        .fold(NodePatchExtras::new(), |extras, gate| {
            extras.set_label(gate, DEPLOY_GATE_CLOSED)
        })
        .set_annotation(
            annotations::DEPLOY_GATES,
            names::deploy_gates(policy, gates),
        )
}

/// The extras of a release of `node` by `policy`: the deploy gates it closed reopened (labels and
/// annotation removed; gates another policy closed stay) and its upgrade grant removed (another
/// policy's stays).
fn reopening_gates(node: &Node, policy: &str, forget: bool) -> NodePatchExtras {
    let closed = observe::closed_gates(&node.metadata, policy);
    let mut extras = NodePatchExtras::new();
    if !closed.is_empty() {
        extras = closed
            .into_iter()
            .fold(extras, NodePatchExtras::remove_label)
            .remove_annotation(annotations::DEPLOY_GATES);
    }
    if observe::granted_by(&node.metadata, policy) {
        extras = extras.remove_annotation(annotations::UPGRADE_GRANT);
    }
    if forget && node_record::current(&node.metadata, policy).is_some() {
        extras = extras
            .remove_annotation(annotations::UPGRADE_RECORD)
            .remove_label(labels::UPGRADE_STATE);
    }
    extras
}

/// Cordons `node` for `policy` (someone else's cordon is left as it is, never claimed) and
/// closes the deploy gates (labels set to `"false"`, remembered in an annotation) in the same
/// write: [`ttdp_drain::cordon_with`] with the owner of [`cordon_owner`] and the gates as its
/// extras, so the ownership protocol, the `resourceVersion` precondition and the re-decision
/// after a conflict are ttdp-drain's. The gates are closed beside someone else's cordon too.
/// The first decision may come from `cached` (the controller's copy of the node), saving a read
/// on the hand-off; ttdp-drain decides again from a fresh read whenever the copy was stale.
pub async fn cordon_and_close_gates(
    client: &Client,
    policy: &str,
    node: &str,
    gates: &[String],
    record: Option<&NodeRecord>,
    cached: Option<Node>,
) -> Result<CordonOutcome, Error> {
    ttdp_drain::cordon_with_cached(
        client,
        node,
        &cordon_owner(policy),
        with_record(closing_gates(policy, gates), record),
        cached,
    )
    .await
    // A refused write is reported as the API error it is (reason `KubeApiError`), as before.
    .map_err(|e| match e {
        DrainError::NodeWrite { source, .. } => Error::kube(format!("cordon node {node}"), source),
        other => drain_error("cordon", node, other),
    })
}

/// `extras` with the node's upgrade `record` (annotation and state label) riding along: the
/// step is on the node in the same write that takes it.
fn with_record(extras: NodePatchExtras, record: Option<&NodeRecord>) -> NodePatchExtras {
    match record {
        Some(r) => extras
            .set_annotation(annotations::UPGRADE_RECORD, r.to_annotation())
            .set_label(labels::UPGRADE_STATE, r.state_label()),
        None => extras,
    }
}

/// Grants `node` the upgrade of `policy` to `version`: the annotation
/// [`annotations::UPGRADE_GRANT`] (`<policy>/<version>`), which the node's agent waits for before
/// it swaps a loaded module, with the node's upgrade `record` in the same JSON merge patch; a
/// node gone is nothing to grant.
pub async fn grant_upgrade(
    client: &Client,
    policy: &str,
    node: &str,
    version: &str,
    record: Option<&NodeRecord>,
) -> Result<(), Error> {
    let grant = names::upgrade_grant(policy, version);
    let mut patch = json!({"metadata": {"annotations": {annotations::UPGRADE_GRANT: grant}}});
    if let Some(r) = record {
        patch["metadata"]["annotations"][annotations::UPGRADE_RECORD] = json!(r.to_annotation());
        patch["metadata"]["labels"] = json!({labels::UPGRADE_STATE: r.state_label()});
    }
    merge_patch_node(client, node, patch, "grant the upgrade").await?;
    info!(node, policy, version, "node granted its upgrade");
    Ok(())
}

/// Reopens the deploy gates the node's annotation lists (removing the labels and the
/// annotation), removes `policy`'s upgrade grant and lifts `policy`'s cordon (never someone
/// else's) in one write: [`ttdp_drain::uncordon_with`] with those as its extras, and the
/// node's upgrade record as `record` says. The first
/// decision may come from `cached` (the controller's copy of the node, saving a read on the
/// hand-off from one node to the next); ttdp-drain re-reads whenever a stale copy could mislead
/// it, so a stale cache never leaves a gate closed or a cordon in place. A node that is gone is
/// [`UncordonOutcome::NotCordoned`].
pub async fn release(
    client: &Client,
    policy: &str,
    node: &str,
    cached: Option<Node>,
    record: RecordOnRelease,
) -> Result<UncordonOutcome, Error> {
    let forget = record == RecordOnRelease::Remove;
    let reopen = |n: &Node| match &record {
        RecordOnRelease::Set(r) => with_record(reopening_gates(n, policy, false), Some(r)),
        _ => reopening_gates(n, policy, forget),
    };
    match ttdp_drain::uncordon_with(client, node, &cordon_owner(policy), reopen, cached).await {
        Ok(UncordonOutcome::NodeMissing) => Ok(UncordonOutcome::NotCordoned),
        Ok(outcome) => Ok(outcome),
        Err(DrainError::NodeRead { source, .. }) => {
            Err(Error::kube(format!("get node {node}"), source))
        }
        Err(DrainError::NodeWrite { source, .. }) => {
            Err(Error::kube(format!("release node {node}"), source))
        }
        Err(other) => Err(drain_error("uncordon", node, other)),
    }
}

/// What a release does with the node's upgrade record of its policy.
#[derive(Clone, Debug, PartialEq)]
pub enum RecordOnRelease {
    /// Kept: a Failed node keeps its record (attempts, reason) through its release.
    Keep,
    /// Set to this one in the same write: a lifted cordon records the node's Uncordoning.
    Set(NodeRecord),
    /// Removed in the same write: the node's upgrade is over (it reached its target, left the
    /// policy, or the policy is being deleted).
    Remove,
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

#[cfg(test)]
mod tests {
    use super::*;

    const GATE: &str = "tenstorrent.com/deploy.tt-telemetry";

    fn node(labels: Value, node_annotations: Value) -> Node {
        let node = json!({"metadata": {"name": "n1", "labels": labels,
            "annotations": node_annotations}});
        serde_json::from_value(node).unwrap()
    }

    #[test]
    fn closing_gates_sets_each_label_false_and_remembers_the_list() {
        let gates = vec![GATE.to_owned(), "example.com/other".to_owned()];
        let extras = closing_gates("p", &gates);
        assert_eq!(
            extras,
            NodePatchExtras::new()
                .set_label(GATE, DEPLOY_GATE_CLOSED)
                .set_label("example.com/other", DEPLOY_GATE_CLOSED)
                .set_annotation(
                    annotations::DEPLOY_GATES,
                    "p:tenstorrent.com/deploy.tt-telemetry,example.com/other"
                )
        );
        assert!(closing_gates("p", &[]).is_empty());
    }

    #[test]
    fn reopening_gates_removes_the_listed_gates_and_only_this_policys_grant() {
        let closed = node(
            json!({GATE: "false"}),
            json!({annotations::DEPLOY_GATES: GATE, annotations::UPGRADE_GRANT: "p/2.8.0"}),
        );
        assert_eq!(
            reopening_gates(&closed, "p", false),
            NodePatchExtras::new()
                .remove_label(GATE)
                .remove_annotation(annotations::DEPLOY_GATES)
                .remove_annotation(annotations::UPGRADE_GRANT)
        );
        assert_eq!(
            reopening_gates(&closed, "q", false),
            NodePatchExtras::new()
                .remove_label(GATE)
                .remove_annotation(annotations::DEPLOY_GATES)
        );
        assert!(reopening_gates(&node(json!({GATE: "false"}), json!({})), "p", false).is_empty());
    }

    #[test]
    fn a_release_reopens_only_the_gates_its_own_policy_closed() {
        let owned = node(
            json!({GATE: "false"}),
            json!({annotations::DEPLOY_GATES: format!("owner:{GATE}")}),
        );
        assert!(
            reopening_gates(&owned, "overlapping", false).is_empty(),
            "another policy's release leaves the owner's gates closed"
        );
        assert_eq!(
            reopening_gates(&owned, "owner", false),
            NodePatchExtras::new()
                .remove_label(GATE)
                .remove_annotation(annotations::DEPLOY_GATES)
        );
    }

    #[test]
    fn letting_go_removes_only_this_policys_record() {
        let record = |policy: &str| {
            format!(
                r#"{{"policy":"{policy}","state":"Failed","target":"2.8.0","since":"2026-12-07T05:00:00Z"}}"#
            )
        };
        let ours = node(json!({}), json!({annotations::UPGRADE_RECORD: record("p")}));
        assert_eq!(
            reopening_gates(&ours, "p", true),
            NodePatchExtras::new()
                .remove_annotation(annotations::UPGRADE_RECORD)
                .remove_label(labels::UPGRADE_STATE)
        );
        assert!(
            reopening_gates(&ours, "p", false).is_empty(),
            "a Failed node's release keeps its record"
        );
        let theirs = node(json!({}), json!({annotations::UPGRADE_RECORD: record("q")}));
        assert!(reopening_gates(&theirs, "p", true).is_empty());
    }
}
