//! Removing pods: eviction (or deletion) requests with bounded concurrency and capped,
//! jittered back-off, and waiting until every removed pod is gone, checked by UID on a watch of
//! the node's pods and on a list of them.
//!
//! All state lives in [`Removals`], outside the future that does the work, so that when a
//! timeout drops the future the caller can still say what each pod was waiting for.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use futures::future::{self, Either};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{self as metav1, DeleteOptions, ObjectMeta};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::watcher;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::budget::{
    BudgetFound, HeldDisruption, disruption_already_granted, find_budget_object, held_disruptions,
};
use crate::budget_watch::{BudgetTurn, BudgetWatches};
use crate::counters::{Counter, DrainCounters};
use crate::event::{DrainEvent, DrainEventKind, EventSink, Removal};
use crate::node_pods::list_node_pods;
use crate::pod_ref::PodRef;
use crate::report::{StuckPod, StuckReason};

/// Marks a pod's request as out until dropped: also when a timeout drops the request's future.
struct InFlight<'a> {
    removals: &'a Removals,
    index: usize,
}

impl<'a> InFlight<'a> {
    fn mark(removals: &'a Removals, index: usize) -> Self {
        removals.set_in_flight(index, true);
        Self { removals, index }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.removals.set_in_flight(self.index, false);
    }
}

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

/// What an API error means for a removal.
enum ErrorKind {
    /// 404: the pod is gone.
    NotFound,
    /// 409: the UID precondition failed (a new pod has the name) or another conflict.
    Conflict,
    /// 429: a PodDisruptionBudget (or API priority and fairness) refuses it for now.
    TooManyRequests,
    /// 403 with cause `NamespaceTerminating`: the namespace is being deleted with the pod.
    NamespaceTerminating,
    /// 5xx, 408 or a connection problem: may pass.
    Transient,
    /// Anything else: retrying does not help.
    Fatal,
}

fn error_kind(error: &kube::Error) -> ErrorKind {
    match error {
        kube::Error::Api(status) => {
            let has_cause = |reason: &str| {
                status
                    .details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.reason == reason))
            };
            match status.code {
                404 => ErrorKind::NotFound,
                409 => ErrorKind::Conflict,
                429 => ErrorKind::TooManyRequests,
                403 if has_cause("NamespaceTerminating") => ErrorKind::NamespaceTerminating,
                // The real API server answers 500 when several budgets select one pod; that
                // does not pass by itself.
                500 if status.message.contains("more than one PodDisruptionBudget") => {
                    ErrorKind::Fatal
                }
                408 | 500..=599 => ErrorKind::Transient,
                _ => ErrorKind::Fatal,
            }
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            ErrorKind::Transient
        }
        _ => ErrorKind::Fatal,
    }
}

fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
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

    async fn request_until_accepted(&self, index: usize, s: &Settings<'_>, slots: &Semaphore) {
        let Some((pod, pod_ref, method)) = self
            .lock()
            .get(index)
            .map(|t| (t.pod.clone(), t.pod_ref.clone(), t.method))
        else {
            return;
        };
        let pods: Api<Pod> = Api::namespaced(s.client.clone(), &pod_ref.namespace);
        let mut attempt: u32 = 0;
        // The state of the blocking budget that last let this pod retry.
        let mut last_turn: u64 = 0;
        // Held while the retry a budget let through is made.
        let mut turn: Option<BudgetTurn> = None;
        loop {
            let mut blocked_by = None;
            if self.is_gone(index) {
                return;
            }
            let result = {
                let Ok(_slot) = slots.acquire().await else {
                    return;
                };
                let _out = InFlight::mark(self, index);
                request(&pods, &pod_ref, method, attempt, s).await
            };
            let held = turn.take();
            let error = match result {
                Ok(()) => {
                    if let Some(turn) = held {
                        turn.accepted();
                    }
                    self.set_state(index, PodState::Accepted(Instant::now()));
                    return;
                }
                Err(error) => error,
            };
            drop(held);
            let retry_in = s.backoff.delay(attempt);
            match error_kind(&error) {
                ErrorKind::NotFound => {
                    self.mark_gone(index, s);
                    return;
                }
                ErrorKind::NamespaceTerminating => {
                    self.set_state(index, PodState::Accepted(Instant::now()));
                    return;
                }
                ErrorKind::Conflict => match pods.get_opt(&pod_ref.name).await {
                    Ok(current)
                        if current
                            .as_ref()
                            .is_none_or(|p| PodRef::of(p).uid != pod_ref.uid) =>
                    {
                        self.mark_gone(index, s);
                        return;
                    }
                    _ => {
                        s.counters.bump(Counter::RequestError);
                        let error = api_message(&error);
                        self.set_state(index, PodState::Retrying(error.clone()));
                        s.emit(DrainEventKind::RequestFailed {
                            pod: pod_ref.clone(),
                            error,
                            retry_in,
                        });
                    }
                },
                ErrorKind::TooManyRequests => {
                    s.counters.bump(Counter::BudgetBlock);
                    let watched = s.budgets.watched_budget_of(&pod);
                    let looked_up = match watched {
                        Some(pdb) => Ok(Some(pdb)),
                        None => find_budget_object(s.client, &pod).await,
                    };
                    let pdb = match looked_up {
                        Ok(pdb) => pdb,
                        Err(e) => {
                            s.counters.bump(Counter::RequestError);
                            tracing::debug!(pod = %pod_ref, error = %e, "cannot look up the pod's disruption budget");
                            None
                        }
                    };
                    let now = jiff::Timestamp::now();
                    if let Some(pdb) = &pdb
                        && method == Removal::Evicted
                        && disruption_already_granted(pdb, &pod, now)
                    {
                        // An earlier eviction of this very pod was granted and cut off before
                        // the pod was deleted: the budget already counts it as disrupted.
                        tracing::info!(node = s.node, pod = %pod_ref, "budget already granted this pod's eviction; deleting it");
                        match request(&pods, &pod_ref, Removal::Deleted, 1, s).await {
                            Ok(()) => {
                                self.set_state(index, PodState::Accepted(Instant::now()));
                                return;
                            }
                            Err(e) if matches!(error_kind(&e), ErrorKind::NotFound) => {
                                self.mark_gone(index, s);
                                return;
                            }
                            Err(e) => {
                                s.counters.bump(Counter::RequestError);
                                tracing::debug!(pod = %pod_ref, error = %api_message(&e), "deleting a pod whose eviction was granted failed");
                            }
                        }
                    }
                    let found = pdb.as_ref().map(BudgetFound::of);
                    let (budget, disruptions_allowed) = match found {
                        Some(f) => (Some(f.budget), f.disruptions_allowed),
                        None => (None, None),
                    };
                    let message = api_message(&error);
                    let mut held = pdb
                        .as_ref()
                        .map(|pdb| held_disruptions(pdb, now))
                        .unwrap_or_default();
                    self.drop_removed_here(&pod_ref.namespace, &mut held);
                    blocked_by = budget.clone();
                    tracing::debug!(node = s.node, pod = %pod_ref, ?budget, retry_in_ms = retry_in.as_millis() as u64, "eviction blocked by a disruption budget");
                    self.set_state(
                        index,
                        PodState::Blocked(StuckReason::Blocked {
                            budget: budget.clone(),
                            disruptions_allowed,
                            message: message.clone(),
                            held: held.clone(),
                        }),
                    );
                    s.emit(DrainEventKind::EvictionBlocked {
                        pod: pod_ref.clone(),
                        budget,
                        disruptions_allowed,
                        message,
                        held,
                        retry_in,
                    });
                }
                ErrorKind::Transient => {
                    s.counters.bump(Counter::RequestError);
                    let error = api_message(&error);
                    tracing::warn!(node = s.node, pod = %pod_ref, %error, "removal request failed, retrying");
                    self.set_state(index, PodState::Retrying(error.clone()));
                    s.emit(DrainEventKind::RequestFailed {
                        pod: pod_ref.clone(),
                        error,
                        retry_in,
                    });
                }
                ErrorKind::Fatal => {
                    s.counters.bump(Counter::RequestError);
                    let error = api_message(&error);
                    tracing::warn!(node = s.node, pod = %pod_ref, %error, "removal request failed");
                    self.fail(index, error);
                    return;
                }
            }
            attempt = attempt.saturating_add(1);
            match blocked_by {
                Some(budget) => {
                    turn = s
                        .budgets
                        .wait_until_allows(&budget, &pod_ref.name, &mut last_turn, retry_in)
                        .await;
                }
                None => tokio::time::sleep(retry_in).await,
            }
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

/// One eviction or deletion request.
///
/// The eviction is posted as a complete `policy/v1` Eviction: kube's own `Api::evict` (5.0)
/// sends its delete options as `delete_options`, which the API server ignores, so the UID
/// precondition and grace period would be lost.
async fn request(
    pods: &Api<Pod>,
    pod: &PodRef,
    method: Removal,
    attempt: u32,
    s: &Settings<'_>,
) -> Result<(), kube::Error> {
    let preconditions = Some(pod.uid.clone())
        .filter(|u| !u.is_empty())
        .map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        });
    match method {
        Removal::Evicted => {
            if attempt == 0 {
                s.emit(DrainEventKind::Evicting { pod: pod.clone() });
            }
            s.counters.bump(Counter::EvictionRequest);
            let eviction = Eviction {
                metadata: ObjectMeta {
                    name: Some(pod.name.clone()),
                    namespace: Some(pod.namespace.clone()),
                    ..ObjectMeta::default()
                },
                delete_options: Some(DeleteOptions {
                    grace_period_seconds: s.grace_period.map(i64::from),
                    preconditions: preconditions.map(|p| metav1::Preconditions {
                        uid: p.uid,
                        resource_version: None,
                    }),
                    ..DeleteOptions::default()
                }),
            };
            let _: serde_json::Value = pods
                .create_subresource("eviction", &pod.name, &PostParams::default(), &eviction)
                .await?;
            s.counters.bump(Counter::Eviction);
        }
        Removal::Deleted => {
            if attempt == 0 {
                s.emit(DrainEventKind::Deleting { pod: pod.clone() });
            }
            s.counters.bump(Counter::DeletionRequest);
            let params = DeleteParams {
                grace_period_seconds: s.grace_period,
                preconditions,
                ..DeleteParams::default()
            };
            pods.delete(&pod.name, &params).await?;
            s.counters.bump(Counter::Deletion);
        }
    }
    Ok(())
}
