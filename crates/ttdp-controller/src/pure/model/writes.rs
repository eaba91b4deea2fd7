//! The node writes the controller's actions stand for, as `runtime::node_work::node_actions` and
//! ttdp-drain's cordon make them: a cordon claims the node unless someone else cordoned it and
//! closes the deploy gates in the same write; a release reopens the gates the node's annotation
//! lists, removes the policy's grant and lifts the policy's cordon (never someone else's). A
//! node may be set to refuse its next write (an API error).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use ttdp_api::names::{self, annotations, labels};
use ttdp_drain::UncordonOutcome;

use super::{GATE, ModelNode};
use crate::pure::{node_record, observe};
use ttdp_api::node_record::NodeRecord;

/// A write the API server refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WriteFailed;

fn refused(n: &mut ModelNode) -> Result<(), WriteFailed> {
    if std::mem::take(&mut n.fail_next_write) {
        Err(WriteFailed)
    } else {
        Ok(())
    }
}

/// Cordons `n` for `policy` (someone else's cordon stays theirs) and closes its deploy gate.
pub(super) fn cordon(
    n: &mut ModelNode,
    policy: &str,
    record: Option<&NodeRecord>,
) -> Result<(), WriteFailed> {
    refused(n)?;
    put_record(n, record);
    if !n.unschedulable {
        n.unschedulable = true;
        n.annotations
            .insert(annotations::CORDONED_BY.into(), names::cordon_owner(policy));
        n.annotations
            .insert(annotations::CORDONED_AT.into(), "now".into());
    }
    n.labels
        .insert(GATE.into(), names::DEPLOY_GATE_CLOSED.into());
    n.annotations.insert(
        annotations::DEPLOY_GATES.into(),
        names::deploy_gates(policy, &[GATE.to_owned()]),
    );
    Ok(())
}

/// Grants `n` the upgrade of `policy` to `version`.
pub(super) fn grant(
    n: &mut ModelNode,
    policy: &str,
    version: &str,
    record: Option<&NodeRecord>,
) -> Result<(), WriteFailed> {
    refused(n)?;
    put_record(n, record);
    n.annotations.insert(
        annotations::UPGRADE_GRANT.into(),
        names::upgrade_grant(policy, version),
    );
    Ok(())
}

/// Reopens the gates `policy` closed on `n` (another policy's stay), removes `policy`'s grant
/// and lifts `policy`'s cordon.
pub(super) fn release(n: &mut ModelNode, policy: &str) -> Result<UncordonOutcome, WriteFailed> {
    refused(n)?;
    let meta = ObjectMeta {
        annotations: Some(n.annotations.clone()),
        ..ObjectMeta::default()
    };
    let reopen = observe::closed_gates(&meta, policy);
    if !reopen.is_empty() {
        n.annotations.remove(annotations::DEPLOY_GATES);
        for gate in &reopen {
            n.labels.remove(gate);
        }
    }
    if n.grant_of(policy).is_some() {
        n.annotations.remove(annotations::UPGRADE_GRANT);
    }
    let ours = n.cordon_owner() == Some(names::cordon_owner(policy).as_str());
    if ours {
        n.annotations.remove(annotations::CORDONED_BY);
        n.annotations.remove(annotations::CORDONED_AT);
    }
    Ok(match (n.unschedulable, ours) {
        (true, true) => {
            n.unschedulable = false;
            n.drained = false;
            UncordonOutcome::Uncordoned
        }
        (true, false) => UncordonOutcome::External {
            owner: n.cordon_owner().map(str::to_owned),
        },
        (false, _) => UncordonOutcome::NotCordoned,
    })
}

/// Removes the retry request.
pub(super) fn clear_retry(n: &mut ModelNode) -> Result<(), WriteFailed> {
    refused(n)?;
    n.annotations.remove(annotations::RETRY);
    Ok(())
}

/// Applies an upgrade-record patch (`pure::node_record::patch`): the record annotation and the
/// state label set, or removed when the patch says null.
pub(super) fn record(n: &mut ModelNode, patch: &Value) -> Result<(), WriteFailed> {
    refused(n)?;
    let meta = &patch["metadata"];
    match meta["annotations"][annotations::UPGRADE_RECORD].as_str() {
        Some(r) => n
            .annotations
            .insert(annotations::UPGRADE_RECORD.into(), r.into()),
        None => n.annotations.remove(annotations::UPGRADE_RECORD),
    };
    match meta["labels"][labels::UPGRADE_STATE].as_str() {
        Some(state) => n.labels.insert(labels::UPGRADE_STATE.into(), state.into()),
        None => n.labels.remove(labels::UPGRADE_STATE),
    };
    Ok(())
}

/// A release that also removes `policy`'s upgrade record, in the same write
/// (`node_actions::let_go`).
pub(super) fn let_go(n: &mut ModelNode, policy: &str) -> Result<UncordonOutcome, WriteFailed> {
    let outcome = release(n, policy)?;
    let meta = ObjectMeta {
        annotations: Some(n.annotations.clone()),
        ..ObjectMeta::default()
    };
    if node_record::current(&meta, policy).is_some() {
        n.annotations.remove(annotations::UPGRADE_RECORD);
        n.labels.remove(labels::UPGRADE_STATE);
    }
    Ok(outcome)
}

/// The record riding on a cordon, a grant or a lifted cordon (`node_actions::with_record`).
pub(super) fn put_record(n: &mut ModelNode, record: Option<&NodeRecord>) {
    if let Some(r) = record {
        n.annotations
            .insert(annotations::UPGRADE_RECORD.into(), r.to_annotation());
        n.labels
            .insert(labels::UPGRADE_STATE.into(), r.state_label());
    }
}
