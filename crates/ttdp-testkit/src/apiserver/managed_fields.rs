//! `metadata.managedFields`: which field manager owns which fields, updated on every write the
//! way the real server's field manager does (updates take ownership of what they change without
//! conflicts; applies are handled in [`super::apply`]).

use serde_json::{Value, json};

use super::catalog::ResourceType;
use super::field_set::{FieldSet, fields_of, from_fields_v1, to_fields_v1, value_at};
use super::meta;

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagerEntry {
    /// Field manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `apiVersion` the manager used.
    pub api_version: String,
    /// Last time the entry's set changed.
    pub time: String,
    /// `status` or "" (main resource).
    pub subresource: String,
    /// Owned leaf fields.
    pub fields: FieldSet,
}

impl ManagerEntry {
    /// Whether this entry belongs to `manager` doing `operation` on `subresource`.
    pub fn is(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }
}

/// Read the entries of an object.
pub fn read(obj: &Value) -> Vec<ManagerEntry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| ManagerEntry {
            manager: e["manager"].as_str().unwrap_or_default().to_string(),
            operation: e["operation"].as_str().unwrap_or("Update").to_string(),
            api_version: e["apiVersion"].as_str().unwrap_or_default().to_string(),
            time: e["time"].as_str().unwrap_or_default().to_string(),
            subresource: e["subresource"].as_str().unwrap_or_default().to_string(),
            fields: from_fields_v1(&e["fieldsV1"]),
        })
        .collect()
}

/// Write entries back (empty ones dropped; no entries removes the field).
pub fn write(obj: &mut Value, entries: &[ManagerEntry]) {
    let rendered: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if rendered.is_empty() {
        meta::remove(obj, "managedFields");
    } else {
        meta::set(obj, "managedFields", Value::Array(rendered));
    }
}

/// Which parts of an object a write through `subresource` manages: (spec-like, status).
pub fn scope(rt: &ResourceType, subresource: &str) -> (bool, bool) {
    if subresource == "status" {
        (false, true)
    } else {
        (true, !rt.status_subresource)
    }
}

/// Record a non-apply write (create, update, patch) by `manager`: it takes ownership of every
/// field it changed, fields it removed leave every manager's set.
pub fn record_update(
    rt: &ResourceType,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: &str,
) {
    // A request that carries managedFields different from the stored ones replaces them (how
    // kubectl migrates client-side-apply ownership); absent or unchanged ones keep the stored.
    let sent = &new["metadata"]["managedFields"];
    let stored = old.map(|o| &o["metadata"]["managedFields"]);
    let mut entries = match stored {
        Some(stored) if sent.is_array() && sent != stored => read(new),
        _ => old.map(read).unwrap_or_default(),
    };
    let (with_spec, with_status) = scope(rt, subresource);
    let new_set = fields_of(rt, new, with_spec, with_status);
    let old_set = old
        .map(|o| fields_of(rt, o, with_spec, with_status))
        .unwrap_or_default();
    let changed: FieldSet = new_set
        .iter()
        .filter(|p| match old {
            None => true,
            Some(o) => {
                let was = value_at(o, p);
                was.is_none()
                    || (p.last().map(String::as_str) != Some(".") && was != value_at(new, p))
            }
        })
        .cloned()
        .collect();
    let removed: FieldSet = old_set.difference(&new_set).cloned().collect();
    for entry in &mut entries {
        entry.fields.retain(|p| !removed.contains(p));
        if !entry.is(manager, "Update", subresource) {
            entry.fields.retain(|p| !changed.contains(p));
        }
    }
    if !changed.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.is(manager, "Update", subresource))
        {
            Some(e) => {
                e.fields.extend(changed);
                e.time = meta::now();
                e.api_version = rt.api_version();
            }
            None => entries.push(ManagerEntry {
                manager: manager.to_string(),
                operation: "Update".into(),
                api_version: rt.api_version(),
                time: meta::now(),
                subresource: subresource.to_string(),
                fields: changed,
            }),
        }
    }
    write(new, &entries);
}
