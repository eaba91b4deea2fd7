//! The pod `eviction` subresource (PodDisruptionBudget checks, 429 with the real body when a
//! budget forbids it) and the `binding` subresource (assigning a pod to a node).

use serde_json::{Value, json};

use super::catalog::ResourceType;
use super::cluster::{ClusterState, DeleteOpts, WriteCtx};
use super::disruption::{self, Budget};
use super::meta;
use super::status::{ApiError, StatusCause};

fn created_status() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

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
    let phase = pod["status"]["phase"].as_str().unwrap_or_default();
    // Mirrors the real eviction REST: terminal and pending pods, and pods already being
    // deleted, are deleted without consulting budgets.
    if matches!(phase, "Succeeded" | "Failed" | "Pending") || meta::is_deleting(&pod) {
        if !meta::is_deleting(&pod) {
            state.delete(pods, namespace, name, &opts)?;
        }
        return Ok(created_status());
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
    match budgets.as_slice() {
        [] => {
            state.delete(pods, namespace, name, &opts)?;
            Ok(created_status())
        }
        [pdb] => {
            // As the eviction REST does: decide from the budget's status, as the disruption
            // controller last wrote it, and decrement it.
            let status = &pdb["status"];
            let number = |field: &str| status[field].as_i64().unwrap_or(0);
            let policy = pdb["spec"]["unhealthyPodEvictionPolicy"]
                .as_str()
                .unwrap_or("IfHealthyBudget");
            let (current, desired) = (number("currentHealthy"), number("desiredHealthy"));
            if !disruption::is_healthy(&pod)
                && (policy == "AlwaysAllow" || (current >= desired && desired > 0))
            {
                state.delete(pods, namespace, name, &opts)?;
                return Ok(created_status());
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
                        field: None,
                    }],
                ));
            }
            if !opts.dry_run {
                let mut updated = pdb.clone();
                let allowed = number("disruptionsAllowed") - 1;
                updated["status"]["disruptionsAllowed"] = json!(allowed);
                if allowed == 0 {
                    let budget = Budget {
                        current_healthy: current,
                        desired_healthy: desired,
                        expected_pods: number("expectedPods"),
                        disruptions_allowed: 0,
                    };
                    updated["status"]["conditions"] =
                        disruption::status(pdb, &budget)["conditions"].clone();
                }
                updated["status"]["disruptedPods"][name] = json!(meta::now());
                state.store_direct(&pdb_rt, pdb, updated);
            }
            state.delete(pods, namespace, name, &opts)?;
            Ok(created_status())
        }
        _ => Err(ApiError::internal(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        )),
    }
}

/// `POST .../pods/<name>/binding`: set `spec.nodeName` once.
pub fn bind(
    state: &mut ClusterState,
    pods: &ResourceType,
    namespace: &str,
    name: &str,
    body: &Value,
    ctx: &WriteCtx,
) -> Result<Value, ApiError> {
    let pod = state.get(pods, namespace, name)?;
    let node = body["target"]["name"].as_str().unwrap_or_default();
    if node.is_empty() {
        return Err(ApiError::bad_request("binding target name is required"));
    }
    if let Some(current) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
        let q = pods.qualified();
        return Err(ApiError::conflict(
            super::status::ObjectRef {
                qualified_resource: &q,
                group: "",
                plural: "pods",
                name,
            },
            &format!("pod {name} is already assigned to node \"{current}\""),
        ));
    }
    let mut updated = pod.clone();
    updated["spec"]["nodeName"] = json!(node);
    let mut conditions = updated["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions.retain(|c| c["type"] != "PodScheduled");
    conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now()}));
    updated["status"]["conditions"] = json!(conditions);
    if !ctx.dry_run {
        state.store_direct(pods, &pod, updated);
    }
    Ok(created_status())
}
