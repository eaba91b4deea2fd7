//! Decoding built-in objects into their Go-equivalent types (k8s-openapi's), as the real server
//! does before anything else: a wrongly typed field is a 400 `cannot be handled as a Pod`, and
//! fields the type does not have are unknown (dropped, warned about, or rejected under
//! `fieldValidation=Strict`).

use k8s_openapi::api::{apps, coordination, core, policy};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::catalog::ResourceType;

fn roundtrip<T: DeserializeOwned + Serialize>(obj: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(obj.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// The object as its typed form serialises it, or the decode error. None for types without a
/// typed form here (custom resources).
fn typed(rt: &ResourceType, obj: &Value) -> Option<Result<Value, String>> {
    let out = match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => roundtrip::<core::v1::Pod>(obj),
        ("", "nodes") => roundtrip::<core::v1::Node>(obj),
        ("", "namespaces") => roundtrip::<core::v1::Namespace>(obj),
        ("", "events") => roundtrip::<core::v1::Event>(obj),
        ("", "serviceaccounts") => roundtrip::<core::v1::ServiceAccount>(obj),
        ("", "configmaps") => roundtrip::<core::v1::ConfigMap>(obj),
        ("", "secrets") => roundtrip::<core::v1::Secret>(obj),
        ("apps", "daemonsets") => roundtrip::<apps::v1::DaemonSet>(obj),
        ("apps", "deployments") => roundtrip::<apps::v1::Deployment>(obj),
        ("apps", "replicasets") => roundtrip::<apps::v1::ReplicaSet>(obj),
        ("apps", "controllerrevisions") => roundtrip::<apps::v1::ControllerRevision>(obj),
        ("policy", "poddisruptionbudgets") => roundtrip::<policy::v1::PodDisruptionBudget>(obj),
        ("coordination.k8s.io", "leases") => roundtrip::<coordination::v1::Lease>(obj),
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            roundtrip::<CustomResourceDefinition>(obj)
        }
        _ => return None,
    };
    Some(out)
}

/// Remove from `input` every non-null field `typed` does not have; returns their paths.
fn drop_unknown(input: &mut Value, typed: &Value, path: &str, unknown: &mut Vec<String>) {
    match (input, typed) {
        (Value::Object(map), Value::Object(known)) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                let child_path = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match known.get(&k) {
                    Some(t) => {
                        if let Some(child) = map.get_mut(&k) {
                            drop_unknown(child, t, &child_path, unknown);
                        }
                    }
                    None => {
                        if map.get(&k).is_some_and(|v| !v.is_null()) {
                            unknown.push(child_path);
                        }
                        map.remove(&k);
                    }
                }
            }
        }
        (Value::Array(items), Value::Array(known)) if items.len() == known.len() => {
            for (i, (item, t)) in items.iter_mut().zip(known).enumerate() {
                drop_unknown(item, t, &format!("{path}[{i}]"), unknown);
            }
        }
        _ => {}
    }
}

/// Check a built-in object against its type: Err(decode error) for wrongly typed fields,
/// otherwise the unknown fields (already removed from `obj`).
pub fn check(rt: &ResourceType, obj: &mut Value) -> Result<Vec<String>, String> {
    let Some(typed) = typed(rt, obj) else {
        return Ok(Vec::new());
    };
    let typed = typed?;
    let mut unknown = Vec::new();
    drop_unknown(obj, &typed, "", &mut unknown);
    Ok(unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::catalog::Catalog;
    use serde_json::json;

    #[test]
    fn wrong_types_fail_and_unknown_fields_are_reported_and_dropped() {
        let catalog = Catalog::builtin();
        let nodes = catalog.find("", "v1", "nodes").unwrap();
        let mut bad = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": 5}});
        assert!(check(nodes, &mut bad).is_err());
        let mut odd = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
            "spec": {"unschedulable": true, "colour": "red"}, "extra": 1});
        let unknown = check(nodes, &mut odd).unwrap();
        assert_eq!(unknown, ["extra", "spec.colour"]);
        assert_eq!(
            odd,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"unschedulable": true}})
        );
    }
}
