//! Where a hand-off's time goes, from the same run's observations and the API server's audit
//! log: each hand-off (the `i`-th agent Ready paired with the `slots + i`-th cordon, as
//! [`crate::figures::slot_pairs`] pairs them) cut at the server's timestamps of the two node
//! patches it takes, the release of the finished node and the cordon of the next:
//!
//! - `ready_to_release_sent`: the agent's Ready to the release received by the server (the
//!   pod's watch event reaching the controller, and the controller's reaction);
//! - `release_at_server`, `cordon_at_server`: the server's own time for each patch;
//! - `release_to_cordon_sent`: the release answered to the next cordon received (the answer
//!   reaching the controller, and what the controller does before it sends the cordon);
//! - `cordon_to_seen`: the cordon answered to the benchmark's node watch seeing it, the
//!   server's watch delivery under the same load, which the controller's pod watch also waits
//!   for in the first part.
//!
//! Beside them, `ready_seen_by_a_watch`: the agent's Ready to the benchmark's own pod watch
//! seeing it, the server's delivery of that event, part of the first part.
//!
//! A part that would be negative (the cordon took a slot freed by an earlier release) counts
//! as zero.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use crate::audit_times::PatchSpan;
use crate::figures::{freshness, slot_pairs, spread};

/// An instant of the benchmark's monotonic clock and the wall-clock time then, to put the
/// benchmark's observations on the audit log's clock.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    pub instant: Instant,
    pub wall: Timestamp,
}

impl WallClock {
    /// The clock now.
    pub fn now() -> Self {
        Self {
            instant: Instant::now(),
            wall: Timestamp::now(),
        }
    }

    /// The wall-clock time of `at`.
    fn wall(&self, at: Instant) -> Timestamp {
        let shift = match at.checked_duration_since(self.instant) {
            Some(after) => SignedDuration::try_from(after),
            None => SignedDuration::try_from(self.instant - at).map(|d| -d),
        };
        (shift.ok())
            .and_then(|s| self.wall.checked_add(s).ok())
            .unwrap_or(self.wall)
    }
}

/// What the run saw, by node: agents Ready (and when a pod watch saw them Ready), and the node
/// watch's releases and cordons.
pub struct Seen<'a> {
    pub ready: &'a BTreeMap<String, Instant>,
    pub ready_seen: &'a BTreeMap<String, Instant>,
    pub released: &'a BTreeMap<String, Instant>,
    pub cordoned: &'a BTreeMap<String, Instant>,
}

/// The five parts of one hand-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Parts([Duration; 5]);

const NAMES: [&str; 5] = [
    "ready_to_release_sent",
    "release_at_server",
    "release_to_cordon_sent",
    "cordon_at_server",
    "cordon_to_seen",
];

/// The spread of each part over the run's hand-offs, as a JSON object keyed by part.
pub fn handoff_path(seen: &Seen, spans: &[PatchSpan], clock: &WallClock, slots: usize) -> Value {
    let parts = pairs(seen, slots)
        .into_iter()
        .filter_map(|(a, b)| parts_of(seen, spans, clock, a, b))
        .collect::<Vec<_>>();
    let mut figures = serde_json::Map::new();
    for (k, name) in NAMES.iter().enumerate() {
        let values = parts.iter().map(|p| p.0[k]).collect();
        figures.insert((*name).to_owned(), spread(values).json());
    }
    let delivered = freshness(seen.ready, seen.ready_seen);
    figures.insert("ready_seen_by_a_watch".to_owned(), spread(delivered).json());
    json!(figures)
}

/// Each freed slot's node paired with the node that took it ([`slot_pairs`]).
fn pairs<'a>(seen: &'a Seen, slots: usize) -> Vec<(&'a str, &'a str)> {
    let named =
        |m: &'a BTreeMap<String, Instant>| m.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    slot_pairs(named(seen.ready), named(seen.cordoned), slots)
        .into_iter()
        .map(|((freed, _), (taken, _))| (freed, taken))
        .collect()
}

/// The parts of the hand-off from `freed`'s Ready to `taken`'s cordon; None when a patch or an
/// observation is missing.
fn parts_of(
    seen: &Seen,
    spans: &[PatchSpan],
    clock: &WallClock,
    freed: &str,
    taken: &str,
) -> Option<Parts> {
    let ready = clock.wall(*seen.ready.get(freed)?);
    let cordon_seen = clock.wall(*seen.cordoned.get(taken)?);
    let release = last_patch_before(spans, freed, clock.wall(*seen.released.get(freed)?))?;
    let cordon = last_patch_before(spans, taken, cordon_seen)?;
    let part = |from: Timestamp, to: Timestamp| {
        Duration::try_from(to.duration_since(from)).unwrap_or(Duration::ZERO)
    };
    Some(Parts([
        part(ready, release.received),
        part(release.received, release.answered),
        part(release.answered, cordon.received),
        part(cordon.received, cordon.answered),
        part(cordon.answered, cordon_seen),
    ]))
}

/// The last patch of `node` the server answered at or before `seen`: the one the watch saw.
fn last_patch_before<'a>(
    spans: &'a [PatchSpan],
    node: &str,
    seen: Timestamp,
) -> Option<&'a PatchSpan> {
    spans
        .iter()
        .filter(|s| s.node == node && s.answered <= seen)
        .max_by_key(|s| s.answered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_off_is_cut_at_the_servers_timestamps_of_its_two_patches() {
        let clock = WallClock::now();
        let at = |ms: u64| clock.instant + Duration::from_millis(ms);
        let wall = |ms: i64| clock.wall + SignedDuration::from_millis(ms);
        let map = |entries: &[(&str, u64)]| -> BTreeMap<String, Instant> {
            entries
                .iter()
                .map(|(n, t)| ((*n).to_owned(), at(*t)))
                .collect()
        };
        let span = |node: &str, received: i64, answered: i64| PatchSpan {
            node: node.to_owned(),
            received: wall(received),
            answered: wall(answered),
        };
        // One slot: a was cordoned at 0 and Ready at 1,000; b takes its slot.
        let ready = map(&[("a", 1_000)]);
        let released = map(&[("a", 1_100)]);
        let cordoned = map(&[("a", 0), ("b", 1_200)]);
        let spans = [
            span("a", -20, -5),
            span("a", 1_030, 1_060),
            span("b", 1_120, 1_150),
            // After the watch saw b cordoned: not the cordon.
            span("b", 1_300, 1_310),
        ];
        let ready_seen = map(&[("a", 1_010)]);
        let seen = Seen {
            ready: &ready,
            ready_seen: &ready_seen,
            released: &released,
            cordoned: &cordoned,
        };
        let figures = handoff_path(&seen, &spans, &clock, 1);
        let p50 = |name: &str| figures[name]["p50"].as_f64().unwrap();
        assert_eq!(p50("ready_seen_by_a_watch"), 10.0);
        assert_eq!(p50("ready_to_release_sent"), 30.0);
        assert_eq!(p50("release_at_server"), 30.0);
        assert_eq!(p50("release_to_cordon_sent"), 60.0);
        assert_eq!(p50("cordon_at_server"), 30.0);
        assert_eq!(p50("cordon_to_seen"), 50.0);
        assert_eq!(figures["cordon_to_seen"]["count"], 1);
    }

    #[test]
    fn a_cordon_sent_before_the_release_answered_counts_zero_between_them() {
        let clock = WallClock::now();
        let at = |ms: u64| clock.instant + Duration::from_millis(ms);
        let wall = |ms: i64| clock.wall + SignedDuration::from_millis(ms);
        let ready = BTreeMap::from([("a".to_owned(), at(100))]);
        let released = BTreeMap::from([("a".to_owned(), at(300))]);
        let cordoned = BTreeMap::from([("x".to_owned(), at(0)), ("b".to_owned(), at(250))]);
        let spans = [
            PatchSpan {
                node: "a".into(),
                received: wall(150),
                answered: wall(260),
            },
            PatchSpan {
                node: "b".into(),
                received: wall(200),
                answered: wall(240),
            },
        ];
        let seen = Seen {
            ready: &ready,
            ready_seen: &BTreeMap::new(),
            released: &released,
            cordoned: &cordoned,
        };
        let figures = handoff_path(&seen, &spans, &clock, 1);
        assert_eq!(figures["release_to_cordon_sent"]["p50"], 0.0);
        assert_eq!(figures["ready_to_release_sent"]["p50"], 50.0);
    }
}
