//! Non-apply patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge
//! patch (keyed list merges and the `$patch`, `$retainKeys`, `$setElementOrder`,
//! `$deleteFromPrimitiveList` directives).

use serde_json::Value;

use super::catalog::ResourceType;
use super::list_keys::{ListKind, Merger, list_kind};
use super::status::ApiError;

/// The patch formats, by request `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchType {
    /// Parse a `Content-Type` header value.
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(Self::Apply),
            _ => Err(ApiError::unsupported_media_type(ct)),
        }
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Default::default());
            }
            if let Some(t) = target.as_object_mut() {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// RFC 6902 JSON patch; a failed operation (e.g. a failed `test`) is 422, as on the real server.
pub fn json_patch(target: &mut Value, patch: Value) -> Result<(), ApiError> {
    let mut ops: json_patch::Patch = serde_json::from_value(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    // The real server (evanphx/json-patch) treats a missing path as null in `test`, so
    // `{"op":"test","path":"/metadata/finalizers","value":null}` passes on an object without
    // finalizers (kube-runtime's finalizer helper sends exactly that).
    ops.0.retain(|op| match op {
        json_patch::PatchOperation::Test(t) => {
            !(t.value.is_null() && target.pointer(t.path.as_str()).is_none())
        }
        _ => true,
    });
    // Not atomic (no copy of the whole object first): on an error the caller drops `target`.
    json_patch::patch_unsafe(target, &ops).map_err(|e| ApiError {
        code: 422,
        reason: "Invalid",
        message: format!("the server rejected our request due to an error in our request: {e}"),
        details: None,
        causes: Vec::new(),
        retry_after_seconds: None,
    })
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// Strategic merge patch for built-in types.
pub fn strategic_merge(
    rt: &ResourceType,
    target: &mut Value,
    patch: &Value,
    path: &mut Vec<String>,
) {
    let Value::Object(p) = patch else {
        *target = strip_directives(patch);
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip_directives(patch);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Some(t) = target.as_object_mut() else {
        return;
    };
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(list), Some(remove)) =
                (t.get_mut(field).and_then(Value::as_array_mut), v.as_array())
            {
                list.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        path.push(k.clone());
        match v {
            Value::Array(items) => {
                let existing = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                merge_list(rt, existing, items, path);
            }
            Value::Object(inner)
                if inner.get("$patch").and_then(Value::as_str) == Some("delete") =>
            {
                t.remove(k);
            }
            Value::Object(_) => {
                let existing = t.entry(k.clone()).or_insert(Value::Null);
                strategic_merge(rt, existing, v, path);
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
        path.pop();
    }
    if let Some(retain) = p.get("$retainKeys").and_then(Value::as_array) {
        t.retain(|k, _| retain.iter().any(|r| r.as_str() == Some(k)));
    }
}

fn merge_list(rt: &ResourceType, existing: &mut Value, items: &[Value], path: &mut Vec<String>) {
    if !existing.is_array() {
        *existing = Value::Array(Vec::new());
    }
    let Some(target) = existing.as_array_mut() else {
        return;
    };
    match list_kind(rt, path, Merger::Strategic) {
        ListKind::Map(keys) => {
            if items
                .iter()
                .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
            {
                *target = items
                    .iter()
                    .filter(|i| i.get("$patch").is_none())
                    .map(strip_directives)
                    .collect();
                return;
            }
            let Some(key) = keys.first() else { return };
            for item in items {
                let id = item.get(key);
                let found = target.iter().position(|t| t.get(key) == id);
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    target.retain(|t| t.get(key) != id);
                    continue;
                }
                match found {
                    Some(i) => strategic_merge(rt, &mut target[i], item, path),
                    None => target.push(strip_directives(item)),
                }
            }
        }
        ListKind::Set => {
            for item in items {
                if !target.contains(item) {
                    target.push(item.clone());
                }
            }
        }
        ListKind::Atomic => *target = items.iter().map(strip_directives).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::catalog::Catalog;
    use serde_json::json;

    #[test]
    fn strategic_merge_merges_containers_by_name_and_deletes_with_directive() {
        let catalog = Catalog::builtin();
        let pods = catalog.find("", "v1", "pods").unwrap();
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}
        ]}});
        let patch = json!({"spec": {"containers": [
            {"name": "a", "env": [{"name": "Y", "value": "2"}]},
            {"name": "b", "$patch": "delete"}
        ]}});
        strategic_merge(pods, &mut pod, &patch, &mut Vec::new());
        assert_eq!(
            pod,
            json!({"spec": {"containers": [
                {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}
            ]}})
        );
    }

    #[test]
    fn merge_patch_null_removes_a_field() {
        let mut obj = json!({"spec": {"unschedulable": true, "podCIDR": "x"}});
        merge_patch(&mut obj, &json!({"spec": {"unschedulable": null}}));
        assert_eq!(obj, json!({"spec": {"podCIDR": "x"}}));
    }
}
