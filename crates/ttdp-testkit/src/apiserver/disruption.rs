//! PodDisruptionBudget status, computed as the disruption controller does: pods matching the
//! selector in the budget's namespace, healthy when Ready and not terminating, desired healthy
//! from `minAvailable` / `maxUnavailable` (integer or percent, rounded up), and
//! `disruptionsAllowed = currentHealthy - desiredHealthy` (never negative).

use serde_json::{Value, json};

use super::meta;
use super::selectors::LabelSelector;

/// The numbers of a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Matching pods that are Ready and not terminating.
    pub current_healthy: i64,
    /// How many must stay healthy.
    pub desired_healthy: i64,
    /// Matching pods.
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
    LabelSelector::from_json(selector).matches(&pod["metadata"]["labels"])
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

/// Evaluate a budget against all pods of the cluster.
pub fn evaluate<'a>(pdb: &Value, pods: impl IntoIterator<Item = &'a Value>) -> Budget {
    let matching: Vec<&Value> = pods.into_iter().filter(|p| selects(pdb, p)).collect();
    let expected = matching.len() as i64;
    let healthy = matching.iter().filter(|p| is_healthy(p)).count() as i64;
    let spec = &pdb["spec"];
    let desired = if !spec["maxUnavailable"].is_null() {
        (expected - scaled(&spec["maxUnavailable"], expected)).max(0)
    } else if !spec["minAvailable"].is_null() {
        scaled(&spec["minAvailable"], expected)
    } else {
        1
    };
    Budget {
        current_healthy: healthy,
        desired_healthy: desired,
        expected_pods: expected,
        disruptions_allowed: (healthy - desired).max(0),
    }
}

/// The `status` the disruption controller would write, keeping condition transition times
/// from `previous` when the condition did not change.
pub fn status(pdb: &Value, budget: &Budget) -> Value {
    let allowed = budget.disruptions_allowed > 0;
    let (cond_status, reason) = if allowed {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let previous = pdb["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "DisruptionAllowed"))
        .cloned();
    let transition = match &previous {
        Some(p) if p["status"] == cond_status => p["lastTransitionTime"].clone(),
        _ => json!(meta::now()),
    };
    let generation = pdb["metadata"]["generation"].as_i64().unwrap_or(1);
    let mut status = json!({
        "observedGeneration": generation,
        "disruptionsAllowed": budget.disruptions_allowed,
        "currentHealthy": budget.current_healthy,
        "desiredHealthy": budget.desired_healthy,
        "expectedPods": budget.expected_pods,
        "conditions": [{
            "type": "DisruptionAllowed",
            "status": cond_status,
            "reason": reason,
            "message": "",
            "observedGeneration": generation,
            "lastTransitionTime": transition,
        }],
    });
    if let Some(disrupted) = pdb["status"]["disruptedPods"].as_object()
        && !disrupted.is_empty()
    {
        status["disruptedPods"] = Value::Object(disrupted.clone());
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool) -> Value {
        json!({"metadata": {"name": name, "namespace": "ns", "labels": {"app": "w"}},
               "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    #[test]
    fn percent_and_int_budgets_round_up_like_the_disruption_controller() {
        let pods = [pod("a", true), pod("b", true), pod("c", false)];
        let pdb = |spec: Value| json!({"metadata": {"namespace": "ns"}, "spec": spec});
        let sel = json!({"matchLabels": {"app": "w"}});
        let b = evaluate(&pdb(json!({"selector": sel, "minAvailable": 2})), &pods);
        assert_eq!(
            (b.current_healthy, b.desired_healthy, b.disruptions_allowed),
            (2, 2, 0)
        );
        let b = evaluate(&pdb(json!({"selector": sel, "minAvailable": "50%"})), &pods);
        assert_eq!((b.desired_healthy, b.disruptions_allowed), (2, 0));
        let b = evaluate(
            &pdb(json!({"selector": sel, "maxUnavailable": "34%"})),
            &pods,
        );
        assert_eq!((b.desired_healthy, b.disruptions_allowed), (1, 1));
        let b = evaluate(&pdb(json!({"selector": sel, "maxUnavailable": 0})), &pods);
        assert_eq!(b.disruptions_allowed, 0);
    }
}
