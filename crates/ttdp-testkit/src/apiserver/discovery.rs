//! Discovery documents: `/api`, `/apis` and the per-group-version resource lists, generated
//! from the catalog (so CRDs appear as soon as they are created). Aggregated discovery is not
//! served (kubectl falls back to these documents), nor are `/version` and `/apis/<group>`,
//! which no client of the demo reads.

use serde_json::{Value, json};

use super::catalog::{Catalog, ResourceType};

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// `/apis`.
pub fn group_list(catalog: &Catalog) -> Value {
    let groups: Vec<Value> = catalog
        .groups()
        .iter()
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The verbs of every served resource (neither update nor deletecollection is served).
const VERBS: &[&str] = &["create", "delete", "get", "list", "patch", "watch"];

fn resource(rt: &ResourceType) -> Value {
    let mut r = json!({
        "name": rt.plural,
        "singularName": rt.kind.to_lowercase(),
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": VERBS,
    });
    if !rt.short_names.is_empty() {
        r["shortNames"] = json!(rt.short_names);
    }
    r
}

fn subresource(rt: &ResourceType, name: &str, kind: &str, verbs: &[&str]) -> Value {
    json!({
        "name": format!("{}/{name}", rt.plural),
        "singularName": "",
        "namespaced": rt.namespaced,
        "kind": kind,
        "verbs": verbs,
    })
}

/// `/api/v1` or `/apis/<group>/<version>`, None when not served.
pub fn resource_list(catalog: &Catalog, group: &str, version: &str) -> Option<Value> {
    if !catalog.has_group_version(group, version) {
        return None;
    }
    let mut resources = Vec::new();
    for rt in catalog
        .all()
        .iter()
        .filter(|t| t.group == group && t.version == version)
    {
        resources.push(resource(rt));
        if rt.status_subresource {
            resources.push(subresource(rt, "status", &rt.kind, &["get", "patch"]));
        }
        if rt.is("", "pods") {
            let mut eviction = subresource(rt, "eviction", "Eviction", &["create"]);
            eviction["group"] = json!("policy");
            eviction["version"] = json!("v1");
            resources.push(eviction);
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}
