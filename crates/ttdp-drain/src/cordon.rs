//! Cordon and uncordon with ownership, optionally with extra labels and annotations written in
//! the same patch.
//!
//! [`cordon`] marks a node unschedulable and records who did it (an owner string and the time,
//! in annotations the caller names). [`uncordon`] lifts only a cordon the same owner placed. A
//! node that was already unschedulable for another reason (an administrator's `kubectl cordon`,
//! another controller) is reported as [`CordonOutcome::External`] and is never claimed, so it
//! is never lifted by mistake.
//!
//! [`cordon_with`] and [`uncordon_with`] do the same and also write a caller's
//! [`NodePatchExtras`] (labels and annotations to set or remove) in the same patch. The extras do
//! not depend on who owns the cordon: they are written whenever the node does not carry them
//! yet, also beside someone else's cordon (which itself stays as it is, unclaimed), and a node
//! that already carries them and needs no cordon change is not written at all.
//!
//! Each call writes at most one JSON merge patch, carrying the node's `resourceVersion`, so a
//! concurrent change makes the write fail with a conflict instead of overwriting it; it then
//! re-reads the node and decides again (the extras too). Each call is idempotent: calling it
//! again after it was interrupted finishes the job.

use std::collections::BTreeMap;
use std::fmt;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;

use crate::error::DrainError;
use crate::node_patch::{ExtrasFor, NodePatchExtras, merge_patch};

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
    /// The node was already cordoned by this owner (an earlier call); the cordon did not change.
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

/// What one read of the node decides: nothing to write, or one patch.
#[derive(Debug, PartialEq)]
enum Step<O> {
    /// The node already is as asked: the call returns the outcome without writing.
    Done(O),
    /// Write the patch; once it is accepted, the outcome stands.
    Write(O, Value),
}

/// The cordon decision for `current`: cordon it (with the extras) when it is schedulable,
/// otherwise write only the extras the node does not carry yet, or nothing. `now` is the time
/// recorded with a new cordon.
fn cordon_step(
    current: &Node,
    owner: &CordonOwner,
    extras: &NodePatchExtras,
    now: &str,
) -> Step<CordonOutcome> {
    let recorded = annotation(current, &owner.owner_annotation);
    let resource_version = current.metadata.resource_version.as_deref();
    if !is_unschedulable(current) {
        let own = [
            (owner.owner_annotation.as_str(), Some(owner.owner.as_str())),
            (owner.time_annotation.as_str(), Some(now)),
        ];
        let patch = merge_patch(resource_version, extras, &own, Some(Value::Bool(true)));
        return Step::Write(CordonOutcome::Cordoned, patch);
    }
    let outcome = if recorded == Some(owner.owner.as_str()) {
        CordonOutcome::AlreadyOwned
    } else {
        CordonOutcome::External {
            owner: recorded.map(str::to_owned),
        }
    };
    if extras.applied_to(current) {
        Step::Done(outcome)
    } else {
        Step::Write(outcome, merge_patch(resource_version, extras, &[], None))
    }
}

/// The uncordon decision for `current`: lift this owner's cordon and remove its annotations
/// (with the extras) when they are there; beside anyone else's cordon or none, write only the
/// extras the node does not carry yet, or nothing.
fn uncordon_step(
    current: &Node,
    owner: &CordonOwner,
    extras: &NodePatchExtras,
) -> Step<UncordonOutcome> {
    let recorded = annotation(current, &owner.owner_annotation);
    let ours = recorded == Some(owner.owner.as_str());
    let unschedulable = is_unschedulable(current);
    let outcome = match (unschedulable, ours) {
        (true, true) => UncordonOutcome::Uncordoned,
        (true, false) => UncordonOutcome::External {
            owner: recorded.map(str::to_owned),
        },
        (false, _) => UncordonOutcome::NotCordoned,
    };
    if !ours && extras.applied_to(current) {
        return Step::Done(outcome);
    }
    let own: &[(&str, Option<&str>)] = if ours {
        &[
            (owner.owner_annotation.as_str(), None),
            (owner.time_annotation.as_str(), None),
        ]
    } else {
        &[]
    };
    let lift = (ours && unschedulable).then_some(Value::Null);
    let patch = merge_patch(
        current.metadata.resource_version.as_deref(),
        extras,
        own,
        lift,
    );
    Step::Write(outcome, patch)
}

/// Sends one patch, guarded by the `resourceVersion` it carries. `Ok(false)` is a write conflict:
/// the node changed since it was read, so the caller reads and decides again.
async fn send(nodes: &Api<Node>, node: &str, patch: &Value) -> Result<bool, kube::Error> {
    match nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if is_conflict(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

fn written(node: &str, owner: &CordonOwner, outcome: &dyn fmt::Debug, extras: &NodePatchExtras) {
    tracing::info!(
        node,
        owner = %owner.owner,
        ?outcome,
        labels = extras.labels.len(),
        annotations = extras.annotations.len(),
        "node cordon written"
    );
}

/// Cordon `node` for `owner`. See the module docs.
pub async fn cordon(
    client: &Client,
    node: &str,
    owner: &CordonOwner,
) -> Result<CordonOutcome, DrainError> {
    cordon_with(client, node, owner, NodePatchExtras::new()).await
}

/// Cordon `node` for `owner` and write `extras` in the same patch. See the module docs.
///
/// The node is written when it needs the cordon ([`CordonOutcome::Cordoned`]) or does not carry
/// the extras yet; then the patch holds both, so they change together. Beside a cordon that is
/// already there (this owner's or someone else's) only the extras are written.
pub async fn cordon_with(
    client: &Client,
    node: &str,
    owner: &CordonOwner,
    extras: impl ExtrasFor,
) -> Result<CordonOutcome, DrainError> {
    cordon_with_cached(client, node, owner, extras, None).await
}

/// [`cordon_with`], the first decision made from `cached`, a copy of the node the caller already
/// has (from a watch, say), saving a read. As with [`uncordon_with`], a stale copy is safe: a
/// patch made from it carries its `resourceVersion`, fails that precondition and is decided
/// again from a fresh read, and a copy that shows nothing to do is confirmed by a fresh read.
pub async fn cordon_with_cached(
    client: &Client,
    node: &str,
    owner: &CordonOwner,
    extras: impl ExtrasFor,
    cached: Option<Node>,
) -> Result<CordonOutcome, DrainError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut first = cached;
    for _ in 0..CONFLICT_RETRIES {
        let from_cache = first.is_some();
        let current = match first.take() {
            Some(current) => current,
            None => get_node(&nodes, node).await?,
        };
        let extras = extras.extras_for(&current);
        let now = Timestamp::now()
            .round(jiff::Unit::Second)
            .unwrap_or_else(|_| Timestamp::now())
            .to_string();
        let (outcome, patch) = match cordon_step(&current, owner, &extras, &now) {
            Step::Done(_) if from_cache => continue,
            Step::Done(outcome) => return Ok(outcome),
            Step::Write(outcome, patch) => (outcome, patch),
        };
        let accepted =
            send(&nodes, node, &patch)
                .await
                .map_err(|source| DrainError::NodeWrite {
                    node: node.to_owned(),
                    action: "cordon",
                    source,
                })?;
        if accepted {
            written(node, owner, &outcome, &extras);
            return Ok(outcome);
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
    uncordon_with(client, node, owner, NodePatchExtras::new(), None).await
}

/// Lift `owner`'s cordon from `node` and write `extras` in the same patch. See the module docs.
///
/// The node is written when it carries this owner's cordon or annotations, or does not carry the
/// extras yet; then the patch holds both, so they change together. Beside someone else's cordon
/// ([`UncordonOutcome::External`]) only the extras are written and the cordon stays.
///
/// `cached` is a copy of the node the caller already has (from a watch, say); when given, the
/// first decision is made from it, saving a read. That is safe with a stale copy: a patch made
/// from it carries its `resourceVersion`, fails that precondition and is decided again from a
/// fresh read, and a copy that shows nothing to do is confirmed by a fresh read before the call
/// returns.
pub async fn uncordon_with(
    client: &Client,
    node: &str,
    owner: &CordonOwner,
    extras: impl ExtrasFor,
    cached: Option<Node>,
) -> Result<UncordonOutcome, DrainError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut first = cached;
    for _ in 0..CONFLICT_RETRIES {
        let from_cache = first.is_some();
        let current = match first.take() {
            Some(current) => current,
            None => match nodes.get_opt(node).await {
                Ok(Some(current)) => current,
                Ok(None) => return Ok(UncordonOutcome::NodeMissing),
                Err(source) => {
                    return Err(DrainError::NodeRead {
                        node: node.to_owned(),
                        source,
                    });
                }
            },
        };
        let extras = extras.extras_for(&current);
        let (outcome, patch) = match uncordon_step(&current, owner, &extras) {
            Step::Done(_) if from_cache => continue,
            Step::Done(outcome) => return Ok(outcome),
            Step::Write(outcome, patch) => (outcome, patch),
        };
        match send(&nodes, node, &patch).await {
            Ok(true) => {
                written(node, owner, &outcome, &extras);
                return Ok(outcome);
            }
            Ok(false) => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BY: &str = "example.com/cordoned-by";
    const AT: &str = "example.com/cordoned-at";

    fn owner() -> CordonOwner {
        CordonOwner {
            owner: "me".into(),
            owner_annotation: BY.into(),
            time_annotation: AT.into(),
        }
    }

    /// A node at resourceVersion 5: `unschedulable`, cordoned by `by`, with label `gate=false`
    /// when `gate_closed`.
    fn node(unschedulable: bool, by: Option<&str>, gate_closed: bool) -> Node {
        let labels = if gate_closed {
            json!({"gate": "false"})
        } else {
            json!({})
        };
        let annotations = by.map_or(json!({}), |by| json!({BY: by}));
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "resourceVersion": "5", "labels": labels,
                "annotations": annotations},
            "spec": {"unschedulable": unschedulable},
        }))
        .unwrap()
    }

    fn close() -> NodePatchExtras {
        NodePatchExtras::new().set_label("gate", "false")
    }

    fn reopen() -> NodePatchExtras {
        NodePatchExtras::new().remove_label("gate")
    }

    #[test]
    fn a_schedulable_node_is_cordoned_with_the_extras_in_one_patch() {
        let step = cordon_step(&node(false, None, true), &owner(), &close(), "T");
        let patch = json!({
            "metadata": {"resourceVersion": "5", "labels": {"gate": "false"},
                "annotations": {BY: "me", AT: "T"}},
            "spec": {"unschedulable": true},
        });
        assert_eq!(step, Step::Write(CordonOutcome::Cordoned, patch));
    }

    #[test]
    fn beside_an_existing_cordon_only_missing_extras_are_written() {
        let external = CordonOutcome::External {
            owner: Some("other".into()),
        };
        let only_extras =
            json!({"metadata": {"resourceVersion": "5", "labels": {"gate": "false"}}});
        assert_eq!(
            cordon_step(&node(true, Some("other"), false), &owner(), &close(), "T"),
            Step::Write(external.clone(), only_extras.clone())
        );
        assert_eq!(
            cordon_step(&node(true, Some("other"), true), &owner(), &close(), "T"),
            Step::Done(external)
        );
        assert_eq!(
            cordon_step(&node(true, Some("me"), false), &owner(), &close(), "T"),
            Step::Write(CordonOutcome::AlreadyOwned, only_extras)
        );
        assert_eq!(
            cordon_step(
                &node(true, None, false),
                &owner(),
                &NodePatchExtras::new(),
                "T"
            ),
            Step::Done(CordonOutcome::External { owner: None })
        );
    }

    #[test]
    fn our_cordon_is_lifted_with_the_extras_in_one_patch() {
        let step = uncordon_step(&node(true, Some("me"), true), &owner(), &reopen());
        let patch = json!({
            "metadata": {"resourceVersion": "5", "labels": {"gate": null},
                "annotations": {BY: null, AT: null}},
            "spec": {"unschedulable": null},
        });
        assert_eq!(step, Step::Write(UncordonOutcome::Uncordoned, patch));
        // Leftover annotations of ours on a schedulable node: removed, and a write carries all
        // the extras (here, removing a label that is already gone is harmless).
        let leftover = json!({"metadata": {"resourceVersion": "5", "labels": {"gate": null},
            "annotations": {BY: null, AT: null}}});
        assert_eq!(
            uncordon_step(&node(false, Some("me"), false), &owner(), &reopen()),
            Step::Write(UncordonOutcome::NotCordoned, leftover)
        );
    }

    #[test]
    fn someone_elses_cordon_stays_and_only_missing_extras_are_written() {
        let external = UncordonOutcome::External {
            owner: Some("other".into()),
        };
        assert_eq!(
            uncordon_step(&node(true, Some("other"), true), &owner(), &reopen()),
            Step::Write(
                external.clone(),
                json!({"metadata": {"resourceVersion": "5", "labels": {"gate": null}}})
            )
        );
        assert_eq!(
            uncordon_step(&node(true, Some("other"), false), &owner(), &reopen()),
            Step::Done(external)
        );
        assert_eq!(
            uncordon_step(&node(false, None, false), &owner(), &reopen()),
            Step::Done(UncordonOutcome::NotCordoned)
        );
    }
}
