//! One writer per policy keeps the policy's status, a view of what the controller decided, up
//! to date without holding up any action: a round hands over the status it decided and goes on
//! acting; the writer writes the latest one it was handed, at once when it has not written for
//! [`STATUS_INTERVAL`] (or when the change is urgent: a node Failed, the conditions or the
//! rollout changed), else at the end of that interval, so a fast fleet's changes are coalesced
//! into about one write a second. A write that fails is tried again with back-off, with
//! whatever is newest by then.
//!
//! What makes this safe: each node's upgrade record is written before any action on it
//! ([`crate::runtime::node_work::act`]), so a view that lags, or a write that was lost, loses
//! nothing a restart needs. The view does not run ahead of the records either: a write waits
//! (briefly, [`RECORDS_WAIT`] at most) for the tasks of the nodes whose entries it changes, which
//! write each node's record first, so a policy shown Ready has no node left carrying its record. Only `status.rollout` (the canary, the soak, the applied target),
//! which reconciles read back before acting, is written before its round acts
//! ([`Ticket::written`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::{Client, ResourceExt};
use tokio::sync::{Notify, watch};
use tracing::{debug, warn};
use ttdp_api::{NodeStatus, TenstorrentDriverPolicy};

use crate::error::{Error, error_chain};
use crate::pure::status::{BuiltStatus, NodeEntries};
use crate::runtime::node_work::node_tasks::NodeTasks;
use crate::runtime::writes::status_writer::{self, RecordedStatus};

/// The least time between two writes of a policy's status that are not urgent.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// The first wait after a failed write; it doubles up to [`RETRY_MAX`].
const RETRY_BASE: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);
/// The longest a write waits for the node tasks of the entries it changes.
const RECORDS_WAIT: Duration = Duration::from_millis(500);
/// How often it looks whether they are done.
const RECORDS_POLL: Duration = Duration::from_millis(5);
/// How many of its own writes' `resourceVersion`s a writer remembers: a policy read at one of
/// them shows what the writer wrote, not someone else's change.
const OWN_VERSIONS: usize = 64;

/// The status writers, one per policy (by uid).
pub struct StatusViews {
    writers: Mutex<HashMap<String, Arc<Writer>>>,
    /// The status each policy last decided (by uid), written or on its way.
    decided: Mutex<HashMap<String, Arc<RecordedStatus>>>,
    /// The node tasks, which write each node's record before its actions.
    tasks: NodeTasks,
}

impl std::fmt::Debug for StatusViews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusViews").finish_non_exhaustive()
    }
}

/// What a round handed over.
struct Submitted {
    policy: Arc<TenstorrentDriverPolicy>,
    decided: Arc<RecordedStatus>,
    urgent: bool,
    seq: u64,
}

/// One policy's writer: the newest status handed over, and how far writing got.
struct Writer {
    next: Mutex<Option<Submitted>>,
    seq: Mutex<u64>,
    wake: Notify,
    /// The last handed-over status tried, and whether it was written (else why not).
    done: watch::Sender<(u64, Result<(), String>)>,
    /// The policy is gone: the writer ends.
    closed: AtomicBool,
}

/// A handed-over status, to wait for its write when it must land before an action.
pub struct Ticket {
    policy: String,
    seq: u64,
    done: watch::Receiver<(u64, Result<(), String>)>,
}

impl Ticket {
    /// Waits until this status (or a newer one) was written; the write's error if it failed.
    pub async fn written(mut self) -> Result<(), Error> {
        let result = self.done.wait_for(|(seq, _)| *seq >= self.seq).await;
        match result.as_deref() {
            Ok((_, Ok(()))) => Ok(()),
            Ok((_, Err(message))) => Err(Error::StatusNotWritten {
                policy: self.policy,
                message: message.clone(),
            }),
            Err(_) => Err(Error::StatusNotWritten {
                policy: self.policy,
                message: "the status writer stopped".into(),
            }),
        }
    }
}

impl StatusViews {
    /// No writer yet; each write waits for the records `tasks` are writing.
    pub fn new(tasks: NodeTasks) -> Self {
        Self {
            writers: Mutex::default(),
            decided: Mutex::default(),
            tasks,
        }
    }

    /// The status last decided for the policy with this uid.
    pub fn decided(&self, uid: &str) -> Option<Arc<RecordedStatus>> {
        lock(&self.decided).get(uid).cloned()
    }

    /// Hands `decided` over to `policy`'s writer (started on first use); `urgent`: written
    /// without waiting for the interval.
    pub fn submit(
        &self,
        client: &Client,
        policy: &Arc<TenstorrentDriverPolicy>,
        decided: Arc<RecordedStatus>,
        urgent: bool,
    ) -> Ticket {
        let uid = policy.uid().unwrap_or_default();
        lock(&self.decided).insert(uid.clone(), decided.clone());
        let writer = {
            let mut writers = lock(&self.writers);
            writers
                .entry(uid)
                .or_insert_with(|| Writer::start(client.clone(), self.tasks.clone()))
                .clone()
        };
        let seq = {
            let mut seq = lock(&writer.seq);
            *seq += 1;
            *seq
        };
        {
            let mut next = lock(&writer.next);
            let urgent = urgent || next.as_ref().is_some_and(|n| n.urgent);
            *next = Some(Submitted {
                policy: policy.clone(),
                decided,
                urgent,
                seq,
            });
        }
        writer.wake.notify_one();
        Ticket {
            policy: policy.name_any(),
            seq,
            done: writer.done.subscribe(),
        }
    }

    /// Stops the writer of a deleted policy.
    pub fn forget(&self, uid: &str) {
        lock(&self.decided).remove(uid);
        if let Some(w) = lock(&self.writers).remove(uid) {
            w.closed.store(true, Ordering::Relaxed);
            w.wake.notify_one();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Writer {
    fn start(client: Client, tasks: NodeTasks) -> Arc<Self> {
        let writer = Arc::new(Self {
            next: Mutex::new(None),
            seq: Mutex::new(0),
            wake: Notify::new(),
            done: watch::Sender::new((0, Ok(()))),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(run(writer.clone(), client, tasks));
        writer
    }
}

/// What the writer remembers between writes.
#[derive(Default)]
struct Memory {
    last: Option<RecordedStatus>,
    own_versions: VecDeque<String>,
    failures: u32,
}

async fn run(w: Arc<Writer>, client: Client, tasks: NodeTasks) {
    let mut memory = Memory::default();
    loop {
        // Made before looking, so a hand-over in between is not missed.
        let notified = w.wake.notified();
        if w.closed.load(Ordering::Relaxed) {
            return;
        }
        let urgent = lock(&w.next).as_ref().map(|n| n.urgent);
        let Some(urgent) = urgent else {
            notified.await;
            continue;
        };
        if let Some(due) = memory.next_write_at(urgent) {
            tokio::time::sleep_until(due.into()).await;
        }
        records_landed(&w, &tasks, &memory).await;
        write_latest(&w, &client, &mut memory).await;
    }
}

impl Memory {
    /// When the next write may start; None: now.
    fn next_write_at(&self, urgent: bool) -> Option<Instant> {
        let last = self.last.as_ref()?;
        let spaced = status_writer::next_write_at(last)?;
        let at = if self.failures > 0 {
            let wait = RETRY_BASE
                .saturating_mul(1 << self.failures.min(6))
                .min(RETRY_MAX);
            last.written_at? + wait
        } else if urgent {
            spaced
        } else {
            spaced.max(last.written_at? + STATUS_INTERVAL)
        };
        (at > Instant::now()).then_some(at)
    }
}

/// Waits, [`RECORDS_WAIT`] at most, until no node whose entry the next write changes has a task
/// still running: the task writes the node's record before anything else.
async fn records_landed(w: &Writer, tasks: &NodeTasks, memory: &Memory) {
    let started = Instant::now();
    while started.elapsed() < RECORDS_WAIT {
        let waiting = {
            let next = lock(&w.next);
            let Some(next) = next.as_ref() else {
                return;
            };
            let policy = next.policy.name_any();
            let before = memory.last.as_ref().map(|l| &l.nodes);
            (next.decided.nodes.iter())
                .any(|(name, e)| entry_changed(before, name, e) && tasks.running(&policy, name))
        };
        if !waiting {
            return;
        }
        tokio::time::sleep(RECORDS_POLL).await;
    }
}

/// Writes the newest status handed over, unless the API already shows it.
async fn write_latest(w: &Writer, client: &Client, memory: &mut Memory) {
    let Some(next) = lock(&w.next).take() else {
        return;
    };
    let started = Instant::now();
    let built = as_built(memory.last.as_ref(), &next.decided);
    let last = memory.last.clone().unwrap_or_default();
    let written = memory.last.as_ref().is_some_and(|l| {
        built.changed.is_empty() && built.same_nodes && l.status == next.decided.status
    });
    let agrees = written && api_agrees(&next.policy, memory);
    let result = if agrees {
        Ok(None)
    } else {
        status_writer::write_status(client, &next.policy, &built, &last).await
    };
    match result {
        Ok(version) => {
            memory.failures = 0;
            if let Some(v) = &version {
                memory.own_versions.push_back(v.clone());
                if memory.own_versions.len() > OWN_VERSIONS {
                    memory.own_versions.pop_front();
                }
            }
            memory.last = Some(RecordedStatus {
                status: next.decided.status.clone(),
                nodes: next.decided.nodes.clone(),
                resource_version: version.or(last.resource_version),
                written_at: if agrees {
                    last.written_at
                } else {
                    Some(started)
                },
            });
            w.done.send_modify(|d| *d = (next.seq, Ok(())));
        }
        Err(e) => {
            warn!(policy = %next.policy.name_any(), error = %error_chain(&e), "status not written; trying again");
            memory.failures += 1;
            if let Some(l) = memory.last.as_mut() {
                l.written_at = Some(started);
            } else {
                memory.last = Some(RecordedStatus {
                    written_at: Some(started),
                    ..RecordedStatus::default()
                });
            }
            w.done
                .send_modify(|d| *d = (next.seq, Err(error_chain(&e))));
            // Tried again with whatever is newest by then.
            let mut slot = lock(&w.next);
            if slot.is_none() {
                *slot = Some(next);
            }
        }
    }
    debug!(took = ?started.elapsed(), "status write");
}

/// The status `decided`, with what changed since `last` was written.
fn as_built(last: Option<&RecordedStatus>, decided: &RecordedStatus) -> BuiltStatus {
    let before = last.map(|l| &l.nodes);
    let changed = (decided.nodes.iter())
        .filter(|(name, entry)| entry_changed(before, name, entry))
        .map(|(name, _)| name.clone())
        .collect();
    BuiltStatus {
        status: decided.status.clone(),
        all_nodes: decided.nodes.clone(),
        changes: Vec::new(),
        changed,
        same_nodes: before.is_some_and(|b| b.keys().eq(decided.nodes.keys())),
    }
}

/// Whether node `name`'s `entry` differs from the one in `before` (the entries last written).
fn entry_changed(before: Option<&NodeEntries>, name: &str, entry: &Arc<NodeStatus>) -> bool {
    before
        .and_then(|b| b.get(name))
        .is_none_or(|e| !Arc::ptr_eq(e, entry) && e != entry)
}

/// Whether the policy as handed over shows what was last written: it is at the version of one
/// of this writer's writes, or its status says the same. Otherwise someone else wrote it (or
/// wiped it), and the write puts it right.
fn api_agrees(policy: &TenstorrentDriverPolicy, memory: &Memory) -> bool {
    let Some(last) = &memory.last else {
        return false;
    };
    policy
        .metadata
        .resource_version
        .as_ref()
        .is_some_and(|v| memory.own_versions.contains(v))
        || policy
            .status
            .as_ref()
            .is_some_and(|s| status_writer::same_apart_from_nodes(s, &last.status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use ttdp_api::TenstorrentDriverPolicyStatus;
    use ttdp_api::driver::v1alpha1::Summary;

    fn status(matched: i32) -> TenstorrentDriverPolicyStatus {
        TenstorrentDriverPolicyStatus {
            summary: Some(Summary {
                matched,
                ..Summary::default()
            }),
            ..TenstorrentDriverPolicyStatus::default()
        }
    }

    fn memory(written_ago: Option<Duration>, failures: u32) -> Memory {
        Memory {
            last: Some(RecordedStatus {
                status: status(3),
                written_at: written_ago.map(|ago| Instant::now() - ago),
                resource_version: Some("42".into()),
                ..RecordedStatus::default()
            }),
            own_versions: VecDeque::from(["41".to_owned(), "42".to_owned()]),
            failures,
        }
    }

    #[test]
    fn an_idle_writer_writes_at_once_a_busy_one_once_a_second() {
        assert_eq!(Memory::default().next_write_at(false), None, "never wrote");
        assert_eq!(
            memory(Some(Duration::from_secs(2)), 0).next_write_at(false),
            None
        );
        let busy = memory(Some(Duration::from_millis(100)), 0);
        let due = busy.next_write_at(false).expect("waits for the interval");
        let wait = due - Instant::now();
        assert!(wait > Duration::from_millis(800) && wait <= Duration::from_millis(900));
        assert_eq!(
            busy.next_write_at(true),
            None,
            "an urgent change goes at once"
        );
    }

    #[test]
    fn a_failed_write_is_tried_again_after_a_growing_wait() {
        let once = memory(Some(Duration::ZERO), 1).next_write_at(true).unwrap();
        let thrice = memory(Some(Duration::ZERO), 3).next_write_at(true).unwrap();
        assert!(once - Instant::now() <= Duration::from_millis(400));
        assert!(thrice - Instant::now() > Duration::from_millis(1_500));
    }

    #[test]
    fn an_unchanged_status_is_rewritten_only_when_someone_else_wrote_it() {
        let policy = |version: &str, status: Option<TenstorrentDriverPolicyStatus>| {
            let spec = serde_json::from_value(json!({"version": "2.8.0", "nodeAffinity": {}}));
            let mut p = TenstorrentDriverPolicy::new("default", spec.unwrap());
            p.metadata.resource_version = Some(version.into());
            p.status = status;
            p
        };
        let m = memory(None, 0);
        // At the version of one of our writes, whatever it shows: no write.
        assert!(api_agrees(&policy("41", Some(status(1))), &m));
        // Another version whose status says the same: no write either.
        assert!(api_agrees(&policy("43", Some(status(3))), &m));
        // Another version with another status, or none: someone else wrote it (or wiped it).
        assert!(!api_agrees(&policy("43", Some(status(1))), &m));
        assert!(!api_agrees(&policy("43", None), &m));
    }

    #[test]
    fn what_changed_is_found_against_what_was_written() {
        use ttdp_api::{NodeState, NodeStatus};
        let entry = |name: &str, state| Arc::new(NodeStatus::new(name, state));
        let written = RecordedStatus {
            nodes: [("a", NodeState::Done), ("b", NodeState::Pending)]
                .into_iter()
                .map(|(n, s)| (Arc::from(n), entry(n, s)))
                .collect(),
            ..RecordedStatus::default()
        };
        let mut decided = written.clone();
        decided
            .nodes
            .insert(Arc::from("b"), entry("b", NodeState::Cordoning));
        let built = as_built(Some(&written), &decided);
        assert_eq!(built.changed, vec![Arc::from("b")]);
        assert!(built.same_nodes);
        let first = as_built(None, &decided);
        assert_eq!(first.changed.len(), 2, "never written: all of it");
        assert!(!first.same_nodes);
    }
}
