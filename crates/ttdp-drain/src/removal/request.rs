//! Requesting one pod's removal until the API server accepts it: each answer it refuses with
//! is read ([`ErrorKind`]) into what to do next (stop, retry after the back-off, or retry when
//! the blocking budget allows), and the pod's state and events say so meanwhile.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{Eviction, PodDisruptionBudget};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{self as metav1, DeleteOptions, ObjectMeta};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{PodState, Removals, Settings};
use crate::budget::{
    BudgetFound, disruption_already_granted, find_budget_object, held_disruptions,
};
use crate::budget_watch::BudgetTurn;
use crate::counters::Counter;
use crate::event::{DrainEventKind, Removal};
use crate::pod_ref::{ObjectKey, PodRef};
use crate::report::StuckReason;

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

/// The pod one request loop removes, and the API it is removed through.
struct Target {
    pod: Pod,
    pod_ref: PodRef,
    method: Removal,
    pods: Api<Pod>,
}

/// What a refused request leads to.
enum AfterRefusal {
    /// The pod's removal is settled (accepted, gone, or failed for good): stop requesting.
    Settled,
    /// Request again: after the back-off, or as soon as `blocked_by`, the budget that refused
    /// the eviction, allows one (the back-off is then the bound).
    Retry { blocked_by: Option<ObjectKey> },
}

impl Removals {
    /// Requests the removal of pod `index`, again after each refusal, until the API server
    /// accepts it, the pod is gone, or the request fails for good; at most `slots` requests of
    /// this drain are out at once.
    pub(super) async fn request_until_accepted(
        &self,
        index: usize,
        s: &Settings<'_>,
        slots: &Semaphore,
    ) {
        let Some(target) = self.target(index, s) else {
            return;
        };
        let mut attempt: u32 = 0;
        // The state of the blocking budget that last let this pod retry.
        let mut last_turn: u64 = 0;
        // Held while the retry a budget let through is made.
        let mut turn: Option<BudgetTurn> = None;
        loop {
            if self.is_gone(index) {
                return;
            }
            let result = {
                let Ok(_slot) = slots.acquire().await else {
                    return;
                };
                let _out = InFlight::mark(self, index);
                request(&target.pods, &target.pod_ref, target.method, attempt, s).await
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
            let blocked_by = match self
                .after_refusal(index, &target, &error, retry_in, s)
                .await
            {
                AfterRefusal::Settled => return,
                AfterRefusal::Retry { blocked_by } => blocked_by,
            };
            attempt = attempt.saturating_add(1);
            match blocked_by {
                Some(budget) => {
                    let name = &target.pod_ref.name;
                    turn = s
                        .budgets
                        .wait_until_allows(&budget, name, &mut last_turn, retry_in)
                        .await;
                }
                None => tokio::time::sleep(retry_in).await,
            }
        }
    }

    fn target(&self, index: usize, s: &Settings<'_>) -> Option<Target> {
        let (pod, pod_ref, method) = self
            .lock()
            .get(index)
            .map(|t| (t.pod.clone(), t.pod_ref.clone(), t.method))?;
        let pods = Api::namespaced(s.client.clone(), &pod_ref.namespace);
        Some(Target {
            pod,
            pod_ref,
            method,
            pods,
        })
    }

    /// Reads the API server's refusal of pod `index`'s request and records where the pod
    /// stands.
    async fn after_refusal(
        &self,
        index: usize,
        target: &Target,
        error: &kube::Error,
        retry_in: Duration,
        s: &Settings<'_>,
    ) -> AfterRefusal {
        match error_kind(error) {
            ErrorKind::NotFound => {
                self.mark_gone(index, s);
                AfterRefusal::Settled
            }
            ErrorKind::NamespaceTerminating => {
                self.set_state(index, PodState::Accepted(Instant::now()));
                AfterRefusal::Settled
            }
            ErrorKind::Conflict => self.after_conflict(index, target, error, retry_in, s).await,
            ErrorKind::TooManyRequests => {
                self.after_budget_refusal(index, target, error, retry_in, s)
                    .await
            }
            ErrorKind::Transient => {
                let pod = &target.pod_ref;
                let message = api_message(error);
                tracing::warn!(node = s.node, %pod, error = %message, "removal request failed, retrying");
                self.retrying(index, pod, message, retry_in, s);
                AfterRefusal::Retry { blocked_by: None }
            }
            ErrorKind::Fatal => {
                s.counters.bump(Counter::RequestError);
                let error = api_message(error);
                tracing::warn!(node = s.node, pod = %target.pod_ref, %error, "removal request failed");
                self.fail(index, error);
                AfterRefusal::Settled
            }
        }
    }

    /// A 409: the pod named so is gone or is a new pod (the UID precondition failed), or some
    /// other conflict that a retry may pass.
    async fn after_conflict(
        &self,
        index: usize,
        target: &Target,
        error: &kube::Error,
        retry_in: Duration,
        s: &Settings<'_>,
    ) -> AfterRefusal {
        let uid = &target.pod_ref.uid;
        match target.pods.get_opt(&target.pod_ref.name).await {
            Ok(current) if current.as_ref().is_none_or(|p| PodRef::of(p).uid != *uid) => {
                self.mark_gone(index, s);
                AfterRefusal::Settled
            }
            _ => {
                self.retrying(index, &target.pod_ref, api_message(error), retry_in, s);
                AfterRefusal::Retry { blocked_by: None }
            }
        }
    }

    /// Records a request that failed in a way a retry may pass.
    fn retrying(
        &self,
        index: usize,
        pod: &PodRef,
        error: String,
        retry_in: Duration,
        s: &Settings<'_>,
    ) {
        s.counters.bump(Counter::RequestError);
        self.set_state(index, PodState::Retrying(error.clone()));
        s.emit(DrainEventKind::RequestFailed {
            pod: pod.clone(),
            error,
            retry_in,
        });
    }

    /// A 429: a disruption budget refuses the eviction for now. Unless the budget already
    /// granted this very pod's eviction (then the pod is deleted), records the pod as blocked,
    /// with the budget and the pods holding its disruptions, and retries when it allows.
    async fn after_budget_refusal(
        &self,
        index: usize,
        target: &Target,
        error: &kube::Error,
        retry_in: Duration,
        s: &Settings<'_>,
    ) -> AfterRefusal {
        s.counters.bump(Counter::BudgetBlock);
        let pdb = budget_of(&target.pod, &target.pod_ref, s).await;
        let now = jiff::Timestamp::now();
        if let Some(pdb) = &pdb
            && target.method == Removal::Evicted
            && disruption_already_granted(pdb, &target.pod, now)
            && let Some(settled) = self.delete_granted(index, target, s).await
        {
            return settled;
        }
        let found = pdb.as_ref().map(BudgetFound::of);
        let (budget, disruptions_allowed) = match found {
            Some(f) => (Some(f.budget), f.disruptions_allowed),
            None => (None, None),
        };
        let message = api_message(error);
        let mut held = pdb
            .as_ref()
            .map(|pdb| held_disruptions(pdb, now))
            .unwrap_or_default();
        let pod = &target.pod_ref;
        self.drop_removed_here(&pod.namespace, &mut held);
        tracing::debug!(node = s.node, %pod, ?budget, retry_in_ms = retry_in.as_millis() as u64, "eviction blocked by a disruption budget");
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
            pod: pod.clone(),
            budget: budget.clone(),
            disruptions_allowed,
            message,
            held,
            retry_in,
        });
        AfterRefusal::Retry { blocked_by: budget }
    }

    /// Deletes a pod whose earlier eviction was granted and cut off before the pod was deleted:
    /// the budget already counts it as disrupted. `None` when the deletion failed (the eviction
    /// is then retried as usual).
    async fn delete_granted(
        &self,
        index: usize,
        target: &Target,
        s: &Settings<'_>,
    ) -> Option<AfterRefusal> {
        let pod = &target.pod_ref;
        tracing::info!(node = s.node, %pod, "budget already granted this pod's eviction; deleting it");
        match request(&target.pods, pod, Removal::Deleted, 1, s).await {
            Ok(()) => {
                self.set_state(index, PodState::Accepted(Instant::now()));
                Some(AfterRefusal::Settled)
            }
            Err(e) if matches!(error_kind(&e), ErrorKind::NotFound) => {
                self.mark_gone(index, s);
                Some(AfterRefusal::Settled)
            }
            Err(e) => {
                s.counters.bump(Counter::RequestError);
                tracing::debug!(%pod, error = %api_message(&e), "deleting a pod whose eviction was granted failed");
                None
            }
        }
    }
}

/// The disruption budget selecting `pod`: the watched one, else looked up; `None` when there is
/// none or it cannot be read.
async fn budget_of(pod: &Pod, pod_ref: &PodRef, s: &Settings<'_>) -> Option<PodDisruptionBudget> {
    let looked_up = match s.budgets.watched_budget_of(pod) {
        Some(pdb) => Ok(Some(pdb)),
        None => find_budget_object(s.client, pod).await,
    };
    match looked_up {
        Ok(pdb) => pdb,
        Err(e) => {
            s.counters.bump(Counter::RequestError);
            tracing::debug!(pod = %pod_ref, error = %e, "cannot look up the pod's disruption budget");
            None
        }
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
