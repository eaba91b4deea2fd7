//! The pod `eviction` subresource: the PodDisruptionBudget check (429 with the real body when a
//! budget forbids it), then the pod's deletion.

use serde_json::{Value, json};

use super::catalog::ResourceType;
use super::cluster::{ClusterState, DeleteOpts};
use super::disruption::{self, Budget};
use super::meta;
use super::status::{self, ApiError, StatusCause};

/// `POST .../pods/<name>/eviction`.
pub fn evict(
    state: &mut ClusterState,
    pods: &ResourceType,
    namespace: &str,
    name: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    let pod = state.get(pods, namespace, name)?;
    let mut opts = DeleteOpts::default();
    if body["deleteOptions"].is_object() {
        opts.merge_body(&body["deleteOptions"]);
    }
    let evicted = status::success(201, json!({"name": name, "kind": "pods"}));
    let phase = pod["status"]["phase"].as_str().unwrap_or_default();
    // As the real eviction REST: terminal and pending pods, and pods already being deleted, go
    // without consulting budgets.
    if matches!(phase, "Succeeded" | "Failed" | "Pending") || meta::is_deleting(&pod) {
        if !meta::is_deleting(&pod) {
            state.delete(pods, namespace, name, &opts)?;
        }
        return Ok(evicted);
    }
    let pdb_rt = state
        .resource("policy", "v1", "poddisruptionbudgets")
        .ok_or_else(|| ApiError::internal("poddisruptionbudgets are not served"))?;
    let budgets: Vec<Value> = state
        .store
        .list(&pdb_rt.storage_key(), Some(namespace))
        .into_iter()
        .filter(|pdb| disruption::selects(pdb, &pod))
        .cloned()
        .collect();
    let pdb = match budgets.as_slice() {
        [] => {
            state.delete(pods, namespace, name, &opts)?;
            return Ok(evicted);
        }
        [pdb] => pdb,
        _ => {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    // As the eviction REST: decide from the budget's status, as the disruption controller last
    // wrote it, and decrement it.
    let status = &pdb["status"];
    let number = |field: &str| status[field].as_i64().unwrap_or(0);
    let (current, desired) = (number("currentHealthy"), number("desiredHealthy"));
    // The default `unhealthyPodEvictionPolicy` (IfHealthyBudget; the cluster refuses others).
    if !disruption::is_healthy(&pod) && current >= desired && desired > 0 {
        state.delete(pods, namespace, name, &opts)?;
        return Ok(evicted);
    }
    let generation = pdb["metadata"]["generation"].as_i64().unwrap_or(1);
    let refusal = if number("observedGeneration") < generation {
        Some(format!(
            "The disruption budget {} is still being processed by the server.",
            meta::name(pdb)
        ))
    } else if number("disruptionsAllowed") <= 0 {
        Some(format!(
            "The disruption budget {} needs {desired} healthy pods and has {current} currently",
            meta::name(pdb)
        ))
    } else {
        None
    };
    if let Some(message) = refusal {
        return Err(ApiError::too_many_requests(
            "Cannot evict pod as it would violate the pod's disruption budget.",
            vec![StatusCause {
                reason: "DisruptionBudget".into(),
                message,
            }],
        ));
    }
    let mut updated = match status {
        Value::Object(_) => status.clone(),
        _ => json!({}),
    };
    let allowed = number("disruptionsAllowed") - 1;
    updated["disruptionsAllowed"] = json!(allowed);
    if allowed == 0 {
        let budget = Budget {
            current_healthy: current,
            desired_healthy: desired,
            expected_pods: number("expectedPods"),
            disruptions_allowed: 0,
        };
        updated["conditions"] = disruption::status(pdb, &budget)["conditions"].clone();
    }
    state.store_status(&pdb_rt, pdb, updated);
    state.delete(pods, namespace, name, &opts)?;
    Ok(evicted)
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
