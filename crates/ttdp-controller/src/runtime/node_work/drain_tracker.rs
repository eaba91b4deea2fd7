//! Node drains running in the background, one per (policy, node), so a reconcile never blocks on
//! a drain. The reconciler asks for a drain to be running ([`DrainTracker::ensure`]) and reads its
//! progress; a finished drain wakes the policy's reconcile.
//!
//! At most [`MAX_CONCURRENT_DRAINS`] drains run at once; more wait for a slot (their node stays
//! Draining, saying so). Each drain lists its node's pods and evicts them: a 500-node wave draining
//! at once would hold 500 pod lists in memory and send 500 bursts of requests together.
//!
//! Nothing here is durable, and nothing needs to be: after a controller restart a node recorded
//! as Draining simply drains again (ttdp-drain lists the node's pods afresh: pods already evicted
//! are gone, the cordon keeps new ones away), with the deadline counted from when the node entered
//! Draining.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::Client;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tracing::{info, warn};
use ttdp_drain::{
    CompletionWait, DaemonSetsSeen, DrainError, DrainEventKind, Drainer, EventSink, TwoPassDrain,
    TwoPassReport,
};

use crate::pure::drain_plan::NodeDrain;

use crate::pure::transition::DrainProgress;
use crate::pure::transition::reasons::WAIT_FOR_COMPLETION_TIMEOUT;
use crate::runtime::process::metrics::Metrics;

/// How long to wait before retrying a drain that hit an API error.
const API_ERROR_RETRY: Duration = Duration::from_secs(2);
/// Drains running at once at most.
pub const MAX_CONCURRENT_DRAINS: usize = 32;

type Key = (String, String);

struct Entry {
    progress: Arc<Mutex<DrainProgress>>,
    task: JoinHandle<()>,
}

/// The background drains.
#[derive(Clone)]
pub struct DrainTracker {
    entries: Arc<Mutex<HashMap<Key, Entry>>>,
    slots: Arc<Semaphore>,
    /// The DaemonSets the drains found: a rollout's nodes run the same few, looked up once in
    /// a while rather than once per node.
    daemonsets_seen: DaemonSetsSeen,
}

impl Default for DrainTracker {
    fn default() -> Self {
        Self {
            entries: Arc::default(),
            slots: Arc::new(Semaphore::new(MAX_CONCURRENT_DRAINS)),
            daemonsets_seen: DaemonSetsSeen::default(),
        }
    }
}

impl std::fmt::Debug for DrainTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.lock().len();
        f.debug_struct("DrainTracker").field("drains", &n).finish()
    }
}

fn key(policy: &str, node: &str) -> Key {
    (policy.to_owned(), node.to_owned())
}

fn set(progress: &Mutex<DrainProgress>, value: DrainProgress) {
    *progress.lock().unwrap_or_else(PoisonError::into_inner) = value;
}

/// The pods a successful drain left because `drain.force` is off, each named once; those the
/// device pass selected are marked as using the device.
fn skipped_pods(report: &TwoPassReport) -> Vec<String> {
    let device = &report.device.skipped_without_force;
    report
        .skipped_without_force()
        .into_iter()
        .map(|pod| {
            if device.contains(&pod) {
                format!("{pod} (uses /dev/tenstorrent)")
            } else {
                pod.to_string()
            }
        })
        .collect()
}

/// The failure a drain error means for the node, or `None` for an API error worth retrying.
pub fn failure_of(err: &DrainError) -> Option<DrainProgress> {
    let (reason, hint) = match err {
        DrainError::Timeout { .. } => (
            "DrainTimeout",
            "relax the PodDisruptionBudgets or stop the pods named, or raise upgradePolicy.drain.timeoutSeconds",
        ),
        DrainError::Refused { .. } => (
            "DrainRefused",
            "set upgradePolicy.drain.deleteEmptyDir: true (their emptyDir data is lost), or move those pods away",
        ),
        DrainError::Failed { .. } => (
            "DrainFailed",
            "see the errors named; the node is retried with back-off",
        ),
        _ => return None,
    };
    Some(DrainProgress::Failed {
        reason: reason.to_owned(),
        message: format!("{err}; {hint}"),
    })
}

/// Keeps the drain's progress message up to date from its events; a blocked eviction also wakes
/// the policy, so the status can say so.
fn progress_sink(
    progress: Arc<Mutex<DrainProgress>>,
    wake: Arc<dyn Fn() + Send + Sync>,
) -> EventSink {
    EventSink::new(move |event| {
        let message = match &event.kind {
            DrainEventKind::PassStarted { pass } => format!("{pass} pass"),
            DrainEventKind::Planned { decisions } => {
                format!("{} pods on the node classified", decisions.len())
            }
            DrainEventKind::WaitingForCompletion { running, waited } if !running.is_empty() => {
                let names: Vec<String> = running.iter().take(5).map(ToString::to_string).collect();
                let more = running.len().saturating_sub(names.len());
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                wake();
                format!(
                    "waiting for {} pods to finish before draining ({}s so far): {}{more}",
                    running.len(),
                    waited.as_secs(),
                    names.join(", ")
                )
            }
            DrainEventKind::EvictionBlocked { pod, budget, .. } => {
                let by = budget
                    .as_ref()
                    .map(|b| format!("PodDisruptionBudget {}/{}", b.namespace, b.name))
                    .unwrap_or_else(|| "a PodDisruptionBudget".into());
                wake();
                format!("eviction of {pod} blocked by {by}; retrying")
            }
            _ => return,
        };
        set(&progress, DrainProgress::Running { message });
    })
}

/// One of the drain slots, saying so in the progress while all are taken (None: the tracker
/// is gone).
async fn drain_slot(
    slots: Arc<Semaphore>,
    progress: &Mutex<DrainProgress>,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return Some(slot);
    }
    let message = format!("waiting for a drain slot ({MAX_CONCURRENT_DRAINS} nodes drain at once)");
    set(progress, DrainProgress::Running { message });
    slots.acquire_owned().await.ok()
}

/// Waits for the node's jobs to finish; returns the failure when the wait fails the node
/// (`onTimeout: Fail`). API errors are retried.
async fn wait_for_jobs(
    drainer: &Drainer,
    node: &str,
    jobs: &CompletionWait,
) -> Option<DrainProgress> {
    loop {
        match drainer.wait_for_completion(node, jobs).await {
            Ok(running) if running.is_empty() => return None,
            Ok(running) => {
                info!(node = %node, still_running = running.len(), "waited for the jobs until the timeout; draining");
                return None;
            }
            Err(err @ DrainError::CompletionTimeout { .. }) => {
                warn!(node = %node, error = %err, "the jobs did not finish in time");
                return Some(DrainProgress::Failed {
                    reason: WAIT_FOR_COMPLETION_TIMEOUT.to_owned(),
                    message: format!(
                        "{err}; the node stays cordoned: let the jobs finish, then run kubectl tt driver retry, or raise upgradePolicy.waitForCompletion.timeoutSeconds"
                    ),
                });
            }
            Err(err) => {
                warn!(node = %node, error = %err, "waiting for the jobs hit an api error; retrying");
                tokio::time::sleep(API_ERROR_RETRY).await;
            }
        }
    }
}

/// Drains until it succeeds or fails for good; API errors are retried.
async fn drain_to_the_end(drainer: &Drainer, node: &str, plan: &TwoPassDrain) -> DrainProgress {
    loop {
        match drainer.drain_two_pass(node, plan).await {
            Ok(report) => {
                let evicted = report.device.evicted.len()
                    + report.full_node.as_ref().map_or(0, |r| r.evicted.len());
                info!(node = %node, evicted, "node drained");
                return DrainProgress::Succeeded {
                    skipped: skipped_pods(&report),
                };
            }
            Err(err) => match failure_of(&err) {
                Some(failed) => {
                    warn!(node = %node, error = %err, "drain failed");
                    return failed;
                }
                None => {
                    warn!(node = %node, error = %err, "drain hit an api error; retrying");
                    tokio::time::sleep(API_ERROR_RETRY).await;
                }
            },
        }
    }
}

impl DrainTracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The progress of every drain of `policy`, by node (one lock for a whole reconcile).
    pub fn progress_of(&self, policy: &str) -> HashMap<String, DrainProgress> {
        self.lock()
            .iter()
            .filter(|((p, _), _)| p == policy)
            .map(|((_, node), e)| {
                let progress = e.progress.lock().unwrap_or_else(PoisonError::into_inner);
                (node.clone(), progress.clone())
            })
            .collect()
    }

    /// Starts a drain of `node` with `plan` unless one is running or finished. `wake` is called
    /// when it finishes (and when an eviction is blocked, so the status can say so).
    pub fn ensure(
        &self,
        client: &Client,
        policy: &str,
        node: &str,
        drain: NodeDrain,
        metrics: Arc<Metrics>,
        wake: Arc<dyn Fn() + Send + Sync>,
    ) {
        let mut entries = self.lock();
        let k = key(policy, node);
        if entries.contains_key(&k) {
            return;
        }
        let progress = Arc::new(Mutex::new(DrainProgress::Running {
            message: "draining".into(),
        }));
        let sink = progress_sink(progress.clone(), wake.clone());
        let drainer = Drainer::new(client.clone())
            .with_events(sink)
            .with_daemonsets_seen(self.daemonsets_seen.clone());
        let node_name = node.to_owned();
        let task_progress = progress.clone();
        let slots = self.slots.clone();
        let NodeDrain {
            jobs,
            passes: mut plan,
        } = drain;
        let task = tokio::spawn(async move {
            // The jobs are waited for before a drain slot is taken: a wait may last hours.
            if let Some(jobs) = &jobs
                && let Some(failed) = Box::pin(wait_for_jobs(&drainer, &node_name, jobs)).await
            {
                set(&task_progress, failed);
                wake();
                return;
            }
            let deadline = plan.options.timeout.map(|t| Instant::now() + t);
            let Some(_slot) = drain_slot(slots, &task_progress).await else {
                return;
            };
            // The wait for a slot counts against the drain's timeout.
            if let Some(deadline) = deadline {
                plan.options.timeout = Some(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_secs(1)),
                );
            }
            // Boxed: a task waiting for a slot then holds a pointer instead of room for the
            // whole drain's state, and a wide wave has many such tasks.
            let outcome = Box::pin(drain_to_the_end(&drainer, &node_name, &plan)).await;
            let counters = drainer.counters();
            metrics.record_drain(counters.evictions, counters.budget_blocks);
            set(&task_progress, outcome);
            wake();
        });
        entries.insert(k, Entry { progress, task });
    }

    /// Stops and forgets every drain of `policy` whose node `keep` rejects.
    pub fn retain(&self, policy: &str, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|(p, n), e| {
            let stay = p != policy || keep(n);
            if !stay {
                e.task.abort();
            }
            stay
        });
    }
}
