//! Structural OpenAPI v3 schema validation of custom resources, with the real server's pruning
//! of unknown fields and its error messages (`spec.x: Invalid value: ...`).

use std::collections::HashSet;

use regex::Regex;
use serde_json::{Map, Value};

use super::status::StatusCause;

fn cause(reason: &str, field: &str, message: String) -> StatusCause {
    StatusCause {
        reason: reason.into(),
        message,
        field: Some(field.to_string()),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn shown(v: &Value) -> String {
    match v {
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// Whether list item `i` is walked again: `None` when the update left it as it was (equal to
/// the stored object's counterpart), since it was defaulted, pruned and validated when it was
/// stored (on an update of a status listing thousands of nodes, most items are unchanged; like
/// the real server's validation ratcheting, an unchanged item is not failed for rules added
/// since). Otherwise `Some` of the stored counterpart, if any, to walk it with.
fn changed<'o>(old: Option<&'o Value>, i: usize, item: &Value) -> Option<Option<&'o Value>> {
    let old_item = old.and_then(|o| o.get(i));
    (old_item != Some(item)).then_some(old_item)
}

/// Fill in the schema's `default`s for absent fields, in place (kube-cel's `apply_defaults`
/// semantics without copying the object at every level: a default is not itself defaulted;
/// `x-kubernetes-preserve-unknown-fields` turns `additionalProperties` off). `old` is the
/// stored object on an update: list items it has unchanged are skipped.
pub fn apply_defaults(schema: &Value, value: &mut Value, old: Option<&Value>) {
    match value {
        Value::Object(map) => {
            let props = schema["properties"].as_object();
            let additional = Some(&schema["additionalProperties"]).filter(|a| {
                a.is_object()
                    && schema["x-kubernetes-preserve-unknown-fields"].as_bool() != Some(true)
            });
            for (key, child) in map.iter_mut() {
                if let Some(child_schema) = props.and_then(|p| p.get(key)).or(additional) {
                    apply_defaults(child_schema, child, old.and_then(|o| o.get(key)));
                }
            }
            for (key, prop) in props.into_iter().flatten() {
                if let Some(default) = prop.get("default")
                    && !map.contains_key(key)
                {
                    map.insert(key.clone(), default.clone());
                }
            }
        }
        Value::Array(items) if schema.get("items").is_some() => {
            for (i, item) in items.iter_mut().enumerate() {
                if let Some(old_item) = changed(old, i, item) {
                    apply_defaults(&schema["items"], item, old_item);
                }
            }
        }
        _ => {}
    }
}

/// Remove fields the schema does not declare (unless `x-kubernetes-preserve-unknown-fields`).
/// Returns the removed paths. The root's `apiVersion`, `kind` and `metadata` are kept. List
/// items `old` (the stored object) has unchanged are skipped.
pub fn prune(
    schema: &Value,
    value: &mut Value,
    path: &str,
    old: Option<&Value>,
    removed: &mut Vec<String>,
) {
    if schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
        && schema["properties"].is_null()
    {
        return;
    }
    match value {
        Value::Object(map) => {
            let props = schema["properties"].as_object();
            let additional = &schema["additionalProperties"];
            let preserve = schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true);
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                let at_root_meta =
                    path.is_empty() && matches!(k.as_str(), "apiVersion" | "kind" | "metadata");
                if at_root_meta {
                    continue;
                }
                let child_path = join(path, &k);
                let old_child = old.and_then(|o| o.get(&k));
                if let Some(child_schema) = props.and_then(|p| p.get(&k)) {
                    if let Some(child) = map.get_mut(&k) {
                        prune(child_schema, child, &child_path, old_child, removed);
                    }
                } else if additional.is_object() {
                    if let Some(child) = map.get_mut(&k) {
                        prune(additional, child, &child_path, old_child, removed);
                    }
                } else if additional.as_bool() == Some(true) || preserve {
                } else {
                    map.remove(&k);
                    removed.push(child_path);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                if let Some(old_item) = changed(old, i, item) {
                    prune(
                        &schema["items"],
                        item,
                        &format!("{path}[{i}]"),
                        old_item,
                        removed,
                    );
                }
            }
        }
        _ => {}
    }
}

/// Validate `value` against `schema`; `path` is the field path so far ("" at the root). List
/// items `old` (the stored object) has unchanged are not validated again.
pub fn validate(
    schema: &Value,
    value: &Value,
    path: &str,
    old: Option<&Value>,
    out: &mut Vec<StatusCause>,
) {
    if value.is_null() {
        if schema["nullable"].as_bool() != Some(true) && !path.is_empty() {
            out.push(cause(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    let int_or_string = schema["x-kubernetes-int-or-string"].as_bool() == Some(true);
    if let Some(want) = schema["type"].as_str() {
        let actual = type_name(value);
        let ok = actual == want || (want == "number" && actual == "integer");
        if !ok && !int_or_string {
            out.push(cause(
                "FieldValueTypeInvalid",
                path,
                format!("Invalid value: \"{actual}\": {path} in body must be of type {want}: \"{actual}\""),
            ));
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        let list = allowed
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        out.push(cause(
            "FieldValueNotSupported",
            path,
            format!(
                "Unsupported value: {}: supported values: {list}",
                shown(value)
            ),
        ));
    }
    match value {
        Value::String(s) => validate_string(schema, s, value, path, out),
        Value::Number(n) => {
            validate_number(schema, n.as_f64().unwrap_or_default(), value, path, out)
        }
        Value::Array(items) => {
            if let Some(max) = schema["maxItems"].as_u64()
                && items.len() as u64 > max
            {
                out.push(cause(
                    "FieldValueTooMany",
                    path,
                    format!("Too many: {}: must have at most {max} items", items.len()),
                ));
            }
            if let Some(min) = schema["minItems"].as_u64()
                && (items.len() as u64) < min
            {
                out.push(cause(
                    "FieldValueInvalid",
                    path,
                    format!(
                        "Invalid value: {}: {path} in body should have at least {min} items",
                        items.len()
                    ),
                ));
            }
            for (i, item) in items.iter().enumerate() {
                if let Some(old_item) = changed(old, i, item) {
                    validate(
                        &schema["items"],
                        item,
                        &format!("{path}[{i}]"),
                        old_item,
                        out,
                    );
                }
            }
            validate_list_map_keys(schema, items, path, out);
        }
        Value::Object(map) => validate_object(schema, map, path, old, out),
        _ => {}
    }
}

fn validate_string(schema: &Value, s: &str, value: &Value, path: &str, out: &mut Vec<StatusCause>) {
    if let Some(max) = schema["maxLength"].as_u64()
        && s.chars().count() as u64 > max
    {
        out.push(cause(
            "FieldValueTooLong",
            path,
            format!("Too long: may not be more than {max} bytes"),
        ));
    }
    if let Some(min) = schema["minLength"].as_u64()
        && (s.chars().count() as u64) < min
    {
        out.push(cause(
            "FieldValueInvalid",
            path,
            format!("Invalid value: {value}: {path} in body should be at least {min} chars long"),
        ));
    }
    if let Some(pattern) = schema["pattern"].as_str() {
        match Regex::new(pattern) {
            Ok(re) if re.is_match(s) => {}
            _ => out.push(cause(
                "FieldValueInvalid",
                path,
                format!("Invalid value: {value}: {path} in body should match '{pattern}'"),
            )),
        }
    }
}

fn validate_number(schema: &Value, n: f64, value: &Value, path: &str, out: &mut Vec<StatusCause>) {
    if let Some(min) = schema["minimum"].as_f64() {
        let exclusive = schema["exclusiveMinimum"].as_bool() == Some(true);
        if n < min || (exclusive && n == min) {
            let rel = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            out.push(cause(
                "FieldValueInvalid",
                path,
                format!(
                    "Invalid value: {value}: {path} in body should be {rel} {}",
                    schema["minimum"]
                ),
            ));
        }
    }
    if let Some(max) = schema["maximum"].as_f64() {
        let exclusive = schema["exclusiveMaximum"].as_bool() == Some(true);
        if n > max || (exclusive && n == max) {
            let rel = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            out.push(cause(
                "FieldValueInvalid",
                path,
                format!(
                    "Invalid value: {value}: {path} in body should be {rel} {}",
                    schema["maximum"]
                ),
            ));
        }
    }
}

fn validate_object(
    schema: &Value,
    map: &Map<String, Value>,
    path: &str,
    old: Option<&Value>,
    out: &mut Vec<StatusCause>,
) {
    for required in schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(required) {
            out.push(cause(
                "FieldValueRequired",
                &join(path, required),
                "Required value".into(),
            ));
        }
    }
    if let Some(max) = schema["maxProperties"].as_u64()
        && map.len() as u64 > max
    {
        out.push(cause(
            "FieldValueTooMany",
            path,
            format!("Too many: {}: must have at most {max} items", map.len()),
        ));
    }
    let props = schema["properties"].as_object();
    for (k, v) in map {
        if path.is_empty() && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let child = join(path, k);
        let old_child = old.and_then(|o| o.get(k));
        match props.and_then(|p| p.get(k)) {
            Some(s) => validate(s, v, &child, old_child, out),
            None if schema["additionalProperties"].is_object() => {
                validate(&schema["additionalProperties"], v, &child, old_child, out)
            }
            None => {}
        }
    }
}

fn validate_list_map_keys(schema: &Value, items: &[Value], path: &str, out: &mut Vec<StatusCause>) {
    match schema["x-kubernetes-list-type"].as_str() {
        Some("map") => {
            let keys: Vec<&str> = schema["x-kubernetes-list-map-keys"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            // Keys as their JSON text: a status can list thousands of entries.
            let mut seen: HashSet<String> = HashSet::new();
            for (i, item) in items.iter().enumerate() {
                let key: Vec<&Value> = keys.iter().map(|k| &item[*k]).collect();
                let text: Vec<String> = key.iter().map(|v| v.to_string()).collect();
                if !seen.insert(text.join(",")) {
                    let shown_key = keys
                        .iter()
                        .zip(&key)
                        .map(|(k, v)| format!("\"{k}\":{v}"))
                        .collect::<Vec<_>>()
                        .join(",");
                    out.push(cause(
                        "FieldValueDuplicate",
                        &format!("{path}[{i}]"),
                        format!("Duplicate value: map[string]interface {{}}{{{shown_key}}}"),
                    ));
                }
            }
        }
        Some("set") => {
            let mut seen: HashSet<String> = HashSet::new();
            for (i, item) in items.iter().enumerate() {
                if !seen.insert(item.to_string()) {
                    out.push(cause(
                        "FieldValueDuplicate",
                        &format!("{path}[{i}]"),
                        format!("Duplicate value: {item}"),
                    ));
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pattern_required_and_type_errors_name_the_field() {
        let schema = json!({"type": "object", "properties": {"spec": {
            "type": "object",
            "required": ["version"],
            "properties": {
                "version": {"type": "string", "pattern": "^[0-9]+[.][0-9]+$"},
                "max": {"type": "integer", "minimum": 1}
            }
        }}});
        let mut out = Vec::new();
        validate(&schema, &json!({"spec": {"max": 0}}), "", None, &mut out);
        validate(
            &schema,
            &json!({"spec": {"version": "x", "max": "a"}}),
            "",
            None,
            &mut out,
        );
        let fields: Vec<_> = out.iter().map(|c| c.field.clone().unwrap()).collect();
        // Fields are visited in key order, as the object map is sorted.
        assert_eq!(
            fields,
            ["spec.version", "spec.max", "spec.max", "spec.version"]
        );
        assert_eq!(
            out[3].message,
            "Invalid value: \"x\": spec.version in body should match '^[0-9]+[.][0-9]+$'"
        );
    }

    #[test]
    fn unknown_fields_are_pruned() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}}}}});
        let mut obj = json!({"apiVersion": "x/v1", "spec": {"a": "1", "b": 2}});
        let mut removed = Vec::new();
        prune(&schema, &mut obj, "", None, &mut removed);
        assert_eq!(obj, json!({"apiVersion": "x/v1", "spec": {"a": "1"}}));
        assert_eq!(removed, ["spec.b"]);
    }

    #[test]
    fn list_items_an_update_leaves_unchanged_are_not_walked_again() {
        let schema = json!({"type": "object", "properties": {"items": {"type": "array", "items": {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 1}, "d": {"type": "string", "default": "x"}}
        }}}});
        // The stored object has an item that no longer passes (a rule added since): it is
        // ratcheted while unchanged; the new and the changed items are checked and defaulted.
        let old = json!({"items": [{"n": 0, "d": "x"}, {"n": 1, "d": "x"}]});
        let mut new = json!({"items": [{"n": 0, "d": "x"}, {"n": 0}, {"n": 2, "e": true}]});
        apply_defaults(&schema, &mut new, Some(&old));
        let mut removed = Vec::new();
        prune(&schema, &mut new, "", Some(&old), &mut removed);
        let mut out = Vec::new();
        validate(&schema, &new, "", Some(&old), &mut out);
        assert_eq!(
            new,
            json!({"items": [{"n": 0, "d": "x"}, {"n": 0, "d": "x"}, {"n": 2, "d": "x"}]})
        );
        assert_eq!(removed, ["items[2].e"]);
        let fields: Vec<_> = out.iter().map(|c| c.field.clone().unwrap()).collect();
        assert_eq!(fields, ["items[1].n"]);
    }
}
