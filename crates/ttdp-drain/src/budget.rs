//! Finding the PodDisruptionBudget that blocks a pod's eviction, to name it, and reading the
//! disruptions it has granted but not seen carried out (`status.disruptedPods`).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, ListParams};
use ttdp_api::selector::Selector;

use crate::pod_ref::ObjectKey;

/// A budget that selects a pod, with its `status.disruptionsAllowed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetFound {
    /// The budget.
    pub budget: ObjectKey,
    /// Its `status.disruptionsAllowed`, when the disruption controller has written it.
    pub disruptions_allowed: Option<i32>,
}

/// Whether `pdb` selects `pod` (policy/v1: same namespace; an empty selector selects every pod
/// of the namespace, a missing one none; an invalid one none).
pub fn selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    if pdb.metadata.namespace != pod.metadata.namespace {
        return false;
    }
    let Some(selector) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return false;
    };
    let Ok(selector) = Selector::from_label_selector(selector) else {
        return false;
    };
    match &pod.metadata.labels {
        Some(labels) => selector.matches(labels),
        None => selector.matches(&Default::default()),
    }
}

/// The first budget in the pod's namespace that selects it; `Ok(None)` when none does.
pub async fn find_budget(client: &Client, pod: &Pod) -> Result<Option<BudgetFound>, kube::Error> {
    Ok(find_budget_object(client, pod)
        .await?
        .as_ref()
        .map(BudgetFound::of))
}

impl BudgetFound {
    pub(crate) fn of(pdb: &PodDisruptionBudget) -> Self {
        Self {
            budget: ObjectKey::new(
                pdb.metadata.namespace.clone().unwrap_or_default(),
                pdb.metadata.name.clone().unwrap_or_default(),
            ),
            disruptions_allowed: pdb.status.as_ref().map(|s| s.disruptions_allowed),
        }
    }
}

/// The first budget in the pod's namespace that selects it, as the server has it now.
pub(crate) async fn find_budget_object(
    client: &Client,
    pod: &Pod,
) -> Result<Option<PodDisruptionBudget>, kube::Error> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    let list = pdbs.list(&ListParams::default()).await?;
    Ok(list.items.into_iter().find(|pdb| selects(pdb, pod)))
}

/// How long the disruption controller keeps counting a pod of `status.disruptedPods` as
/// disrupted when it is not deleted: Kubernetes' `DeletionTimeout`
/// (`pkg/controller/disruption`), 2 minutes.
pub const DISRUPTED_POD_TIMEOUT: Duration = Duration::from_secs(120);

/// A granted disruption counts only while it is this far from expiring, to leave room for
/// clock skew between this process and the control plane and for the request's own latency.
const EXPIRY_MARGIN: Duration = Duration::from_secs(20);

/// A disruption the API server granted and nobody carried out: an entry of the budget's
/// `status.disruptedPods`.
///
/// The eviction handler records the pod there, then deletes it; when the request is cut off
/// in between (its client killed, say) the pod stays, and until the entry expires the
/// disruption controller counts the pod as already disrupted, so the budget allows one
/// disruption fewer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldDisruption {
    /// The pod's name (the map's key).
    pub pod: String,
    /// When the API server granted the eviction.
    pub granted_at: Timestamp,
}

impl HeldDisruption {
    /// When the disruption controller forgets the entry (and the budget allows one more).
    pub fn expires_at(&self) -> Timestamp {
        self.granted_at
            .checked_add(jiff::SignedDuration::try_from(DISRUPTED_POD_TIMEOUT).unwrap_or_default())
            .unwrap_or(self.granted_at)
    }
}

/// Every entry of `pdb`'s `status.disruptedPods` that has not expired at `now`.
pub fn held_disruptions(pdb: &PodDisruptionBudget, now: Timestamp) -> Vec<HeldDisruption> {
    let Some(map) = pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref()) else {
        return Vec::new();
    };
    map.iter()
        .map(|(pod, at)| HeldDisruption {
            pod: pod.clone(),
            granted_at: at.0,
        })
        .filter(|h| h.expires_at() > now)
        .collect()
}

/// `held` in words for a blocked eviction's message: empty when nothing is held, else e.g.
/// `; Kubernetes holds 1 disruption of this budget for an eviction granted but never carried
/// out (default/web-0, until 2026-12-01T21:52:03Z)`.
pub fn held_text(held: &[HeldDisruption]) -> String {
    if held.is_empty() {
        return String::new();
    }
    let pods: Vec<String> = held
        .iter()
        .map(|h| {
            let until = h.expires_at();
            let until = until.round(jiff::Unit::Second).unwrap_or(until);
            format!("{}, until {until}", h.pod)
        })
        .collect();
    let (n, s, what) = match held.len() {
        1 => (1, "", "an eviction"),
        n => (n, "s", "evictions"),
    };
    format!(
        "; Kubernetes holds {n} disruption{s} of this budget for {what} granted but never carried out ({})",
        pods.join("; ")
    )
}

/// Whether `pdb` already granted the disruption of `pod` and still counts it, so that
/// deleting the pod directly takes nothing more from the budget.
///
/// True when the pod is not terminating, `status.disruptedPods` names it with a time after the
/// pod was created (so the grant was for this pod, not an earlier one of the same name), and
/// the entry is at least 20 s from expiring. While the entry stands, the
/// disruption controller leaves the pod out of `currentHealthy` whether or not it runs, and
/// drops the entry once the pod is deleted: deleting it changes neither `currentHealthy` nor
/// `disruptionsAllowed`.
pub fn disruption_already_granted(pdb: &PodDisruptionBudget, pod: &Pod, now: Timestamp) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let (Some(name), Some(created)) = (
        pod.metadata.name.as_deref(),
        pod.metadata.creation_timestamp.as_ref(),
    ) else {
        return false;
    };
    let Ok(margin) = jiff::SignedDuration::try_from(EXPIRY_MARGIN) else {
        return false;
    };
    held_disruptions(pdb, now).iter().any(|h| {
        h.pod == name
            && h.granted_at >= created.0
            && h.expires_at()
                .checked_sub(margin)
                .is_ok_and(|safe| now < safe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn pod(name: &str, created: &str, terminating: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(Time(at(created))),
                deletion_timestamp: terminating.then(|| Time(at(created))),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn budget_holding(pod: &str, granted: &str) -> PodDisruptionBudget {
        PodDisruptionBudget {
            status: Some(PodDisruptionBudgetStatus {
                disrupted_pods: Some([(pod.to_owned(), Time(at(granted)))].into()),
                ..PodDisruptionBudgetStatus::default()
            }),
            ..PodDisruptionBudget::default()
        }
    }

    #[test]
    fn a_granted_eviction_of_this_very_pod_counts_until_near_its_expiry() {
        let pdb = budget_holding("web-0", "2026-12-01T10:00:00Z");
        let web0 = pod("web-0", "2026-12-01T09:00:00Z", false);
        assert!(disruption_already_granted(
            &pdb,
            &web0,
            at("2026-12-01T10:00:05Z")
        ));
        assert!(disruption_already_granted(
            &pdb,
            &web0,
            at("2026-12-01T10:01:39Z")
        ));
        // Too close to the 2 minutes after which the disruption controller forgets it.
        assert!(!disruption_already_granted(
            &pdb,
            &web0,
            at("2026-12-01T10:01:41Z")
        ));
        assert!(!disruption_already_granted(
            &pdb,
            &web0,
            at("2026-12-01T10:03:00Z")
        ));
        // Another pod, a pod created after the grant (same name, new pod), a terminating pod.
        let now = at("2026-12-01T10:00:05Z");
        assert!(!disruption_already_granted(
            &pdb,
            &pod("web-1", "2026-12-01T09:00:00Z", false),
            now
        ));
        assert!(!disruption_already_granted(
            &pdb,
            &pod("web-0", "2026-12-01T10:00:01Z", false),
            now
        ));
        assert!(!disruption_already_granted(
            &pdb,
            &pod("web-0", "2026-12-01T09:00:00Z", true),
            now
        ));
        assert!(!disruption_already_granted(
            &PodDisruptionBudget::default(),
            &web0,
            now
        ));
    }

    #[test]
    fn held_disruptions_say_until_when() {
        let pdb = budget_holding("web-0", "2026-12-01T10:00:00.4Z");
        let held = held_disruptions(&pdb, at("2026-12-01T10:00:30Z"));
        assert_eq!(held.len(), 1);
        assert_eq!(
            held_text(&held),
            "; Kubernetes holds 1 disruption of this budget for an eviction granted but never \
             carried out (web-0, until 2026-12-01T10:02:00Z)"
        );
        assert!(held_disruptions(&pdb, at("2026-12-01T10:02:01Z")).is_empty());
        assert_eq!(held_text(&[]), "");
    }
}
