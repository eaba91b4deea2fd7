//! The disruption controller: each PodDisruptionBudget's status, recomputed after every write
//! and every 100 ms, as the real one (`pkg/controller/disruption`) computes it: pods matching
//! the selector in the budget's namespace; healthy when Ready and not terminating (an evicted
//! pod is terminating from its eviction on, so no `disruptedPods` are kept); the expected count is the sum of the
//! scales of the pods' ReplicaSets (pods without a controller count for nothing, and a
//! controller whose scale cannot be found fails the budget safe: no disruptions allowed);
//! `desiredHealthy` is that less `maxUnavailable` (a percentage rounds up);
//! `disruptionsAllowed = currentHealthy - desiredHealthy`, 0 when negative or when nothing is
//! expected. Budgets are only of the demo's kind, `maxUnavailable` over `matchLabels`: the
//! cluster refuses `minAvailable` and `matchExpressions`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::cluster::{Cluster, ClusterState};
use super::meta;
use super::selectors::Selector;

/// The numbers of a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Matching pods that are Ready and not terminating.
    pub current_healthy: i64,
    /// How many must stay healthy.
    pub desired_healthy: i64,
    /// The pods the budget expects (see the module docs).
    pub expected_pods: i64,
    /// How many may be disrupted now.
    pub disruptions_allowed: i64,
}

/// Whether a pod is Ready (condition `Ready=True`) and not terminating.
pub fn is_healthy(pod: &Value) -> bool {
    !meta::is_deleting(pod)
        && pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Whether the budget's selector selects the pod (same namespace; in policy/v1 an empty
/// selector selects every pod of the namespace, a missing one none).
pub fn selects(pdb: &Value, pod: &Value) -> bool {
    let selector = &pdb["spec"]["selector"];
    if selector.is_null() || meta::namespace(pdb) != meta::namespace(pod) {
        return false;
    }
    Selector::from_match_labels(selector).matches_labels(&pod["metadata"]["labels"])
}

fn scaled(value: &Value, total: i64) -> i64 {
    match value {
        Value::String(s) if s.ends_with('%') => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            (total * pct + 99) / 100
        }
        Value::String(s) => s.parse().unwrap_or(0),
        other => other.as_i64().unwrap_or(0),
    }
}

/// Evaluates a budget against the pods of its namespace. `controller_scale` answers, for a
/// pod's controller reference, the controller's uid and desired scale (None when no such
/// controller with a scale exists). Err is the message of a failed sync ("found no controllers
/// for pod ...").
pub fn evaluate<'a>(
    pdb: &Value,
    pods: impl IntoIterator<Item = &'a Value>,
    controller_scale: impl Fn(&Value) -> Option<(String, i64)>,
) -> Result<Budget, String> {
    let matching: Vec<&Value> = pods.into_iter().filter(|p| selects(pdb, p)).collect();
    let healthy = matching.iter().filter(|p| is_healthy(p)).count() as i64;
    let spec = &pdb["spec"];
    let scale = || -> Result<i64, String> {
        let mut scales: BTreeMap<String, i64> = BTreeMap::new();
        for pod in &matching {
            let Some(controller) = pod["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["controller"] == true)
            else {
                continue;
            };
            let (uid, n) = controller_scale(controller)
                .ok_or_else(|| format!("found no controllers for pod {:?}", meta::name(pod)))?;
            scales.insert(uid, n);
        }
        Ok(scales.values().sum())
    };
    let (expected, desired) = match &spec["maxUnavailable"] {
        Value::Null => (0, 0),
        max => {
            let expected = scale()?;
            (expected, (expected - scaled(max, expected)).max(0))
        }
    };
    let allowed = healthy - desired;
    Ok(Budget {
        current_healthy: healthy,
        desired_healthy: desired,
        expected_pods: expected,
        disruptions_allowed: if expected <= 0 || allowed <= 0 {
            0
        } else {
            allowed
        },
    })
}

/// The status of a budget whose sync failed: no disruptions allowed, the reason in the
/// `DisruptionAllowed` condition, the rest as it was.
pub fn fail_safe_status(pdb: &Value, message: &str) -> Value {
    let mut status = pdb["status"].clone();
    if !status.is_object() {
        status = json!({});
    }
    status["disruptionsAllowed"] = json!(0);
    let observed = status["observedGeneration"].clone();
    status["conditions"] = json!([condition(pdb, "False", "SyncFailed", message, observed)]);
    status
}

fn condition(pdb: &Value, status: &str, reason: &str, message: &str, observed: Value) -> Value {
    let previous = pdb["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "DisruptionAllowed"))
        .cloned();
    let transition = match &previous {
        Some(p) if p["status"] == status => p["lastTransitionTime"].clone(),
        _ => json!(meta::now()),
    };
    json!({
        "type": "DisruptionAllowed",
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": observed,
        "lastTransitionTime": transition,
    })
}

/// The `status` the disruption controller would write, keeping the condition's transition
/// time when it did not change.
pub fn status(pdb: &Value, budget: &Budget) -> Value {
    let (cond_status, reason) = if budget.disruptions_allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let generation = json!(pdb["metadata"]["generation"].as_i64().unwrap_or(1));
    json!({
        "observedGeneration": generation,
        "disruptionsAllowed": budget.disruptions_allowed,
        "currentHealthy": budget.current_healthy,
        "desiredHealthy": budget.desired_healthy,
        "expectedPods": budget.expected_pods,
        "conditions": [condition(pdb, cond_status, reason, "", generation.clone())],
    })
}

/// Run the controller until `stop` is cancelled.
pub async fn run(cluster: Cluster, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = cluster.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        update_budgets(&mut cluster.lock());
    }
}

/// Writes each budget's status where it changed.
pub fn update_budgets(state: &mut ClusterState) {
    let Some(pdb_rt) = state.resource("policy", "v1", "poddisruptionbudgets") else {
        return;
    };
    let mut updates: Vec<(Value, Value)> = Vec::new();
    for pdb in state.store.list(&pdb_rt.storage_key(), None) {
        let namespace = meta::namespace(pdb);
        let pods = state.store.list("/pods", Some(namespace));
        let scale = |owner: &Value| controller_scale(state, owner, namespace);
        let status = match evaluate(pdb, pods.iter().copied(), scale) {
            Ok(budget) => status(pdb, &budget),
            Err(message) => fail_safe_status(pdb, &message),
        };
        updates.push((pdb.clone(), status));
    }
    for (pdb, status) in updates {
        state.store_status(&pdb_rt, &pdb, status);
    }
}

/// The uid and desired scale of a pod's controller, as the disruption controller's finders
/// answer it: a ReplicaSet's replicas (default 1). Other controllers (DaemonSets among them)
/// have no scale here.
fn controller_scale(state: &ClusterState, owner: &Value, namespace: &str) -> Option<(String, i64)> {
    if owner["kind"] != "ReplicaSet" || owner["apiVersion"] != "apps/v1" {
        return None;
    }
    let rs = state
        .store
        .get("apps/replicasets", namespace, owner["name"].as_str()?)?;
    (meta::uid(rs) == owner["uid"].as_str()?).then(|| {
        (
            meta::uid(rs).to_owned(),
            rs["spec"]["replicas"].as_i64().unwrap_or(1),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool) -> Value {
        json!({"metadata": {"name": name, "namespace": "ns", "labels": {"app": "w"}},
               "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    fn owned(name: &str, ready: bool, rs: &str) -> Value {
        let mut p = pod(name, ready);
        p["metadata"]["ownerReferences"] =
            json!([{"kind": "ReplicaSet", "name": rs, "uid": rs, "controller": true}]);
        p
    }

    /// ReplicaSet "rs" has 3 replicas; nothing else has a scale.
    fn scale_of(owner: &Value) -> Option<(String, i64)> {
        (owner["uid"] == "rs").then(|| ("rs".to_owned(), 3))
    }

    fn pdb(spec: Value) -> Value {
        let mut spec = spec;
        spec["selector"] = json!({"matchLabels": {"app": "w"}});
        json!({"metadata": {"name": "b", "namespace": "ns"}, "spec": spec})
    }

    #[test]
    fn max_unavailable_counts_controller_scale() {
        let pods = [
            owned("a", true, "rs"),
            owned("b", true, "rs"),
            owned("c", false, "rs"),
        ];
        let b = evaluate(&pdb(json!({"maxUnavailable": 1})), &pods, scale_of).unwrap();
        assert_eq!(
            (
                b.current_healthy,
                b.desired_healthy,
                b.expected_pods,
                b.disruptions_allowed
            ),
            (2, 2, 3, 0)
        );
        let b = evaluate(&pdb(json!({"maxUnavailable": "34%"})), &pods, scale_of).unwrap();
        assert_eq!(
            (b.desired_healthy, b.disruptions_allowed),
            (1, 1),
            "34% of 3 rounds up to 2"
        );
        let b = evaluate(&pdb(json!({"maxUnavailable": 0})), &pods, scale_of).unwrap();
        assert_eq!(b.disruptions_allowed, 0);
    }

    #[test]
    fn bare_pods_expect_nothing_and_an_unknown_controller_fails_safe() {
        let bare = [pod("a", true), pod("b", true)];
        let b = evaluate(&pdb(json!({"maxUnavailable": 1})), &bare, scale_of).unwrap();
        assert_eq!((b.expected_pods, b.disruptions_allowed), (0, 0));
        let orphan = [owned("a", true, "gone")];
        let err = evaluate(&pdb(json!({"maxUnavailable": 1})), &orphan, scale_of).unwrap_err();
        assert_eq!(err, "found no controllers for pod \"a\"");
        let failed = fail_safe_status(&pdb(json!({"maxUnavailable": 1})), &err);
        assert_eq!(failed["disruptionsAllowed"], 0);
        assert_eq!(failed["conditions"][0]["reason"], "SyncFailed");
    }
}
