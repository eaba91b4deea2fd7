//! Node steps told on a policy at fleet scale. A rollout takes each node through five steps, so
//! an Event apiece on a policy of thousands of nodes is tens of thousands of writes competing
//! with the node patches for the API server, and a `kubectl describe` nobody can read. In each
//! window of [`WINDOW`], a policy's first [`TOLD_PER_WINDOW`] routine steps are told one by one;
//! the rest are counted and told in one summary Event when the window ends. Failures are always
//! told on their own, and so is every Event on a node itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use ttdp_api::NodeState;

/// How long a window lasts.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Routine steps told one by one on a policy in each window.
pub const TOLD_PER_WINDOW: u32 = 20;
/// The reason of the summary Event.
pub const NODES_PROGRESSED: &str = "NodesProgressed";
/// Nodes named in a summary (a few, so that a reader has somewhere to start).
const NODES_NAMED: usize = 3;

/// One policy's steps in the current window.
#[derive(Debug, Default)]
pub struct StepTally {
    told: u32,
    counted: BTreeMap<NodeState, u32>,
    named: Vec<String>,
}

impl StepTally {
    /// Whether `node`'s step into `to` is told on its own; else it is counted for the summary.
    pub fn admit(&mut self, node: &str, to: NodeState) -> bool {
        if self.told < TOLD_PER_WINDOW {
            self.told += 1;
            return true;
        }
        *self.counted.entry(to).or_default() += 1;
        if self.named.len() < NODES_NAMED && !self.named.iter().any(|n| n == node) {
            self.named.push(node.to_owned());
        }
        false
    }

    /// Ends the window: the summary of the steps counted in it, if any.
    pub fn end_window(&mut self) -> Option<String> {
        let ended = std::mem::take(self);
        let total: u32 = ended.counted.values().sum();
        if total == 0 {
            return None;
        }
        let mut note = format!(
            "{total} more node steps in the last {} s, counted rather than told one by one:",
            WINDOW.as_secs()
        );
        let by_state: Vec<String> = (ended.counted.iter())
            .map(|(state, n)| format!(" {n} {state}"))
            .collect();
        note.push_str(&by_state.join(","));
        let _ = write!(note, " (among them {})", ended.named.join(", "));
        Some(note)
    }

    /// Whether nothing happened in this window (a policy's tally can be dropped).
    pub fn is_idle(&self) -> bool {
        self.told == 0 && self.counted.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeState::*;

    #[test]
    fn past_the_window_s_share_steps_are_counted_then_summed_up_once() {
        let mut tally = StepTally::default();
        let told = (0..TOLD_PER_WINDOW + 5)
            .filter(|i| tally.admit(&format!("tt-{i}"), if i % 2 == 0 { Draining } else { Done }))
            .count();
        assert_eq!(told, TOLD_PER_WINDOW as usize);
        assert_eq!(
            tally.end_window().as_deref(),
            Some(
                "5 more node steps in the last 10 s, counted rather than told one by one: \
                 3 Draining, 2 Done (among them tt-20, tt-21, tt-22)"
            )
        );
        assert!(tally.is_idle(), "a new window");
        assert_eq!(tally.end_window(), None, "nothing counted, nothing told");
        assert!(tally.admit("tt-0", Cordoning), "the new window tells again");
    }
}
