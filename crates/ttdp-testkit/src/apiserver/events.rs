//! `events.k8s.io/v1` Events are the same objects as core `v1` Events, stored once in the core
//! shape and converted field by field on the way in and out, as the real server does (so
//! `kubectl get events` shows what a kube-rs `Recorder` wrote).

use serde_json::{Map, Value, json};

use super::catalog::ResourceType;

/// (events.k8s.io/v1 field, core/v1 field) pairs that differ in name.
const RENAMED: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
];

/// Whether `rt` is the events.k8s.io/v1 view of Events.
pub fn is_events_v1(rt: &ResourceType) -> bool {
    rt.group == "events.k8s.io" && rt.plural == "events"
}

fn rename(obj: &Value, from_new: bool) -> Value {
    let Some(map) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::new();
    for (k, v) in map {
        let renamed = RENAMED.iter().find_map(|(new, core)| {
            if from_new && k == new {
                Some(*core)
            } else if !from_new && k == core {
                Some(*new)
            } else {
                None
            }
        });
        out.insert(renamed.unwrap_or(k).to_string(), v.clone());
    }
    Value::Object(out)
}

/// events.k8s.io/v1 shape to the stored core/v1 shape.
pub fn to_core(obj: &Value) -> Value {
    let mut out = rename(obj, true);
    out["apiVersion"] = json!("v1");
    out["kind"] = json!("Event");
    out
}

/// Stored core/v1 shape to the events.k8s.io/v1 shape.
pub fn to_events_v1(obj: &Value) -> Value {
    let mut out = rename(obj, false);
    out["apiVersion"] = json!("events.k8s.io/v1");
    out["kind"] = json!("Event");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_fields_map_to_the_core_names_and_back() {
        let new = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Node", "name": "n1"}, "note": "cordoned", "reason": "Cordon",
            "reportingController": "ttdp", "type": "Normal"});
        let core = to_core(&new);
        assert_eq!(core["involvedObject"]["name"], "n1");
        assert_eq!(core["message"], "cordoned");
        assert_eq!(core["reportingComponent"], "ttdp");
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(to_events_v1(&core), new);
    }
}
