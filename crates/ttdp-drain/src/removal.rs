//! Removing pods: eviction (or deletion) requests with bounded concurrency and capped,
//! jittered back-off, and waiting until every removed pod is gone, checked by UID on a watch of
//! the node's pods and on a list of them.
//!
//! All state lives in [`Removals`], outside the future that does the work, so that when a
//! timeout drops the future the caller can still say what each pod was waiting for.

mod request;

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use futures::future::{self, Either};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::budget::HeldDisruption;
use crate::budget_watch::BudgetWatches;
use crate::counters::{Counter, DrainCounters};
use crate::event::{DrainEvent, DrainEventKind, EventSink, Removal};
use crate::node_pods::list_node_pods;
use crate::pod_ref::PodRef;
use crate::report::{StuckPod, StuckReason};

/// How removal requests are made.
#[derive(Clone, Copy)]
pub(crate) struct Settings<'a> {
    pub client: &'a Client,
    pub counters: &'a DrainCounters,
    pub events: Option<&'a EventSink>,
    pub node: &'a str,
    pub grace_period: Option<u32>,
    pub concurrency: usize,
    pub backoff: Backoff,
    pub poll_interval: Duration,
    /// Where evictions a budget blocks wait until it allows them (the back-off is the bound).
    pub budgets: &'a BudgetWatches,
}

impl Settings<'_> {
    fn emit(&self, kind: DrainEventKind) {
        if let Some(sink) = self.events {
            sink.emit(&DrainEvent {
                node: self.node.to_owned(),
                kind,
            });
        }
    }
}

#[derive(Clone, Debug)]
enum PodState {
    NotRequested,
    Blocked(StuckReason),
    Retrying(String),
    Failed(String),
    Accepted(Instant),
    Gone,
}

#[derive(Debug)]
struct Tracked {
    pod: Pod,
    pod_ref: PodRef,
    method: Removal,
    state: PodState,
    /// A removal request of this drain is out: the budget may count the pod as disrupted by it
    /// before the answer comes back.
    in_flight: bool,
    last_seen: Option<Pod>,
}

/// The pods one drain removes and where each one stands.
#[derive(Debug, Default)]
pub(crate) struct Removals {
    tracked: Mutex<Vec<Tracked>>,
    settled: Notify,
}

impl Removals {
    /// Track `pods`, each removed by `method`.
    pub fn new(pods: impl IntoIterator<Item = (Pod, Removal)>) -> Self {
        let tracked = pods
            .into_iter()
            .map(|(pod, method)| Tracked {
                pod_ref: PodRef::of(&pod),
                pod,
                method,
                state: PodState::NotRequested,
                in_flight: false,
                last_seen: None,
            })
            .collect();
        Self {
            tracked: Mutex::new(tracked),
            settled: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Tracked>> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.tracked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_state(&self, index: usize, state: PodState) {
        let mut tracked = self.lock();
        if let Some(t) = tracked.get_mut(index)
            && !matches!(t.state, PodState::Gone)
        {
            t.state = state;
        }
    }

    /// Leaves out of `held` the pods of `namespace` that this drain's own requests removed or
    /// are removing (answered or still out): a budget counts them as disrupted until they are
    /// gone, which holds nothing back from anyone.
    fn drop_removed_here(&self, namespace: &str, held: &mut Vec<HeldDisruption>) {
        let tracked = self.lock();
        held.retain(|h| {
            !tracked.iter().any(|t| {
                (t.in_flight || matches!(t.state, PodState::Accepted(_) | PodState::Gone))
                    && t.pod_ref.namespace == namespace
                    && t.pod_ref.name == h.pod
            })
        });
    }

    fn set_in_flight(&self, index: usize, in_flight: bool) {
        if let Some(t) = self.lock().get_mut(index) {
            t.in_flight = in_flight;
        }
    }

    fn fail(&self, index: usize, error: String) {
        self.set_state(index, PodState::Failed(error));
        self.settled.notify_one();
    }

    /// Mark a pod gone; emits [`DrainEventKind::Gone`] the first time.
    fn mark_gone(&self, index: usize, s: &Settings<'_>) {
        let gone = {
            let mut tracked = self.lock();
            match tracked.get_mut(index) {
                Some(t) if !matches!(t.state, PodState::Gone) => {
                    t.state = PodState::Gone;
                    Some((t.pod_ref.clone(), t.method))
                }
                _ => None,
            }
        };
        if let Some((pod, removal)) = gone {
            s.counters.bump(Counter::PodGone);
            tracing::debug!(node = s.node, %pod, "pod gone");
            s.emit(DrainEventKind::Gone { pod, removal });
            self.settled.notify_one();
        }
    }

    fn all_settled(&self) -> bool {
        self.lock()
            .iter()
            .all(|t| matches!(t.state, PodState::Gone | PodState::Failed(_)))
    }

    fn is_gone(&self, index: usize) -> bool {
        self.lock()
            .get(index)
            .is_none_or(|t| matches!(t.state, PodState::Gone))
    }

    /// Request every removal and wait until every pod is gone or failed.
    pub async fn run(&self, s: &Settings<'_>) {
        let semaphore = Semaphore::new(s.concurrency.max(1));
        let count = self.lock().len();
        let requests =
            future::join_all((0..count).map(|i| self.request_until_accepted(i, s, &semaphore)));
        let waiting = self.wait_until_gone(s);
        futures::pin_mut!(requests, waiting);
        // The waiter ends once every pod is gone or failed; request loops still sleeping in
        // back-off then have nothing left to do.
        if let Either::Left((_, waiting)) = future::select(requests, waiting).await {
            waiting.await;
        }
    }

    /// Waits until every pod is gone or failed: a watch of the node's pods marks a pod gone
    /// as soon as it is deleted, and a list every `poll_interval` catches what the watch does
    /// not see (a pod deleted before the watch began, or a watch that cannot be opened).
    async fn wait_until_gone(&self, s: &Settings<'_>) {
        // A drain with nothing left to wait for opens no watch: in a large rollout most
        // drains remove nothing (the agent's own pods stay).
        if self.all_settled() {
            return;
        }
        let watching = async {
            self.watch_deletions(s).await;
            std::future::pending::<()>().await
        };
        tokio::select! {
            biased;
            () = self.poll_until_gone(s) => {}
            () = watching => {}
        }
    }

    /// Marks each tracked pod gone when the watch of the node's pods sees it deleted, or when
    /// the watch's (re)list does not hold it (it went before the watch began); returns when the
    /// watch fails, leaving the rest to the poll.
    async fn watch_deletions(&self, s: &Settings<'_>) {
        let pods: Api<Pod> = Api::all(s.client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", s.node));
        let events = watcher::watcher(pods, config);
        futures::pin_mut!(events);
        let mut listed = HashSet::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => listed.clear(),
                Ok(watcher::Event::InitApply(pod)) => {
                    listed.insert(PodRef::of(&pod).uid);
                }
                Ok(watcher::Event::InitDone) => {
                    self.mark_gone_unless_listed(|uid| listed.contains(uid), s);
                }
                Ok(watcher::Event::Delete(pod)) => {
                    let uid = PodRef::of(&pod).uid;
                    let index = self.lock().iter().position(|t| t.pod_ref.uid == uid);
                    if let Some(index) = index {
                        self.mark_gone(index, s);
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(node = s.node, %error, "cannot watch the node's pods; listing them instead");
                    return;
                }
            }
        }
    }

    async fn poll_until_gone(&self, s: &Settings<'_>) {
        loop {
            if self.all_settled() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(s.poll_interval) => {}
                _ = self.settled.notified() => continue,
            }
            let pods = match list_node_pods(s.client, s.node).await {
                Ok(pods) => pods,
                Err(error) => {
                    s.counters.bump(Counter::RequestError);
                    tracing::warn!(node = s.node, %error, "cannot list the node's pods while waiting; retrying");
                    continue;
                }
            };
            let by_uid: HashMap<String, Pod> =
                pods.into_iter().map(|p| (PodRef::of(&p).uid, p)).collect();
            for t in self.lock().iter_mut() {
                if let Some(current) = by_uid.get(&t.pod_ref.uid) {
                    t.last_seen = Some(current.clone());
                }
            }
            self.mark_gone_unless_listed(|uid| by_uid.contains_key(uid), s);
        }
    }

    /// Marks gone every tracked pod that a complete list of the node's pods (`listed`, by UID)
    /// does not hold: a pod's node never changes, so it is not elsewhere.
    fn mark_gone_unless_listed(&self, listed: impl Fn(&str) -> bool, s: &Settings<'_>) {
        let vanished: Vec<usize> = self
            .lock()
            .iter()
            .enumerate()
            .filter(|(_, t)| !matches!(t.state, PodState::Gone) && !listed(&t.pod_ref.uid))
            .map(|(index, _)| index)
            .collect();
        for index in vanished {
            self.mark_gone(index, s);
        }
    }

    /// Pods gone, split into evicted and deleted.
    pub fn gone(&self) -> (Vec<PodRef>, Vec<PodRef>) {
        let mut evicted = Vec::new();
        let mut deleted = Vec::new();
        for t in self.lock().iter() {
            if matches!(t.state, PodState::Gone) {
                match t.method {
                    Removal::Evicted => evicted.push(t.pod_ref.clone()),
                    Removal::Deleted => deleted.push(t.pod_ref.clone()),
                }
            }
        }
        (evicted, deleted)
    }

    /// Pods whose removal failed for good.
    pub fn failed(&self) -> Vec<StuckPod> {
        self.lock()
            .iter()
            .filter_map(|t| match &t.state {
                PodState::Failed(error) => Some(StuckPod {
                    pod: t.pod_ref.clone(),
                    why: StuckReason::Failed {
                        error: error.clone(),
                    },
                }),
                _ => None,
            })
            .collect()
    }

    /// Every pod not gone, with why.
    pub fn remaining(&self) -> Vec<StuckPod> {
        self.lock()
            .iter()
            .filter(|t| !matches!(t.state, PodState::Gone))
            .map(|t| StuckPod {
                pod: t.pod_ref.clone(),
                why: stuck_reason(t),
            })
            .collect()
    }
}

fn stuck_reason(t: &Tracked) -> StuckReason {
    match &t.state {
        PodState::NotRequested => StuckReason::NotRequested,
        PodState::Blocked(reason) => reason.clone(),
        PodState::Retrying(error) => StuckReason::Retrying {
            error: error.clone(),
        },
        PodState::Failed(error) => StuckReason::Failed {
            error: error.clone(),
        },
        PodState::Accepted(at) => {
            let seen = t.last_seen.as_ref().unwrap_or(&t.pod);
            if seen.metadata.deletion_timestamp.is_none() {
                return StuckReason::Accepted;
            }
            StuckReason::Terminating {
                waiting: Some(at.elapsed()),
                grace_period_seconds: seen.metadata.deletion_grace_period_seconds,
                finalizers: seen.metadata.finalizers.clone().unwrap_or_default(),
            }
        }
        PodState::Gone => StuckReason::Accepted,
    }
}
