//! [`BudgetWatches`]: waiting until a PodDisruptionBudget allows a disruption, shared by every
//! blocked eviction of one drain.
//!
//! After a 429, an eviction waits here instead of sleeping a fixed back-off: the first waiter
//! on a budget starts one watch of that budget (a `LIST` and a `WATCH` with a
//! `metadata.name` field selector), and every later waiter shares it. A state of the budget
//! that allows `n` disruptions (`status.disruptionsAllowed`, trusted only when
//! `status.observedGeneration` matches the budget's generation) lets waiters through until the
//! turns not yet reflected in it reach `n`. A turn is reflected once the API server has
//! recorded its eviction in `status.disruptedPods` (the same write that lowers
//! `disruptionsAllowed`); a refused retry gives its turn back. So a budget that allows one
//! disruption does not wake five hundred requests, and a state already spent by retries still
//! in flight lets no more through. The caller's back-off stays as an upper bound: a waiter
//! always retries by then, so a watch that cannot be opened (no `watch` permission, say) only
//! makes the drain as slow as a timer-driven one.
//!
//! The watches end when the [`BudgetWatches`] is dropped, at the end of the drain.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::budget::selects;
use crate::pod_ref::ObjectKey;

/// The budgets one drain waits on, each watched at most once.
pub(crate) struct BudgetWatches {
    client: Client,
    budgets: Mutex<HashMap<ObjectKey, Arc<WatchedBudget>>>,
}

impl std::fmt::Debug for BudgetWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetWatches").finish_non_exhaustive()
    }
}

/// The latest state of one budget as its watch saw it.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// Counts the states seen, from 1; 0 before the first.
    version: u64,
    /// How many disruptions this state allows; `None` when the budget is gone (no budget, no
    /// limit).
    allowed: Option<i32>,
    /// The budget as last seen.
    pdb: Option<Arc<PodDisruptionBudget>>,
}

/// How long a granted eviction counts against the budget's states without showing in its
/// `status.disruptedPods`: an unhealthy pod's eviction, for one, is never recorded there.
const UNREFLECTED_FOR: Duration = Duration::from_secs(2);

/// The turns given out and not yet reflected in the budget's status, by pod name, and every
/// pod the watch has seen in `status.disruptedPods`.
#[derive(Debug, Default)]
struct Turns {
    given: HashMap<String, Instant>,
    disrupted: HashSet<String>,
}

impl Turns {
    /// Turns the budget's status does not count yet: granted or accepted evictions whose pod
    /// the status has not listed as disrupted.
    fn unreflected(&mut self, now: Instant) -> i32 {
        let disrupted = &self.disrupted;
        self.given.retain(|pod, at| {
            !disrupted.contains(pod) && now.duration_since(*at) < UNREFLECTED_FOR
        });
        i32::try_from(self.given.len()).unwrap_or(i32::MAX)
    }
}

#[derive(Debug)]
struct WatchedBudget {
    seen: watch::Receiver<Seen>,
    /// Shared with the watch task, which adds the pods it sees disrupted.
    turns: Arc<Mutex<Turns>>,
    /// Woken when a turn is given back, so a waiter may take it on the same state.
    returned: Notify,
    task: JoinHandle<()>,
}

impl Drop for WatchedBudget {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One pod's turn to retry its eviction. Dropped without [`BudgetTurn::accepted`] (the retry
/// was refused or failed), it is given back.
#[derive(Debug)]
pub(crate) struct BudgetTurn {
    budget: Arc<WatchedBudget>,
    pod: String,
    accepted: bool,
}

impl BudgetTurn {
    /// The eviction was accepted: the turn counts until the budget's status reflects it.
    pub fn accepted(mut self) {
        self.accepted = true;
    }
}

impl Drop for BudgetTurn {
    fn drop(&mut self) {
        if !self.accepted {
            self.budget.turns().given.remove(&self.pod);
            self.budget.returned.notify_waiters();
        }
    }
}

/// The disruptions a budget's status allows: its `disruptionsAllowed`, or 0 while the
/// disruption controller has not observed its latest generation (the API server refuses every
/// eviction then).
pub(crate) fn disruptions_allowed(pdb: &PodDisruptionBudget) -> i32 {
    let Some(status) = pdb.status.as_ref() else {
        return 0;
    };
    if status.observed_generation.is_some() && status.observed_generation != pdb.metadata.generation
    {
        return 0;
    }
    status.disruptions_allowed.max(0)
}

impl WatchedBudget {
    fn start(client: Client, key: &ObjectKey) -> Self {
        let (tx, seen) = watch::channel(Seen::default());
        let api: Api<PodDisruptionBudget> = Api::namespaced(client, &key.namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", key.name));
        let budget = key.clone();
        let turns = Arc::new(Mutex::new(Turns::default()));
        let disrupted = turns.clone();
        let task = tokio::spawn(async move {
            let events = watcher::watcher(api, config).default_backoff();
            futures::pin_mut!(events);
            let mut version = 0u64;
            let mut listed_any = false;
            let mut publish = |pdb: Option<PodDisruptionBudget>| {
                version += 1;
                let listed = pdb
                    .as_ref()
                    .and_then(|p| p.status.as_ref()?.disrupted_pods.as_ref());
                if let Some(pods) = listed {
                    lock(&disrupted).disrupted.extend(pods.keys().cloned());
                }
                let allowed = pdb.as_ref().map(disruptions_allowed);
                let pdb = pdb.map(Arc::new);
                tx.send_replace(Seen {
                    version,
                    allowed,
                    pdb,
                });
            };
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Init) => listed_any = false,
                    Ok(Event::Apply(pdb) | Event::InitApply(pdb)) => {
                        listed_any = true;
                        publish(Some(pdb));
                    }
                    Ok(Event::InitDone) if !listed_any => publish(None),
                    Ok(Event::InitDone) => {}
                    Ok(Event::Delete(_)) => publish(None),
                    Err(error) => {
                        tracing::debug!(%budget, %error, "cannot watch the disruption budget; blocked evictions fall back to their back-off");
                    }
                }
            }
        });
        Self {
            seen,
            turns,
            returned: Notify::new(),
            task,
        }
    }

    fn turns(&self) -> MutexGuard<'_, Turns> {
        lock(&self.turns)
    }

    /// Whether `seen` lets `pod` through now, counting the turns it does not reflect yet.
    fn take_turn(&self, seen: &Seen, pod: &str) -> bool {
        let Some(allowed) = seen.allowed else {
            return true;
        };
        let now = Instant::now();
        let mut turns = self.turns();
        if turns.unreflected(now) < allowed {
            turns.given.insert(pod.to_owned(), now);
            true
        } else {
            false
        }
    }
}

fn lock(turns: &Mutex<Turns>) -> MutexGuard<'_, Turns> {
    turns.lock().unwrap_or_else(|e| e.into_inner())
}

impl BudgetWatches {
    /// No budget watched yet; watches start on the first wait for each budget.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            budgets: Mutex::default(),
        }
    }

    /// The latest copy of a budget already watched that selects `pod`, if any: the lookup
    /// after a refused eviction then needs no request.
    pub fn watched_budget_of(&self, pod: &Pod) -> Option<PodDisruptionBudget> {
        let budgets = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        budgets.values().find_map(|watched| {
            let seen = watched.seen.borrow();
            seen.pdb.as_deref().filter(|pdb| selects(pdb, pod)).cloned()
        })
    }

    fn watched(&self, budget: &ObjectKey) -> Arc<WatchedBudget> {
        let mut budgets = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        budgets
            .entry(budget.clone())
            .or_insert_with(|| Arc::new(WatchedBudget::start(self.client.clone(), budget)))
            .clone()
    }

    /// Wait until `budget` allows `pod` to retry its eviction, or `at_most`, whichever comes
    /// first. Returns the turn to hold while the retry is made (`None`: the time ran out).
    ///
    /// `last_turn` is the caller's own memory across calls: a state of the budget that let
    /// the caller through once does not let it through again, so a retry refused while the
    /// watch lags behind the server waits for the next state instead of spinning.
    pub async fn wait_until_allows(
        &self,
        budget: &ObjectKey,
        pod: &str,
        last_turn: &mut u64,
        at_most: Duration,
    ) -> Option<BudgetTurn> {
        let watched = self.watched(budget);
        let mut seen = watched.seen.clone();
        let deadline = Instant::now() + at_most;
        loop {
            {
                let current = seen.borrow_and_update().clone();
                if current.version > *last_turn && watched.take_turn(&current, pod) {
                    *last_turn = current.version;
                    return Some(BudgetTurn {
                        budget: watched,
                        pod: pod.to_owned(),
                        accepted: false,
                    });
                }
            }
            tokio::select! {
                changed = seen.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep_until(deadline).await;
                        return None;
                    }
                }
                () = watched.returned.notified() => {}
                () = tokio::time::sleep_until(deadline) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pdb(generation: i64, observed: Option<i64>, allowed: i32) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                generation: Some(generation),
                ..ObjectMeta::default()
            },
            status: Some(PodDisruptionBudgetStatus {
                observed_generation: observed,
                disruptions_allowed: allowed,
                ..PodDisruptionBudgetStatus::default()
            }),
            ..PodDisruptionBudget::default()
        }
    }

    #[test]
    fn a_status_of_an_older_generation_allows_nothing() {
        assert_eq!(disruptions_allowed(&pdb(2, Some(2), 3)), 3);
        assert_eq!(disruptions_allowed(&pdb(3, Some(2), 3)), 0);
        assert_eq!(disruptions_allowed(&PodDisruptionBudget::default()), 0);
    }

    fn state(version: u64, allowed: Option<i32>) -> Seen {
        Seen {
            version,
            allowed,
            pdb: None,
        }
    }

    #[tokio::test]
    async fn a_state_lets_through_only_what_turns_in_flight_have_not_spent() {
        let (tx, seen) = watch::channel(Seen::default());
        let watched = Arc::new(WatchedBudget {
            seen,
            turns: Arc::default(),
            returned: Notify::new(),
            task: tokio::spawn(async {}),
        });
        let two = state(1, Some(2));
        assert!(watched.take_turn(&two, "a"));
        assert!(watched.take_turn(&two, "b"));
        assert!(!watched.take_turn(&two, "c"));
        // a's eviction was accepted: the server lowered the budget to 1 and listed a. b's retry
        // is still in flight and will spend that 1, so nobody else goes.
        watched.turns().disrupted.insert("a".into());
        let one = state(2, Some(1));
        assert!(!watched.take_turn(&one, "c"));
        // b's retry was refused: its turn is given back, and c may go on the same state.
        drop(BudgetTurn {
            budget: watched.clone(),
            pod: "b".into(),
            accepted: false,
        });
        assert!(watched.take_turn(&one, "c"));
        let gone = state(3, None);
        assert!((0..10).all(|i| watched.take_turn(&gone, &format!("p{i}"))));
        drop(tx);
    }

    #[test]
    fn an_accepted_turn_the_status_never_lists_stops_counting_after_a_while() {
        let mut turns = Turns::default();
        let now = Instant::now();
        turns.given.insert("unhealthy".into(), now);
        assert_eq!(turns.unreflected(now), 1);
        assert_eq!(turns.unreflected(now + UNREFLECTED_FOR), 0);
    }
}
