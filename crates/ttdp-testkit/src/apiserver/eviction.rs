//! The pod `eviction` subresource: the PodDisruptionBudget check (429 with the real body when a
//! budget forbids it), then the pod's deletion.

use serde_json::{Value, json};

use super::catalog::ResourceType;
use super::cluster::ClusterState;
use super::disruption::{self, BUDGETS};
use super::meta;
use super::status::{self, ApiError};

/// `POST .../pods/<name>/eviction`.
pub fn evict(
    state: &mut ClusterState,
    pods: &ResourceType,
    namespace: &str,
    name: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    let pod = state.get(pods, namespace, name)?;
    let evicted = status::status("Success", 201, json!({"name": name, "kind": "pods"}));
    let delete = |state: &mut ClusterState| {
        let options = body.get("deleteOptions").unwrap_or(&Value::Null);
        state
            .delete(pods, namespace, name, options)
            .map(|_| evicted.clone())
    };
    let phase = pod["status"]["phase"].as_str().unwrap_or_default();
    // As the real eviction REST: terminal and pending pods, and pods already being deleted, go
    // without consulting budgets.
    if meta::is_deleting(&pod) {
        return Ok(evicted.clone());
    }
    if matches!(phase, "Succeeded" | "Failed" | "Pending") {
        return delete(state);
    }
    let mut budgets = state.store.list(BUDGETS, Some(namespace));
    budgets.retain(|pdb| disruption::selects(pdb, &pod));
    let pdb = match budgets[..] {
        [] => return delete(state),
        [pdb] => pdb.clone(),
        _ => {
            return Err(ApiError::new(
                500,
                "InternalError",
                "Internal error occurred: This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    // As the eviction REST: decide from the budget's status, as the disruption controller last
    // wrote it, and decrement it.
    let number = |field: &str| pdb["status"][field].as_i64().unwrap_or(0);
    let (current, desired) = (number("currentHealthy"), number("desiredHealthy"));
    // The default `unhealthyPodEvictionPolicy` (IfHealthyBudget; the cluster refuses others).
    if !disruption::is_healthy(&pod) && current >= desired && desired > 0 {
        return delete(state);
    }
    let budget = meta::text(&pdb, "name");
    if number("observedGeneration") < pdb["metadata"]["generation"].as_i64().unwrap_or(1) {
        return Err(ApiError::disruption_budget(format!(
            "The disruption budget {budget} is still being processed by the server."
        )));
    }
    let allowed = number("disruptionsAllowed");
    if allowed <= 0 {
        return Err(ApiError::disruption_budget(format!(
            "The disruption budget {budget} needs {desired} healthy pods and has {current} currently"
        )));
    }
    let mut status = pdb["status"].clone();
    status["disruptionsAllowed"] = json!(allowed - 1);
    state.store_status(BUDGETS, &pdb, status);
    delete(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::cluster::Cluster;

    #[test]
    fn a_budget_allows_one_eviction_then_refuses_with_429() {
        let cluster = Cluster::default();
        let mut state = cluster.lock();
        let find = |s: &ClusterState, group: &str, plural: &str| s.resource(group, "v1", plural);
        let (pods, sets, budgets) = (
            find(&state, "", "pods").unwrap(),
            find(&state, "apps", "replicasets").unwrap(),
            find(&state, "policy", "poddisruptionbudgets").unwrap(),
        );
        let rs = json!({"metadata": {"name": "w"}, "spec": {"replicas": 2}});
        let rs = state.create(&sets, "default", rs).unwrap();
        for name in ["a", "b"] {
            let pod = json!({
                "metadata": {"name": name, "labels": {"app": "w"}, "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w",
                    "uid": rs["metadata"]["uid"], "controller": true}]},
                "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 0},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            });
            state.create(&pods, "default", pod).unwrap();
        }
        let pdb = json!({"metadata": {"name": "b"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "w"}}}});
        state.create(&budgets, "default", pdb).unwrap();
        disruption::update_budgets(&mut state);

        evict(&mut state, &pods, "default", "a", &json!({})).unwrap();
        assert_eq!(state.get(&pods, "default", "a").unwrap_err().code, 404);
        let refused = evict(&mut state, &pods, "default", "b", &json!({})).unwrap_err();
        assert_eq!((refused.code, refused.reason), (429, "TooManyRequests"));
        disruption::update_budgets(&mut state);
        let refused = evict(&mut state, &pods, "default", "b", &json!({})).unwrap_err();
        assert_eq!(
            refused.code, 429,
            "one of two replicas is gone: no disruption left"
        );
    }
}
