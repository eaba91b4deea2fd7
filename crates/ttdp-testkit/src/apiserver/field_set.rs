//! Field sets as server-side apply tracks them in `metadata.managedFields` (`FieldsV1`):
//! paths of `f:<field>`, `k:<keys json>` (list-map items), `v:<value json>` (set items) and `.`
//! (the list item itself), computed from objects with the list semantics of [`super::list_keys`].

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::catalog::ResourceType;
use super::list_keys::{ListKind, Merger, list_kind};

/// One path to a leaf field.
pub type FieldPath = Vec<String>;

/// A set of leaf paths.
pub type FieldSet = BTreeSet<FieldPath>;

/// Metadata fields the server owns; never part of any manager's set.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "generateName",
];

/// The `k:` element for a list-map item.
pub fn item_key(item: &Value, keys: &[String]) -> String {
    let mut m = Map::new();
    for k in keys {
        if let Some(v) = item.get(k) {
            m.insert(k.clone(), v.clone());
        }
    }
    format!("k:{}", Value::Object(m))
}

fn field_names(path: &[String]) -> Vec<String> {
    path.iter()
        .filter_map(|p| p.strip_prefix("f:").map(str::to_string))
        .collect()
}

/// The leaf field set of `obj` (a whole object; server-owned metadata, `apiVersion`, `kind`
/// excluded; `status` included only when `with_status`, `spec`-like fields only when
/// `with_spec`).
pub fn fields_of(rt: &ResourceType, obj: &Value, with_spec: bool, with_status: bool) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = obj.as_object() else {
        return out;
    };
    for (k, v) in map {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                if let Some(meta) = v.as_object() {
                    for (mk, mv) in meta {
                        if !SERVER_METADATA.contains(&mk.as_str()) {
                            collect(
                                rt,
                                mv,
                                vec!["f:metadata".into(), format!("f:{mk}")],
                                &mut out,
                            );
                        }
                    }
                }
            }
            "status" if !with_status => {}
            "status" => collect(rt, v, vec![format!("f:{k}")], &mut out),
            _ if with_spec => collect(rt, v, vec![format!("f:{k}")], &mut out),
            _ => {}
        }
    }
    out
}

fn collect(rt: &ResourceType, value: &Value, path: FieldPath, out: &mut FieldSet) {
    match value {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                let mut p = path.clone();
                p.push(format!("f:{k}"));
                collect(rt, v, p, out);
            }
        }
        Value::Array(items) => match list_kind(rt, &field_names(&path), Merger::Apply) {
            ListKind::Map(keys) => {
                for item in items {
                    let mut item_path = path.clone();
                    item_path.push(item_key(item, &keys));
                    let mut dot = item_path.clone();
                    dot.push(".".into());
                    out.insert(dot);
                    if let Some(m) = item.as_object() {
                        for (k, v) in m {
                            let mut p = item_path.clone();
                            p.push(format!("f:{k}"));
                            collect(rt, v, p, out);
                        }
                    }
                }
            }
            ListKind::Set => {
                for item in items {
                    let mut p = path.clone();
                    p.push(format!("v:{item}"));
                    out.insert(p);
                }
            }
            ListKind::Atomic => {
                out.insert(path);
            }
        },
        _ => {
            out.insert(path);
        }
    }
}

/// The value at a path, if present.
pub fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut current = obj;
    for element in path {
        if element == "." {
            continue;
        }
        current = step(current, element)?;
    }
    Some(current)
}

fn step<'a>(current: &'a Value, element: &str) -> Option<&'a Value> {
    if let Some(field) = element.strip_prefix("f:") {
        current.get(field)
    } else if let Some(keys) = element.strip_prefix("k:") {
        let keys: Map<String, Value> = serde_json::from_str(keys).ok()?;
        current
            .as_array()?
            .iter()
            .find(|item| keys.iter().all(|(k, v)| item.get(k) == Some(v)))
    } else if let Some(v) = element.strip_prefix("v:") {
        let v: Value = serde_json::from_str(v).ok()?;
        current.as_array()?.iter().find(|item| **item == v)
    } else {
        None
    }
}

/// Remove the field at `path` from `obj` (a no-op when absent).
pub fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    if last == "." {
        // Removing a list item: its parent path ends with the `k:` element.
        remove_at(obj, parents);
        return;
    }
    let mut current = obj;
    for element in parents {
        if element == "." {
            continue;
        }
        let next = if let Some(field) = element.strip_prefix("f:") {
            current.get_mut(field)
        } else if let Some(keys) = element.strip_prefix("k:") {
            let Ok(keys) = serde_json::from_str::<Map<String, Value>>(keys) else {
                return;
            };
            current.as_array_mut().and_then(|a| {
                a.iter_mut()
                    .find(|item| keys.iter().all(|(k, v)| item.get(k) == Some(v)))
            })
        } else {
            None
        };
        match next {
            Some(n) => current = n,
            None => return,
        }
    }
    if let Some(field) = last.strip_prefix("f:") {
        if let Some(m) = current.as_object_mut() {
            m.remove(field);
        }
    } else if let Some(keys) = last.strip_prefix("k:") {
        if let (Ok(keys), Some(a)) = (
            serde_json::from_str::<Map<String, Value>>(keys),
            current.as_array_mut(),
        ) {
            a.retain(|item| !keys.iter().all(|(k, v)| item.get(k) == Some(v)));
        }
    } else if let Some(v) = last.strip_prefix("v:")
        && let (Ok(v), Some(a)) = (serde_json::from_str::<Value>(v), current.as_array_mut())
    {
        a.retain(|item| *item != v);
    }
}

/// Render a field set as `FieldsV1` JSON.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for element in path {
            let entry = node
                .entry(element.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            match entry {
                Value::Object(m) => node = m,
                _ => break,
            }
        }
    }
    Value::Object(root)
}

/// Parse `FieldsV1` JSON into a field set.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    walk_v1(v, &mut Vec::new(), &mut out);
    out
}

fn walk_v1(v: &Value, path: &mut FieldPath, out: &mut FieldSet) {
    let Some(m) = v.as_object() else { return };
    for (k, child) in m {
        path.push(k.clone());
        if child.as_object().is_some_and(Map::is_empty) {
            out.insert(path.clone());
        } else {
            walk_v1(child, path, out);
        }
        path.pop();
    }
}

/// The path rendered the way conflict messages show it: `.spec.replicas`,
/// `.status.nodes[name="n1"].state`.
pub fn display_path(path: &[String]) -> String {
    let mut out = String::new();
    for element in path {
        if let Some(f) = element.strip_prefix("f:") {
            out.push('.');
            out.push_str(f);
        } else if let Some(k) = element.strip_prefix("k:") {
            let keys: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let inner = keys
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            out.push_str(&format!("[{inner}]"));
        } else if let Some(v) = element.strip_prefix("v:") {
            out.push_str(&format!("[={v}]"));
        }
    }
    out
}
