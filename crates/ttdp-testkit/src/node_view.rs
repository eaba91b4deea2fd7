//! A node's state in a rollout as an observer outside the controller sees it, from the two
//! places the controller writes it: the node's upgrade record (written before each step) and
//! the policy's `status.nodes` (a view written about once a second, which can lag behind the
//! record, or now and then run ahead of it).
//!
//! While the node carries a record, the record is its state. Once the record is gone, the status
//! entry counts when it entered its state after the last record did; or, when it is settled (not
//! in flight), when it changed since the record was removed, or changed since the record was
//! written and entered its state in the same second (the times' precision). An entry from
//! before is the view lagging, and the node stays as its last record said until the view
//! catches up. (A settled entry that changes without a new time is one the controller found
//! settled again: a node Done at its new version after a restart whose status was never
//! written with it.)

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use ttdp_api::NodeState;
use ttdp_api::node_record::NodeRecord;

/// What one observer knows of one node in one policy's rollout.
#[derive(Debug, Default, Clone)]
pub struct NodeView {
    /// State, when it was entered, and the version loaded.
    entry: Option<(NodeState, Option<Time>, Option<String>)>,
    /// The last record seen, kept after it is removed.
    record: Option<NodeRecord>,
    /// Whether the node still carries `record`.
    carries_record: bool,
    /// Whether the entry changed since `record` was written.
    moved_since_written: bool,
    /// Whether the entry changed since `record` was removed.
    moved_since_removed: bool,
}

impl NodeView {
    /// Takes the node's entry in the policy's status: its state, when it entered it and the
    /// version loaded.
    pub fn see_entry(&mut self, state: NodeState, since: Option<Time>, version: Option<String>) {
        let entry = Some((state, since, version));
        let moved = self.entry != entry;
        self.moved_since_written |= moved;
        self.moved_since_removed |= moved;
        self.entry = entry;
    }

    /// Takes the policy's record on the node (`None`: the node carries none).
    pub fn see_record(&mut self, record: Option<NodeRecord>) {
        if self.carries_record && record.is_none() {
            self.moved_since_removed = false;
        }
        self.carries_record = record.is_some();
        if record.is_some() && record != self.record {
            self.moved_since_written = false;
            self.record = record;
        }
    }

    /// The policy's record the node carries now.
    pub fn carried(&self) -> Option<&NodeRecord> {
        self.record.as_ref().filter(|_| self.carries_record)
    }

    /// The node's state, if anything says one.
    pub fn state(&self) -> Option<NodeState> {
        let entry_state = self.entry.as_ref().map(|(s, _, _)| *s);
        let Some(record) = &self.record else {
            return entry_state;
        };
        if self.carries_record {
            return Some(record.state);
        }
        let entry_counts = self.entry.as_ref().is_some_and(|(state, since, _)| {
            let Some(since) = since else { return false };
            let newer = since.0 > record.since.0;
            let as_recent = since.0 == record.since.0 && self.moved_since_written;
            newer || (!state.is_in_flight() && (as_recent || self.moved_since_removed))
        });
        if entry_counts {
            entry_state
        } else {
            Some(record.state)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use NodeState::*;

    fn at(t: &str) -> Option<Time> {
        Some(Time(format!("2026-12-07T05:00:{t}Z").parse().unwrap()))
    }

    fn record(state: NodeState, t: &str) -> Option<NodeRecord> {
        Some(NodeRecord {
            policy: "p".into(),
            state,
            target: "2.8.0".into(),
            since: at(t).unwrap(),
            started: None,
            attempts: None,
            reason: None,
            message: None,
        })
    }

    #[test]
    fn the_record_wins_while_carried_and_a_lagging_entry_never_walks_the_node_back() {
        let mut v = NodeView::default();
        v.see_entry(Done, at("00"), None);
        assert_eq!(v.state(), Some(Done));
        v.see_record(record(Upgrading, "11"));
        v.see_entry(Cordoning, at("10"), None);
        assert_eq!(v.state(), Some(Upgrading));
        v.see_record(None);
        assert_eq!(v.state(), Some(Upgrading), "the view has not caught up");
        v.see_entry(Done, at("12"), None);
        assert_eq!(v.state(), Some(Done));
    }

    #[test]
    fn within_one_second_only_a_changed_settled_entry_ends_the_record() {
        let mut v = NodeView::default();
        v.see_entry(Pending, at("00"), None);
        v.see_record(record(Upgrading, "00"));
        v.see_record(None);
        v.see_entry(Pending, at("00"), None);
        assert_eq!(v.state(), Some(Upgrading), "the same Pending as before");
        v.see_entry(Done, at("00"), None);
        assert_eq!(v.state(), Some(Done));
    }

    #[test]
    fn a_node_found_done_again_after_its_record_went_is_done() {
        let mut v = NodeView::default();
        v.see_entry(Done, at("00"), Some("2.7.0".into()));
        v.see_record(record(Uncordoning, "10"));
        v.see_record(None);
        assert_eq!(
            v.state(),
            Some(Uncordoning),
            "the view still says Done at 2.7.0"
        );
        v.see_entry(Done, at("00"), Some("2.8.0".into()));
        assert_eq!(v.state(), Some(Done));
    }

    #[test]
    fn a_view_written_before_the_record_was_removed_ends_it() {
        let mut v = NodeView::default();
        v.see_record(record(Uncordoning, "10"));
        v.see_entry(Done, at("10"), None);
        assert_eq!(v.state(), Some(Uncordoning));
        v.see_record(None);
        assert_eq!(v.state(), Some(Done), "no later status write is needed");
    }
}
