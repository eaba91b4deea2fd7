//! Which node entries `status.nodes` lists, so that the status stays small at any fleet size
//! (see the parent module's docs).

use ttdp_api::driver::v1alpha1::MAX_NODE_MESSAGE_CHARS;
use ttdp_api::{NodeState, NodeStatus};

use super::NodeEntries;

/// Matched nodes up to which every node has an entry in `status.nodes` (unless the entries
/// pass [`NODE_ENTRIES_BYTES`]).
pub const COMPACT_THRESHOLD: usize = 1_000;
/// The most bytes of node entries `status.nodes` holds, at any fleet size: with the conditions,
/// summary and rollout the whole status stays under 256 KiB, far below what the API server and
/// etcd take in one write, and each write (stored, and sent to every watcher) stays cheap.
pub const NODE_ENTRIES_BYTES: usize = 224 * 1024;

/// `message` cut to [`ttdp_api::driver::v1alpha1::MAX_NODE_MESSAGE_CHARS`] characters, the cut
/// shown by an ellipsis (an agent's report or a drain's refusal can be long).
pub(super) fn bounded_message(message: String) -> String {
    match message.char_indices().nth(MAX_NODE_MESSAGE_CHARS - 1) {
        Some((cut, _)) if message.chars().count() > MAX_NODE_MESSAGE_CHARS => {
            format!("{}…", &message[..cut])
        }
        _ => message,
    }
}

/// Whether a large fleet's status lists this node: not Done, and not waiting to start for the
/// rollout's sake (a slot, the pause, a window, the canary, a halt); those are counted.
fn listed_past_threshold(n: &NodeStatus) -> bool {
    n.state != NodeState::Done && !n.is_waiting_to_start()
}

/// The entries to write, in name order: every node up to [`COMPACT_THRESHOLD`], else the nodes
/// [`listed_past_threshold`]; and of those no more than fit in [`NODE_ENTRIES_BYTES`], Failed
/// first, then in flight, then the rest.
pub(super) fn compact(all: &NodeEntries) -> Vec<NodeStatus> {
    listed_entries(all).into_iter().cloned().collect()
}

pub(super) fn listed_entries(all: &NodeEntries) -> Vec<&NodeStatus> {
    let everyone = all.len() <= COMPACT_THRESHOLD;
    let rank = |s: NodeState| match s {
        NodeState::Failed => 0,
        s if s.is_in_flight() => 1,
        NodeState::Done => 3,
        _ => 2,
    };
    let mut kept: Vec<&NodeStatus> = all
        .values()
        .map(|e| &**e)
        .filter(|n| everyone || listed_past_threshold(n))
        .collect();
    let total: usize = kept.iter().map(|n| entry_bytes(n)).sum();
    if total > NODE_ENTRIES_BYTES {
        // a stable sort: within a rank, name order
        kept.sort_by_key(|n| rank(n.state));
        let mut bytes = 0;
        kept.retain(|n| {
            bytes += entry_bytes(n);
            bytes <= NODE_ENTRIES_BYTES
        });
        kept.sort_by(|a, b| a.name.cmp(&b.name));
    }
    kept
}

/// The bytes `n` takes in the status's JSON, with the comma after it.
pub(super) fn entry_bytes(n: &NodeStatus) -> usize {
    /// Counts what is written, keeps nothing.
    struct Counted(usize);
    impl std::io::Write for Counted {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counted = Counted(1);
    // an entry that cannot be written counts as too big to list
    match serde_json::to_writer(&mut counted, n) {
        Ok(()) => counted.0,
        Err(_) => NODE_ENTRIES_BYTES + 1,
    }
}
