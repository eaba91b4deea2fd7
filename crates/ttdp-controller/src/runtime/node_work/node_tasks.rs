//! Each node's writes run here, in the background: its upgrade record, then its actions (cordon,
//! grant, starting its drain, replacing the agent pod, clearing the retry annotation). With
//! hundreds of nodes in flight, a reconcile that waited for each wave's requests would make every
//! other node's next step (and the hand-off of a freed slot) wait as long. A reconcile decides
//! the step, then hands the node's work to [`NodeTasks::spawn`]; a lift of our cordon stays in
//! the reconcile, whose round hands the freed slot on.
//!
//! One task per (policy, node) at a time, so a node's writes keep their order; at most
//! [`AT_ONCE`] run at once in each [`Lane`], the cordons of hand-offs in their own. A reconcile
//! that finds a node's task still running leaves the node alone ([`NodeTasks::busy`]), and the
//! task wakes the policy when it ends. A failure is kept for the policy's next reconcile
//! ([`NodeTasks::take_failures`]), which fails with it and so backs off as it would have had the
//! action run inline. Nothing here is durable, and nothing needs to be: the step's record is
//! written before its actions, and the next reconcile repeats an action whose effect it does not
//! see.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::error::Error;

/// Node tasks running at once at most, in each [`Lane`].
pub const AT_ONCE: usize = 16;

/// Which slots a task waits for. A wave of hundreds of nodes queues hundreds of writes (records,
/// grants, agent pods replaced); the cordon that starts the next node after a hand-off waits in
/// a lane of its own, not behind them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// A cordon: a node taking a freed slot.
    HandOff,
    /// Everything else.
    Other,
}

type Key = (String, String);

/// Wakes a policy's reconcile.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

struct Running {
    task: JoinHandle<()>,
    /// A reconcile skipped the node while this ran: wake the policy at the end.
    asked_again: Arc<AtomicBool>,
}

#[derive(Default)]
struct Inner {
    running: Mutex<HashMap<Key, Running>>,
    failures: Mutex<HashMap<String, Vec<Error>>>,
}

/// The background node tasks.
#[derive(Clone)]
pub struct NodeTasks {
    inner: Arc<Inner>,
    slots: Arc<Semaphore>,
    hand_off_slots: Arc<Semaphore>,
}

impl Default for NodeTasks {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            slots: Arc::new(Semaphore::new(AT_ONCE)),
            hand_off_slots: Arc::new(Semaphore::new(AT_ONCE)),
        }
    }
}

impl std::fmt::Debug for NodeTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = lock(&self.inner.running).len();
        f.debug_struct("NodeTasks").field("running", &n).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn key(policy: &str, node: &str) -> Key {
    (policy.to_owned(), node.to_owned())
}

impl NodeTasks {
    /// Whether a task of `policy` for `node` is running; if so, it wakes the policy when it ends.
    pub fn busy(&self, policy: &str, node: &str) -> bool {
        match lock(&self.inner.running).get(&key(policy, node)) {
            Some(r) => {
                r.asked_again.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Whether a task of `policy` for `node` is running (without asking it to wake anyone).
    pub fn running(&self, policy: &str, node: &str) -> bool {
        lock(&self.inner.running).contains_key(&key(policy, node))
    }

    /// Runs the future `work` makes, once a slot of `lane` is free, for `node` unless a task for
    /// it is running. `wake` is called when it fails, or ends after a reconcile found it busy.
    /// (The future is made, and boxed, only in its slot: a wave's hundreds of waiting tasks then
    /// hold only what `work` captured, not request futures of kilobytes each.)
    pub fn spawn<W, F>(&self, lane: Lane, policy: &str, node: &str, work: W, wake: Wake)
    where
        W: FnOnce() -> F + Send + 'static,
        F: Future<Output = Result<(), Error>> + Send + 'static,
    {
        let k = key(policy, node);
        let mut running = lock(&self.inner.running);
        if running.contains_key(&k) {
            return;
        }
        let asked_again = Arc::new(AtomicBool::new(false));
        let asked = asked_again.clone();
        let inner = self.inner.clone();
        let slots = match lane {
            Lane::HandOff => self.hand_off_slots.clone(),
            Lane::Other => self.slots.clone(),
        };
        let task_key = k.clone();
        let task = tokio::spawn(async move {
            let result = match slots.acquire_owned().await {
                Ok(_slot) => Box::pin(work()).await,
                Err(_) => Ok(()),
            };
            lock(&inner.running).remove(&task_key);
            let failed = result.is_err();
            if let Err(e) = result {
                lock(&inner.failures).entry(task_key.0).or_default().push(e);
            }
            if failed || asked.load(Ordering::Relaxed) {
                wake();
            }
        });
        running.insert(k, Running { task, asked_again });
    }

    /// Whether `policy` has task failures not taken yet.
    pub fn has_failures(&self, policy: &str) -> bool {
        lock(&self.inner.failures)
            .get(policy)
            .is_some_and(|f| !f.is_empty())
    }

    /// The failures of `policy`'s tasks since the last call.
    pub fn take_failures(&self, policy: &str) -> Vec<Error> {
        lock(&self.inner.failures)
            .remove(policy)
            .unwrap_or_default()
    }

    /// Waits for `policy`'s task for `node` to end, if one runs; returns whether one ran. A node
    /// released after this sees every write its task made (a grant landing after the release
    /// would leave a released node granted).
    pub async fn settle_node(&self, policy: &str, node: &str) -> bool {
        let running = lock(&self.inner.running).remove(&key(policy, node));
        match running {
            Some(r) => {
                let _ = r.task.await;
                true
            }
            None => false,
        }
    }

    /// Waits for `policy`'s running tasks to end (a deleted policy's nodes are released only
    /// after, so no cordon lands behind the release) and forgets its failures.
    pub async fn settle(&self, policy: &str) {
        let tasks: Vec<JoinHandle<()>> = {
            let mut running = lock(&self.inner.running);
            let keys: Vec<Key> = running
                .keys()
                .filter(|(p, _)| p == policy)
                .cloned()
                .collect();
            keys.iter()
                .filter_map(|k| running.remove(k))
                .map(|r| r.task)
                .collect()
        };
        for task in tasks {
            let _ = task.await;
        }
        lock(&self.inner.failures).remove(policy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use tokio::sync::oneshot;

    fn counter() -> (Arc<AtomicUsize>, Wake) {
        let n = Arc::new(AtomicUsize::new(0));
        let c = n.clone();
        (
            n,
            Arc::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            }),
        )
    }

    async fn until(cond: impl Fn() -> bool) {
        for _ in 0..200 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("condition not reached");
    }

    #[tokio::test]
    async fn a_cordon_does_not_wait_behind_a_full_lane_of_other_writes() {
        let tasks = NodeTasks::default();
        let (_, wake) = counter();
        let (hold, held) = tokio::sync::watch::channel(false);
        for i in 0..AT_ONCE + 4 {
            let mut held = held.clone();
            let work = move || async move {
                let _ = held.wait_for(|released| *released).await;
                Ok(())
            };
            tasks.spawn(Lane::Other, "p", &format!("busy-{i}"), work, wake.clone());
        }
        let cordoned = Arc::new(AtomicUsize::new(0));
        let c = cordoned.clone();
        let cordon = move || async move {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        tasks.spawn(Lane::HandOff, "p", "next", cordon, wake.clone());
        until(|| cordoned.load(Ordering::SeqCst) == 1).await;
        assert!(tasks.running("p", "busy-0"), "the other lane is still full");
        let _ = hold.send(true);
        until(|| !tasks.running("p", &format!("busy-{}", AT_ONCE + 3))).await;
    }

    #[tokio::test]
    async fn one_task_per_node_and_a_skipped_reconcile_is_woken_at_its_end() {
        let tasks = NodeTasks::default();
        let (wakes, wake) = counter();
        let (release, wait) = oneshot::channel::<()>();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        tasks.spawn(
            Lane::Other,
            "p",
            "n1",
            move || async move {
                let _ = wait.await;
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
            wake.clone(),
        );
        let r = ran.clone();
        tasks.spawn(
            Lane::Other,
            "p",
            "n1",
            move || async move {
                r.fetch_add(10, Ordering::SeqCst);
                Ok(())
            },
            wake.clone(),
        );
        assert!(tasks.busy("p", "n1"));
        assert!(!tasks.busy("p", "n2") && !tasks.busy("q", "n1"));
        let _ = release.send(());
        until(|| wakes.load(Ordering::SeqCst) == 1).await;
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "the second spawn was ignored"
        );
        assert!(!tasks.busy("p", "n1"));
        assert!(tasks.take_failures("p").is_empty());
    }

    #[tokio::test]
    async fn a_failure_wakes_the_policy_and_is_taken_once() {
        let tasks = NodeTasks::default();
        let (wakes, wake) = counter();
        tasks.spawn(
            Lane::Other,
            "p",
            "n1",
            || async { Err(Error::NotSynced { policy: "p".into() }) },
            wake.clone(),
        );
        until(|| wakes.load(Ordering::SeqCst) == 1).await;
        assert_eq!(tasks.take_failures("p").len(), 1);
        assert!(tasks.take_failures("p").is_empty());
        // A task that succeeds without having been asked for again wakes nobody.
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        tasks.spawn(
            Lane::Other,
            "p",
            "n2",
            move || async move {
                r.store(true, Ordering::SeqCst);
                Ok(())
            },
            wake,
        );
        until(|| ran.load(Ordering::SeqCst)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn settle_waits_for_the_policys_running_tasks() {
        let tasks = NodeTasks::default();
        let (_, wake) = counter();
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        tasks.spawn(
            Lane::Other,
            "p",
            "n1",
            move || async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                d.store(true, Ordering::SeqCst);
                Ok(())
            },
            wake,
        );
        tasks.settle("p").await;
        assert!(done.load(Ordering::SeqCst));
        assert!(!tasks.busy("p", "n1"));
    }

    #[tokio::test]
    async fn settle_node_waits_for_that_nodes_task_only() {
        let tasks = NodeTasks::default();
        let (_, wake) = counter();
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        tasks.spawn(
            Lane::Other,
            "p",
            "n1",
            move || async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                d.store(true, Ordering::SeqCst);
                Ok(())
            },
            wake.clone(),
        );
        let (release, wait) = oneshot::channel::<()>();
        tasks.spawn(
            Lane::Other,
            "p",
            "n2",
            move || async move {
                let _ = wait.await;
                Ok(())
            },
            wake,
        );
        assert!(tasks.settle_node("p", "n1").await, "a task ran");
        assert!(done.load(Ordering::SeqCst), "its writes are done");
        assert!(tasks.busy("p", "n2"), "another node's task is left running");
        assert!(
            !tasks.settle_node("p", "n3").await,
            "no task, nothing to wait for"
        );
        let _ = release.send(());
    }
}
