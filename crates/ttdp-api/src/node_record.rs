//! A node's upgrade record: the durable facts of its place in a policy's rollout, kept on the
//! Node itself (the annotation [`annotations::UPGRADE_RECORD`], with the state also in the label
//! [`crate::names::labels::UPGRADE_STATE`] for `kubectl get nodes -L`).
//!
//! The policy's `status.nodes[]` is a view of the fleet, bounded in size and written when it can
//! be; the record is what a controller restarted with that status lost (or with the node left
//! out of it) resumes from: which step the node is in and since when, which version it is being
//! taken to, and, for a Failed node, how many attempts failed and why (its back-off and the
//! failure budget count from there). A node carries a record only while it is in flight, Failed
//! or waiting for a retry; a settled node carries none.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use crate::NodeState;
use crate::names::annotations;

/// One node's upgrade record, as the annotation's JSON.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    /// The policy whose rollout the node is in.
    pub policy: String,
    /// The node's state in that rollout.
    pub state: NodeState,
    /// The version the node is being taken to (or failed to reach).
    pub target: String,
    /// When the node entered `state`.
    pub since: Time,
    /// When the node's current upgrade started (its first step), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    /// Failed attempts so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    /// Why the node is in `state` (UpperCamelCase), when there is a reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What went wrong, for a Failed node (as bounded as the status's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl NodeRecord {
    /// The record in `annotations` if it is `policy`'s (another policy's record, or one that
    /// does not parse, is none of `policy`'s business).
    pub fn of_policy<'a>(
        annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
        policy: &str,
    ) -> Option<Self> {
        let (_, value) = annotations
            .into_iter()
            .find(|(k, _)| k.as_str() == annotations::UPGRADE_RECORD)?;
        serde_json::from_str::<Self>(value)
            .ok()
            .filter(|r| r.policy == policy)
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        // A struct of strings, a state and times always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The label's value (a state name is a valid label value).
    pub fn state_label(&self) -> String {
        format!("{:?}", self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn record(policy: &str) -> NodeRecord {
        NodeRecord {
            policy: policy.into(),
            state: NodeState::Failed,
            target: "2.8.0".into(),
            since: Time("2026-12-07T05:00:00Z".parse().unwrap()),
            started: None,
            attempts: Some(2),
            reason: Some("NodeTimeout".into()),
            message: None,
        }
    }

    #[test]
    fn a_record_reads_back_for_its_policy_only() {
        let r = record("fleet");
        let ann = BTreeMap::from([(annotations::UPGRADE_RECORD.to_owned(), r.to_annotation())]);
        assert_eq!(NodeRecord::of_policy(&ann, "fleet"), Some(r));
        assert_eq!(NodeRecord::of_policy(&ann, "other"), None);
    }

    #[test]
    fn a_record_that_does_not_parse_is_none() {
        let ann = BTreeMap::from([(annotations::UPGRADE_RECORD.to_owned(), "{".to_owned())]);
        assert_eq!(NodeRecord::of_policy(&ann, "fleet"), None);
    }

    #[test]
    fn the_annotation_is_small() {
        assert!(record("fleet").to_annotation().len() < 160);
        assert_eq!(record("fleet").state_label(), "Failed");
    }
}
