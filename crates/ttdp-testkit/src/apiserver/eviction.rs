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
            let budget =
                disruption::evaluate(pdb, state.store.list(&pods.storage_key(), Some(namespace)));
            let healthy = disruption::is_healthy(&pod);
            let policy = pdb["spec"]["unhealthyPodEvictionPolicy"]
                .as_str()
                .unwrap_or("IfHealthyBudget");
            if !healthy
                && (policy == "AlwaysAllow" || budget.current_healthy >= budget.desired_healthy)
            {
                state.delete(pods, namespace, name, &opts)?;
                return Ok(created_status());
            }
            if budget.disruptions_allowed <= 0 {
                write_status(state, &pdb_rt, pdb, &budget, None);
                return Err(ApiError::too_many_requests(
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    vec![StatusCause {
                        reason: "DisruptionBudget".into(),
                        message: format!(
                            "The disruption budget {} needs {} healthy pods and has {} currently",
                            meta::name(pdb),
                            budget.desired_healthy,
                            budget.current_healthy
                        ),
                        field: None,
                    }],
                ));
            }
            let after = Budget {
                disruptions_allowed: budget.disruptions_allowed - 1,
                ..budget
            };
            write_status(state, &pdb_rt, pdb, &after, Some(name));
            state.delete(pods, namespace, name, &opts)?;
            Ok(created_status())
        }
        _ => Err(ApiError::internal(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        )),
    }
}

fn write_status(
    state: &mut ClusterState,
    pdb_rt: &ResourceType,
    pdb: &Value,
    budget: &Budget,
    disrupted: Option<&str>,
) {
    let mut updated = pdb.clone();
    updated["status"] = disruption::status(pdb, budget);
    if let Some(pod) = disrupted {
        updated["status"]["disruptedPods"][pod] = json!(meta::now());
    }
    state.store_direct(pdb_rt, pdb, updated);
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
