//! The disruption controller: each PodDisruptionBudget's status, recomputed after every write
//! and every 100 ms, as the real one (`pkg/controller/disruption`) computes it: pods matching
//! the selector in the budget's namespace; healthy when Ready and not terminating (an evicted
//! pod is terminating from its eviction on, so no `disruptedPods` are kept); the expected count
//! is the sum of the scales of the pods' ReplicaSets (pods without a controller count for
//! nothing, and a controller whose scale cannot be found fails the budget safe: no disruptions
//! allowed); `desiredHealthy` is that less `maxUnavailable` (a percentage rounds up);
//! `disruptionsAllowed = currentHealthy - desiredHealthy`, 0 when negative or when nothing is
//! expected. Budgets are only of the demo's kind, `maxUnavailable` over `matchLabels`: the
//! cluster refuses others. No `DisruptionAllowed` condition is written: nothing of the demo
//! reads it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::cluster::{Cluster, ClusterState};
use super::meta;
use super::selectors::{labels_match, match_labels};

/// Where budgets are stored.
pub const BUDGETS: &str = "policy/poddisruptionbudgets";

/// Whether a pod is Ready (condition `Ready=True`) and not terminating.
pub fn is_healthy(pod: &Value) -> bool {
    let mut conditions = meta::items(&pod["status"]["conditions"]);
    !meta::is_deleting(pod) && conditions.any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Whether the budget's selector selects the pod (same namespace; in policy/v1 an empty
/// selector selects every pod of the namespace, a missing one none).
pub fn selects(pdb: &Value, pod: &Value) -> bool {
    let selector = &pdb["spec"]["selector"];
    !selector.is_null()
        && meta::text(pdb, "namespace") == meta::text(pod, "namespace")
        && labels_match(&match_labels(selector), &pod["metadata"]["labels"])
}

/// `maxUnavailable` of `total`: a number, or a percentage rounded up.
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

/// The status of a budget over the pods of its namespace. `controller_scale` answers, for a
/// pod's controller reference, the controller's uid and desired scale (None when no such
/// controller with a scale exists).
pub fn status<'a>(
    pdb: &Value,
    pods: impl IntoIterator<Item = &'a Value>,
    controller_scale: impl Fn(&Value) -> Option<(String, i64)>,
) -> Value {
    let matching: Vec<&Value> = pods.into_iter().filter(|p| selects(pdb, p)).collect();
    let healthy = matching.iter().filter(|p| is_healthy(p)).count() as i64;
    let mut scales: BTreeMap<String, i64> = BTreeMap::new();
    let mut unknown_controller = false;
    for pod in matching {
        let mut owners = meta::items(&pod["metadata"]["ownerReferences"]);
        let controller = owners.find(|r| r["controller"] == true);
        match controller.map(&controller_scale) {
            Some(Some((uid, n))) => {
                scales.insert(uid, n);
            }
            Some(None) => unknown_controller = true,
            None => {}
        }
    }
    let expected: i64 = scales.values().sum();
    let desired = (expected - scaled(&pdb["spec"]["maxUnavailable"], expected)).max(0);
    let allowed = if unknown_controller || expected <= 0 {
        0
    } else {
        (healthy - desired).max(0)
    };
    json!({
        "observedGeneration": pdb["metadata"]["generation"].as_i64().unwrap_or(1),
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
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
    let mut updates: Vec<(Value, Value)> = Vec::new();
    for pdb in state.store.list(BUDGETS, None) {
        let namespace = meta::text(pdb, "namespace");
        let pods = state.store.list("/pods", Some(namespace));
        let scale = |owner: &Value| controller_scale(state, owner, namespace);
        updates.push((pdb.clone(), status(pdb, pods, scale)));
    }
    for (pdb, status) in updates {
        state.store_status(BUDGETS, &pdb, status);
    }
}

/// The uid and desired scale of a pod's controller, as the disruption controller's finders
/// answer it: a ReplicaSet's replicas (default 1). Other controllers (DaemonSets among them)
/// have no scale here.
fn controller_scale(state: &ClusterState, owner: &Value, namespace: &str) -> Option<(String, i64)> {
    if owner["kind"] != "ReplicaSet" || owner["apiVersion"] != "apps/v1" {
        return None;
    }
    let name = owner["name"].as_str()?;
    let rs = state.store.get("apps/replicasets", namespace, name)?;
    let uid = meta::text(rs, "uid");
    let replicas = rs["spec"]["replicas"].as_i64().unwrap_or(1);
    (uid == owner["uid"].as_str()?).then(|| (uid.to_owned(), replicas))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool, rs: Option<&str>) -> Value {
        let ready = if ready { "True" } else { "False" };
        let owners = rs.map(|rs| json!([{"name": rs, "uid": rs, "controller": true}]));
        json!({"metadata": {"name": name, "namespace": "ns", "labels": {"app": "w"},
                "ownerReferences": owners},
               "status": {"conditions": [{"type": "Ready", "status": ready}]}})
    }

    /// ReplicaSet "rs" has 3 replicas; nothing else has a scale.
    fn scale_of(owner: &Value) -> Option<(String, i64)> {
        (owner["uid"] == "rs").then(|| ("rs".to_owned(), 3))
    }

    fn numbers(max_unavailable: Value, pods: &[Value]) -> [Value; 4] {
        let pdb = json!({"metadata": {"name": "b", "namespace": "ns"}, "spec": {
            "maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": "w"}}}});
        let s = status(&pdb, pods, scale_of);
        [
            "currentHealthy",
            "desiredHealthy",
            "expectedPods",
            "disruptionsAllowed",
        ]
        .map(|field| s[field].clone())
    }

    #[test]
    fn max_unavailable_counts_controller_scale() {
        let pods = [
            pod("a", true, Some("rs")),
            pod("b", true, Some("rs")),
            pod("c", false, Some("rs")),
        ];
        assert_eq!(numbers(json!(1), &pods), [2, 2, 3, 0].map(|n| json!(n)));
        let percent = numbers(json!("34%"), &pods);
        assert_eq!(
            percent,
            [2, 1, 3, 1].map(|n| json!(n)),
            "34% of 3 rounds up to 2"
        );
    }

    #[test]
    fn bare_pods_expect_nothing_and_an_unknown_controller_fails_safe() {
        let bare = [pod("a", true, None), pod("b", true, None)];
        assert_eq!(numbers(json!(1), &bare), [2, 0, 0, 0].map(|n| json!(n)));
        let orphan = [pod("a", true, Some("gone")), pod("b", true, Some("rs"))];
        assert_eq!(numbers(json!(1), &orphan)[3], 0);
    }
}
