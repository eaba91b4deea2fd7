//! The node's upgrade record ([`NodeRecord`]): what it should say after a round (from the
//! node's status entry), the node patch that makes it so, and the recorded entries made whole
//! again from the nodes' records when the policy's status lost them (a restart with the status
//! wiped, or a node left out of a status bounded in size).
//!
//! The record is written before any action on the node, and before the status: a crash in
//! between repeats the action. When the two disagree, the record wins, unless the status entry
//! entered its state later (a whole second later, the times' precision): the status runs ahead
//! of a node's record only when that record could not be written, and nothing was done on the
//! node then.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Value, json};
use ttdp_api::names::{annotations, labels};
use ttdp_api::node_record::NodeRecord;
use ttdp_api::{NodeState, NodeStatus};

use crate::pure::status::NodeEntries;
use crate::pure::transition::reasons;

/// The reasons of a node in flight that a restart decides from (the wait on the device's
/// holders counts towards the drain timeout). The others change as the agent pod comes and goes,
/// and writing each to the node would cost a node write apiece for nothing a restart needs.
const REASONS_KEPT_IN_FLIGHT: [&str; 1] = [reasons::DEVICE_HELD];

/// The record a node with status `entry` in `policy`'s rollout to `target` carries: one while
/// it is in flight, Failed, or waiting for a retry (its attempts count); none when settled.
pub fn desired(policy: &str, target: &str, entry: &NodeStatus) -> Option<NodeRecord> {
    let failed = entry.state == NodeState::Failed;
    let in_flight = entry.state.is_in_flight();
    if !(in_flight || failed || entry.attempts.is_some()) {
        return None;
    }
    let reason = entry
        .reason
        .clone()
        .filter(|r| !in_flight || REASONS_KEPT_IN_FLIGHT.contains(&r.as_str()));
    Some(NodeRecord {
        policy: policy.to_owned(),
        state: entry.state,
        target: entry
            .target_version
            .clone()
            .unwrap_or_else(|| target.to_owned()),
        since: entry.last_transition_time.clone()?,
        started: entry.phase_start_time.clone(),
        attempts: entry.attempts,
        reason,
        message: entry.message.clone().filter(|_| failed),
    })
}

/// `policy`'s record on the node, if it carries one.
pub fn current(meta: &ObjectMeta, policy: &str) -> Option<NodeRecord> {
    NodeRecord::of_policy(meta.annotations.iter().flatten(), policy)
}

/// The merge patch that takes the node's record (`meta`) to `desired`; None when it already
/// says that (compared as written: times keep whole seconds).
pub fn patch(meta: &ObjectMeta, policy: &str, desired: Option<&NodeRecord>) -> Option<Value> {
    patch_from(current(meta, policy).as_ref(), desired)
}

/// The merge patch that takes a node carrying `now` to `desired`; None when they say the same.
pub fn patch_from(now: Option<&NodeRecord>, desired: Option<&NodeRecord>) -> Option<Value> {
    if now.map(NodeRecord::to_annotation) == desired.map(NodeRecord::to_annotation) {
        return None;
    }
    Some(overwrite(desired))
}

/// The merge patch that takes the node's record to `desired` whatever it carries now.
fn overwrite(desired: Option<&NodeRecord>) -> Value {
    let (record, state) = match desired {
        Some(r) => (json!(r.to_annotation()), json!(r.state_label())),
        None => (Value::Null, Value::Null),
    };
    json!({"metadata": {
        "annotations": {annotations::UPGRADE_RECORD: record},
        "labels": {labels::UPGRADE_STATE: state},
    }})
}

/// The node's status entry as its record says, keeping what the record does not carry (the
/// loaded version, parameters, commit) from `entry`; None when `entry` already agrees.
fn entry_of(record: &NodeRecord, name: &str, entry: Option<&NodeStatus>) -> Option<NodeStatus> {
    let agrees = entry.and_then(|e| desired(&record.policy, &record.target, e));
    if agrees.map(|r| r.to_annotation()) == Some(record.to_annotation()) {
        return None;
    }
    let entered = |t: &Time| t.0.as_second();
    let status_newer = entry
        .and_then(|e| e.last_transition_time.as_ref())
        .is_some_and(|t| entered(t) > entered(&record.since));
    if status_newer {
        return None;
    }
    let same_state = entry.is_some_and(|e| e.state == record.state);
    let kept = |f: fn(&NodeStatus) -> Option<String>| entry.and_then(f);
    Some(NodeStatus {
        name: name.to_owned(),
        state: record.state,
        current_version: kept(|e| e.current_version.clone()),
        target_version: (record.state.is_in_flight() || record.state == NodeState::Failed)
            .then(|| record.target.clone()),
        install_mode: kept(|e| e.install_mode.clone()),
        reason: (record.reason.clone())
            .or_else(|| kept(|e| e.reason.clone()).filter(|_| same_state)),
        message: record
            .message
            .clone()
            .or_else(|| kept(|e| e.message.clone()).filter(|_| same_state)),
        last_transition_time: Some(record.since.clone()),
        phase_start_time: record.started.clone(),
        attempts: record.attempts,
        loaded_parameters: kept(|e| e.loaded_parameters.clone()),
        source_commit: kept(|e| e.source_commit.clone()),
        udev_rule: kept(|e| e.udev_rule.clone()),
        next_kernels: entry.and_then(|e| e.next_kernels.clone()),
        module_signer: kept(|e| e.module_signer.clone()),
        start_load: entry.and_then(|e| e.start_load),
    })
}

/// Whether any of `nodes` carries an upgrade record of `policy`.
pub fn any_on(nodes: &[Arc<crate::pure::cached::CachedNode>], policy: &str) -> bool {
    nodes.iter().any(|n| current(&n.metadata, policy).is_some())
}

/// `entries` (read from the policy's status) with each node's record of `policy` laid over:
/// a node whose entry was lost, or says otherwise, gets the record's state, target, times,
/// attempts and reason.
pub fn overlay<'a>(
    entries: &mut NodeEntries,
    nodes: impl IntoIterator<Item = (&'a str, &'a ObjectMeta)>,
    policy: &str,
) {
    for (name, meta) in nodes {
        let Some(record) = current(meta, policy) else {
            continue;
        };
        let entry = entries.get(name).map(Arc::as_ref);
        if let Some(whole) = entry_of(&record, name, entry) {
            entries.insert(Arc::from(name), Arc::new(whole));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + s).unwrap())
    }

    fn entry(state: NodeState, attempts: Option<i32>) -> NodeStatus {
        NodeStatus {
            name: "n1".into(),
            state,
            current_version: Some("2.7.0".into()),
            target_version: (state != NodeState::Pending).then(|| "2.8.0".into()),
            install_mode: None,
            reason: (state == NodeState::Failed).then(|| "NodeTimeout".into()),
            message: (state == NodeState::Failed).then(|| "the step took too long".into()),
            last_transition_time: Some(at(10)),
            phase_start_time: state.is_in_flight().then(|| at(5)),
            attempts,
            loaded_parameters: None,
            source_commit: Some("abc".into()),
            udev_rule: None,
            next_kernels: None,
            module_signer: None,
            start_load: None,
        }
    }

    fn meta_with(record: Option<&NodeRecord>) -> ObjectMeta {
        ObjectMeta {
            annotations: record.map(|r| {
                BTreeMap::from([(annotations::UPGRADE_RECORD.to_owned(), r.to_annotation())])
            }),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn only_nodes_in_flight_failed_or_counting_attempts_carry_a_record() {
        use NodeState::*;
        let carries = |s, a| desired("fleet", "2.8.0", &entry(s, a)).is_some();
        assert!(carries(Draining, None));
        assert!(carries(Failed, Some(1)));
        assert!(
            carries(Pending, Some(2)),
            "a retry waiting for its slot keeps its count"
        );
        assert!(!carries(Pending, None));
        assert!(!carries(Done, None));
    }

    #[test]
    fn a_node_in_flight_is_not_rewritten_for_its_agents_passing_reasons() {
        let mut upgrading = entry(NodeState::Upgrading, None);
        let quiet = desired("fleet", "2.8.0", &upgrading).unwrap();
        upgrading.reason = Some("Installing".into());
        let installing = desired("fleet", "2.8.0", &upgrading).unwrap();
        assert_eq!(
            patch(&meta_with(Some(&quiet)), "fleet", Some(&installing)),
            None
        );
        upgrading.reason = Some(reasons::DEVICE_HELD.into());
        let held = desired("fleet", "2.8.0", &upgrading).unwrap();
        assert_eq!(
            held.reason.as_deref(),
            Some(reasons::DEVICE_HELD),
            "the holders' wait is kept"
        );
    }

    #[test]
    fn a_node_already_carrying_its_record_needs_no_patch() {
        let r = desired("fleet", "2.8.0", &entry(NodeState::Upgrading, None)).unwrap();
        assert_eq!(patch(&meta_with(Some(&r)), "fleet", Some(&r)), None);
        let p = patch(&meta_with(None), "fleet", Some(&r)).unwrap();
        assert_eq!(p["metadata"]["labels"][labels::UPGRADE_STATE], "Upgrading");
    }

    #[test]
    fn a_settled_node_loses_its_record_and_label() {
        let r = desired("fleet", "2.8.0", &entry(NodeState::Uncordoning, None)).unwrap();
        let p = patch(&meta_with(Some(&r)), "fleet", None).unwrap();
        assert!(p["metadata"]["annotations"][annotations::UPGRADE_RECORD].is_null());
        assert!(p["metadata"]["labels"][labels::UPGRADE_STATE].is_null());
        assert_eq!(patch(&meta_with(None), "fleet", None), None);
    }

    #[test]
    fn another_policys_record_is_not_ours_to_remove() {
        let r = desired("other", "2.8.0", &entry(NodeState::Failed, Some(1))).unwrap();
        assert_eq!(patch(&meta_with(Some(&r)), "fleet", None), None);
    }

    #[test]
    fn a_wiped_status_is_made_whole_from_the_records() {
        let failed = entry(NodeState::Failed, Some(3));
        let r = desired("fleet", "2.8.0", &failed).unwrap();
        let meta = meta_with(Some(&r));
        let mut entries = NodeEntries::new();
        overlay(&mut entries, [("n1", &meta)], "fleet");
        let back = entries.get("n1").unwrap();
        assert_eq!(back.state, NodeState::Failed);
        assert_eq!(back.attempts, Some(3));
        assert_eq!(back.last_transition_time, Some(at(10)));
        assert_eq!(back.reason.as_deref(), Some("NodeTimeout"));
        assert_eq!(back.message, failed.message);
        assert_eq!(back.target_version.as_deref(), Some("2.8.0"));
    }

    #[test]
    fn the_record_wins_over_a_status_that_says_otherwise() {
        let draining = entry(NodeState::Draining, None);
        let r = desired("fleet", "2.8.0", &entry(NodeState::Upgrading, None)).unwrap();
        let meta = meta_with(Some(&r));
        let mut entries = NodeEntries::from([(Arc::from("n1"), Arc::new(draining))]);
        overlay(&mut entries, [("n1", &meta)], "fleet");
        let back = entries.get("n1").unwrap();
        assert_eq!(back.state, NodeState::Upgrading);
        assert_eq!(
            back.source_commit.as_deref(),
            Some("abc"),
            "kept from the status"
        );
    }

    #[test]
    fn a_status_newer_than_a_record_that_could_not_be_written_is_kept() {
        let draining = desired("fleet", "2.8.0", &entry(NodeState::Draining, None)).unwrap();
        let mut failed = entry(NodeState::Failed, Some(1));
        failed.last_transition_time = Some(at(12));
        let meta = meta_with(Some(&draining));
        let mut entries = NodeEntries::from([(Arc::from("n1"), Arc::new(failed))]);
        overlay(&mut entries, [("n1", &meta)], "fleet");
        assert_eq!(entries.get("n1").unwrap().state, NodeState::Failed);
    }

    #[test]
    fn a_status_that_agrees_is_kept_as_it_is() {
        let upgrading = Arc::new(entry(NodeState::Upgrading, None));
        let r = desired("fleet", "2.8.0", &upgrading).unwrap();
        let meta = meta_with(Some(&r));
        let mut entries = NodeEntries::from([(Arc::from("n1"), upgrading.clone())]);
        overlay(&mut entries, [("n1", &meta)], "fleet");
        assert!(Arc::ptr_eq(entries.get("n1").unwrap(), &upgrading));
    }
}
