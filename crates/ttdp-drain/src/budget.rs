//! Finding the PodDisruptionBudget that blocks a pod's eviction, to name it, reading the
//! disruptions it has granted but not seen carried out (`status.disruptedPods`), and putting
//! the evictions a budget guards first.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, ListParams};
use ttdp_selector::Selector;

use crate::event::Removal;
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

/// `pods` with the evictions one of `budgets` guards first, then the rest, each in their order.
/// A guarded eviction may have to wait until replacements are Ready; started first, that wait
/// runs beside the other evictions instead of after them, and its replacements are created,
/// scheduled and started before theirs.
pub(crate) fn guarded_first(
    pods: Vec<(Pod, Removal)>,
    budgets: &[PodDisruptionBudget],
) -> Vec<(Pod, Removal)> {
    let (mut guarded, rest): (Vec<_>, Vec<_>) = pods.into_iter().partition(|(pod, removal)| {
        *removal == Removal::Evicted && budgets.iter().any(|b| selects(b, pod))
    });
    guarded.extend(rest);
    guarded
}

/// The budgets of the namespaces of the pods to evict. A namespace whose budgets cannot be
/// listed adds none: only the order of the evictions depends on it, and every eviction is
/// still checked against every budget by the API server.
pub(crate) async fn budgets_of_evicted(
    client: &Client,
    pods: &[(Pod, Removal)],
) -> Vec<PodDisruptionBudget> {
    let namespaces: BTreeSet<&str> = pods
        .iter()
        .filter(|(_, removal)| *removal == Removal::Evicted)
        .filter_map(|(pod, _)| pod.metadata.namespace.as_deref())
        .collect();
    let lists = futures::future::join_all(namespaces.into_iter().map(|namespace| async move {
        let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
        api.list(&ListParams::default())
            .await
            .inspect_err(|e| tracing::debug!(namespace, error = %e, "cannot list disruption budgets; evicting in list order"))
    }))
    .await;
    lists.into_iter().flatten().flat_map(|l| l.items).collect()
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

    #[test]
    fn evictions_a_budget_guards_go_first_in_their_order() {
        let labelled = |name: &str, app: &str| {
            let mut p = pod(name, "2026-01-01T00:00:00Z", false);
            p.metadata.namespace = Some("apps".into());
            p.metadata.labels = Some([("app".to_owned(), app.to_owned())].into());
            p
        };
        let budget: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "web", "namespace": "apps" },
            "spec": { "selector": { "matchLabels": { "app": "web" } } },
        }))
        .unwrap();
        let pods = vec![
            (labelled("api-1", "api"), Removal::Evicted),
            (labelled("web-1", "web"), Removal::Deleted),
            (labelled("web-2", "web"), Removal::Evicted),
            (labelled("api-2", "api"), Removal::Evicted),
            (labelled("web-3", "web"), Removal::Evicted),
        ];
        let names = |pods: Vec<(Pod, Removal)>| -> Vec<String> {
            pods.into_iter()
                .map(|(p, _)| p.metadata.name.unwrap())
                .collect()
        };
        assert_eq!(
            names(guarded_first(pods.clone(), &[budget])),
            ["web-2", "web-3", "api-1", "web-1", "api-2"],
            "a deletion is not guarded by a budget"
        );
        assert_eq!(
            names(guarded_first(pods, &[])),
            ["api-1", "web-1", "web-2", "api-2", "web-3"]
        );
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
