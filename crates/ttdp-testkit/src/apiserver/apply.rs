//! Server-side apply: merge an applied configuration into the live object, detect conflicts
//! with fields other managers own (409 unless forced), drop fields the applier stopped
//! applying, and record the applier's field set in `managedFields`.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::catalog::ResourceType;
use super::field_set::{FieldPath, display_path, fields_of, item_key, remove_at, value_at};
use super::list_keys::{ListKind, Merger, list_kind};
use super::managed_fields::{ManagerEntry, read, scope, write};
use super::meta;
use super::status::{ApiError, StatusCause};

/// Merge `applied` into `live` by structured-merge rules: objects field by field, list-maps by
/// key, sets by value, everything else replaced.
pub fn merge(rt: &ResourceType, live: &mut Value, applied: &Value, path: &mut Vec<String>) {
    match (live.as_object_mut(), applied) {
        (Some(target), Value::Object(patch)) => {
            for (k, v) in patch {
                if v.is_null() {
                    target.remove(k);
                    continue;
                }
                path.push(k.clone());
                match target.get_mut(k) {
                    Some(existing) => merge(rt, existing, v, path),
                    None => {
                        target.insert(k.clone(), v.clone());
                    }
                }
                path.pop();
            }
        }
        _ => match (live.as_array_mut(), applied) {
            (Some(target), Value::Array(items)) => match list_kind(rt, path, Merger::Apply) {
                ListKind::Map(keys) => {
                    // Index the live list once: applying n items to an n-item list stays linear.
                    let mut at: HashMap<String, usize> = HashMap::new();
                    for (i, t) in target.iter().enumerate() {
                        at.entry(item_key(t, &keys)).or_insert(i);
                    }
                    for item in items {
                        let key = item_key(item, &keys);
                        match at.get(&key) {
                            Some(&i) => merge(rt, &mut target[i], item, path),
                            None => {
                                at.insert(key, target.len());
                                target.push(item.clone());
                            }
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
                ListKind::Atomic => *live = applied.clone(),
            },
            _ => *live = applied.clone(),
        },
    }
}

/// Keep only the parts of `applied` that a write through `subresource` may change.
fn scoped(rt: &ResourceType, applied: &Value, subresource: &str) -> Value {
    let mut out = json!({});
    let Some(map) = applied.as_object() else {
        return out;
    };
    let (with_spec, with_status) = scope(rt, subresource);
    for (k, v) in map {
        let keep = match k.as_str() {
            "apiVersion" | "kind" | "metadata" => true,
            "status" => with_status,
            _ => with_spec,
        };
        if keep {
            out[k] = v.clone();
        }
    }
    if subresource == "status" {
        // Status applies may not change metadata beyond identifying the object.
        // A body without a name takes it from the URL (the stored object), as the real server does.
        out["metadata"] = match &applied["metadata"]["name"] {
            Value::Null => json!({}),
            name => json!({"name": name}),
        };
    }
    out
}

fn owned_by_other(entries: &[ManagerEntry], me: usize, path: &FieldPath) -> bool {
    let prefix: Vec<&String> = path.iter().filter(|e| *e != ".").collect();
    entries.iter().enumerate().any(|(i, e)| {
        i != me
            && e.fields.iter().any(|p| {
                p.len() >= prefix.len() && p.iter().zip(prefix.iter()).all(|(a, b)| a == *b)
            })
    })
}

/// Apply `applied` as `manager` onto `live` (None: the object does not exist yet). Returns the
/// new object, not yet admitted or stored.
pub fn apply(
    rt: &ResourceType,
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    subresource: &str,
) -> Result<Value, ApiError> {
    let applied = scoped(rt, applied, subresource);
    let (with_spec, with_status) = scope(rt, subresource);
    let applied_set = fields_of(rt, &applied, with_spec, with_status);
    let mut entries = live.map(read).unwrap_or_default();
    let mut merged = live.cloned().unwrap_or_else(|| json!({}));
    merge(rt, &mut merged, &applied, &mut Vec::new());

    let mut conflicts: Vec<(usize, FieldPath)> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        if entry.manager == manager {
            continue;
        }
        for path in entry.fields.intersection(&applied_set) {
            if path.last().map(String::as_str) == Some(".") {
                continue;
            }
            let before = live.and_then(|l| value_at(l, path));
            if before != value_at(&merged, path) {
                conflicts.push((i, path.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(&entries, &conflicts));
    }
    for (i, path) in &conflicts {
        entries[*i].fields.remove(path);
    }

    let mine = entries
        .iter()
        .position(|e| e.is(manager, "Apply", subresource));
    if let Some(me) = mine {
        let stopped: Vec<FieldPath> = entries[me]
            .fields
            .difference(&applied_set)
            .cloned()
            .collect();
        for path in stopped {
            if !owned_by_other(&entries, me, &path) {
                remove_at(&mut merged, &path);
            }
        }
    }
    // Fields this apply sets are no longer solely owned by the other managers when they agree on
    // the value; shared ownership is kept, as the real server does.
    let entry = ManagerEntry {
        manager: manager.to_string(),
        operation: "Apply".into(),
        api_version: rt.api_version(),
        time: meta::now(),
        subresource: subresource.to_string(),
        fields: applied_set,
    };
    match mine {
        Some(me) => {
            if entries[me].fields == entry.fields {
                entries[me].api_version = entry.api_version;
            } else {
                entries[me] = entry;
            }
        }
        None => entries.push(entry),
    }
    write(&mut merged, &entries);
    Ok(merged)
}

/// How the real server names a manager in conflict messages: applies by name, updates with
/// their apiVersion and time, both with the subresource when there is one.
fn print_manager(e: &ManagerEntry) -> String {
    let mut out = format!("{:?}", e.manager);
    if !e.subresource.is_empty() {
        out.push_str(&format!(" with subresource {:?}", e.subresource));
    }
    if e.operation == "Update" {
        out.push_str(&format!(" using {}", e.api_version));
        if !e.time.is_empty() {
            out.push_str(&format!(" at {}", e.time));
        }
    }
    out
}

fn conflict_error(entries: &[ManagerEntry], conflicts: &[(usize, FieldPath)]) -> ApiError {
    let causes: Vec<StatusCause> = conflicts
        .iter()
        .map(|(i, path)| StatusCause {
            reason: "FieldManagerConflict".into(),
            message: format!("conflict with {}", print_manager(&entries[*i])),
            field: Some(display_path(path)),
        })
        .collect();
    let message = if let [(i, path)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            print_manager(&entries[*i]),
            display_path(path)
        )
    } else {
        let mut managers: Vec<usize> = conflicts.iter().map(|(i, _)| *i).collect();
        managers.sort_by(|a, b| entries[*a].manager.cmp(&entries[*b].manager));
        managers.dedup();
        let mut lines = Vec::new();
        for m in managers {
            lines.push(format!("conflicts with {}:", print_manager(&entries[m])));
            for (_, path) in conflicts.iter().filter(|(i, _)| *i == m) {
                lines.push(format!("- {}", display_path(path)));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let mut err = ApiError::conflict_plain(message);
    err.causes = causes;
    err
}
