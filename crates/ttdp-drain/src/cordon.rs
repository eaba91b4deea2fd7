//! Cordon and uncordon with ownership.
//!
//! [`cordon`] marks a node unschedulable and records who did it (an owner string and the time,
//! in annotations the caller names). [`uncordon`] lifts only a cordon the same owner placed. A
//! node that was already unschedulable for another reason (an administrator's `kubectl cordon`,
//! another controller) is reported as [`CordonOutcome::External`] and is never claimed, so it
//! is never lifted by mistake.
//!
//! Both write one JSON merge patch that carries the node's `resourceVersion`, so a concurrent
//! change makes the write fail with a conflict instead of overwriting it; they then re-read the
//! node and decide again. Each call is idempotent: calling it again after it was interrupted
//! finishes the job.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::error::DrainError;

/// How many times a cordon or uncordon re-reads the node after a write conflict.
const CONFLICT_RETRIES: usize = 5;

/// Who cordons, and where that is recorded on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CordonOwner {
    /// The owner string, e.g. `my-operator/policy-a`.
    pub owner: String,
    /// The annotation key that holds the owner, e.g. `example.com/cordoned-by`.
    pub owner_annotation: String,
    /// The annotation key that holds when the cordon was placed (RFC 3339), e.g.
    /// `example.com/cordoned-at`.
    pub time_annotation: String,
}

/// What [`cordon`] found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CordonOutcome {
    /// The node was schedulable; it is now cordoned and owned by this owner.
    Cordoned,
    /// The node was already cordoned by this owner (an earlier call); nothing changed.
    AlreadyOwned,
    /// The node was already unschedulable and not by this owner; it was left as it is and is
    /// not claimed.
    External {
        /// The owner recorded in the owner annotation, if any.
        owner: Option<String>,
    },
}

/// What [`uncordon`] found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UncordonOutcome {
    /// This owner's cordon was lifted.
    Uncordoned,
    /// The node was schedulable already (any leftover annotations of this owner were removed).
    NotCordoned,
    /// The node is cordoned but not by this owner; it stays cordoned.
    External {
        /// The owner recorded in the owner annotation, if any.
        owner: Option<String>,
    },
    /// The node does not exist (any more), so there is no cordon to lift.
    NodeMissing,
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a: &BTreeMap<String, String>| a.get(key))
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

async fn get_node(nodes: &Api<Node>, name: &str) -> Result<Node, DrainError> {
    nodes
        .get(name)
        .await
        .map_err(|source| DrainError::NodeRead {
            node: name.to_owned(),
            source,
        })
}

/// Cordon `node` for `owner`. See the module docs.
pub async fn cordon(
    client: &Client,
    node: &str,
    owner: &CordonOwner,
) -> Result<CordonOutcome, DrainError> {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..CONFLICT_RETRIES {
        let current = get_node(&nodes, node).await?;
        let recorded = annotation(&current, &owner.owner_annotation);
        if is_unschedulable(&current) {
            return Ok(if recorded == Some(owner.owner.as_str()) {
                CordonOutcome::AlreadyOwned
            } else {
                CordonOutcome::External {
                    owner: recorded.map(str::to_owned),
                }
            });
        }
        let now = Timestamp::now()
            .round(jiff::Unit::Second)
            .unwrap_or_else(|_| Timestamp::now());
        let patch = json!({
            "metadata": {
                "resourceVersion": current.metadata.resource_version,
                "annotations": {
                    owner.owner_annotation.as_str(): owner.owner,
                    owner.time_annotation.as_str(): now.to_string(),
                },
            },
            "spec": {"unschedulable": true},
        });
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node, owner = %owner.owner, "node cordoned");
                return Ok(CordonOutcome::Cordoned);
            }
            Err(e) if is_conflict(&e) => continue,
            Err(source) => {
                return Err(DrainError::NodeWrite {
                    node: node.to_owned(),
                    action: "cordon",
                    source,
                });
            }
        }
    }
    Err(DrainError::NodeConflict {
        node: node.to_owned(),
        action: "cordon",
    })
}

/// Lift `owner`'s cordon from `node`. See the module docs.
pub async fn uncordon(
    client: &Client,
    node: &str,
    owner: &CordonOwner,
) -> Result<UncordonOutcome, DrainError> {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..CONFLICT_RETRIES {
        let current = match nodes.get_opt(node).await {
            Ok(Some(current)) => current,
            Ok(None) => return Ok(UncordonOutcome::NodeMissing),
            Err(source) => {
                return Err(DrainError::NodeRead {
                    node: node.to_owned(),
                    source,
                });
            }
        };
        let recorded = annotation(&current, &owner.owner_annotation);
        let ours = recorded == Some(owner.owner.as_str());
        let unschedulable = is_unschedulable(&current);
        if unschedulable && !ours {
            return Ok(UncordonOutcome::External {
                owner: recorded.map(str::to_owned),
            });
        }
        if !unschedulable && !ours {
            return Ok(UncordonOutcome::NotCordoned);
        }
        let mut patch = json!({
            "metadata": {
                "resourceVersion": current.metadata.resource_version,
                "annotations": {
                    owner.owner_annotation.as_str(): null,
                    owner.time_annotation.as_str(): null,
                },
            },
        });
        if unschedulable {
            patch["spec"] = json!({"unschedulable": null});
        }
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) if unschedulable => {
                tracing::info!(node, owner = %owner.owner, "node uncordoned");
                return Ok(UncordonOutcome::Uncordoned);
            }
            Ok(_) => return Ok(UncordonOutcome::NotCordoned),
            Err(e) if is_conflict(&e) => continue,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Ok(UncordonOutcome::NodeMissing);
            }
            Err(source) => {
                return Err(DrainError::NodeWrite {
                    node: node.to_owned(),
                    action: "uncordon",
                    source,
                });
            }
        }
    }
    Err(DrainError::NodeConflict {
        node: node.to_owned(),
        action: "uncordon",
    })
}
