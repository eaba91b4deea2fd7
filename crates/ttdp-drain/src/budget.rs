//! Finding the PodDisruptionBudget that blocks a pod's eviction, to name it.

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
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    let list = pdbs.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .find(|pdb| selects(pdb, pod))
        .map(|pdb| BudgetFound {
            budget: ObjectKey::new(namespace, pdb.metadata.name.clone().unwrap_or_default()),
            disruptions_allowed: pdb.status.as_ref().map(|s| s.disruptions_allowed),
        }))
}
