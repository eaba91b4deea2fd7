//! [`BudgetWatches`]: waiting until a PodDisruptionBudget allows a disruption, shared by every
//! blocked eviction of one drain.
//!
//! After a 429, an eviction waits here instead of sleeping a fixed back-off: the first waiter
//! on a budget starts one watch of that budget (a `LIST` and a `WATCH` with a
//! `metadata.name` field selector), and every later waiter shares it. Each time the budget's
//! status changes and allows `n` disruptions (`status.disruptionsAllowed`, trusted only when
//! `status.observedGeneration` matches the budget's generation), at most `n` waiters are let
//! through to retry, so a budget that allows one disruption does not wake five hundred
//! requests. The caller's back-off stays as an upper bound: a waiter always retries by then,
//! so a watch that cannot be opened (no `watch` permission, say) only makes the drain as slow
//! as a timer-driven one.
//!
//! The watches end when the [`BudgetWatches`] is dropped, at the end of the drain.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
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

/// How many waiters one state of the budget has let through.
#[derive(Debug, Default)]
struct Turns {
    version: u64,
    taken: i32,
}

#[derive(Debug)]
struct WatchedBudget {
    seen: watch::Receiver<Seen>,
    turns: Mutex<Turns>,
    task: JoinHandle<()>,
}

impl Drop for WatchedBudget {
    fn drop(&mut self) {
        self.task.abort();
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
        let task = tokio::spawn(async move {
            let events = watcher::watcher(api, config).default_backoff();
            futures::pin_mut!(events);
            let mut version = 0u64;
            let mut listed_any = false;
            let mut publish = |pdb: Option<PodDisruptionBudget>| {
                version += 1;
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
            turns: Mutex::default(),
            task,
        }
    }

    fn turns(&self) -> MutexGuard<'_, Turns> {
        self.turns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `seen` lets one more waiter through.
    fn take_turn(&self, seen: &Seen) -> bool {
        let Some(allowed) = seen.allowed else {
            return true;
        };
        let mut turns = self.turns();
        if turns.version != seen.version {
            *turns = Turns {
                version: seen.version,
                taken: 0,
            };
        }
        if turns.taken < allowed {
            turns.taken += 1;
            true
        } else {
            false
        }
    }
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

    /// Wait until `budget` allows a disruption this caller may try, or `at_most`, whichever
    /// comes first. Returns whether the budget let it through (`false`: the time ran out).
    ///
    /// `last_turn` is the caller's own memory across calls: a state of the budget that let
    /// the caller through once does not let it through again, so a retry refused while the
    /// watch lags behind the server waits for the next state instead of spinning.
    pub async fn wait_until_allows(
        &self,
        budget: &ObjectKey,
        last_turn: &mut u64,
        at_most: Duration,
    ) -> bool {
        let watched = self.watched(budget);
        let mut seen = watched.seen.clone();
        let deadline = Instant::now() + at_most;
        loop {
            {
                let current = seen.borrow_and_update().clone();
                if current.version > *last_turn && watched.take_turn(&current) {
                    *last_turn = current.version;
                    return true;
                }
            }
            tokio::select! {
                changed = seen.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep_until(deadline).await;
                        return false;
                    }
                }
                () = tokio::time::sleep_until(deadline) => return false,
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

    #[tokio::test]
    async fn each_state_lets_through_as_many_waiters_as_it_allows() {
        let (tx, seen) = watch::channel(Seen::default());
        let watched = WatchedBudget {
            seen,
            turns: Mutex::default(),
            task: tokio::spawn(async {}),
        };
        let two = Seen {
            version: 1,
            allowed: Some(2),
            pdb: None,
        };
        assert!(watched.take_turn(&two));
        assert!(watched.take_turn(&two));
        assert!(!watched.take_turn(&two));
        let next = Seen {
            version: 2,
            allowed: Some(1),
            pdb: None,
        };
        assert!(watched.take_turn(&next));
        assert!(!watched.take_turn(&next));
        let gone = Seen {
            version: 3,
            allowed: None,
            pdb: None,
        };
        assert!((0..10).all(|_| watched.take_turn(&gone)));
        drop(tx);
    }
}
