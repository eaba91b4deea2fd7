//! Discovery documents: `/api`, `/apis` and the per-group-version resource lists, generated
//! from the served types (so CRDs appear as soon as they are created). Aggregated discovery is not
//! served (kubectl falls back to these documents), nor are `/version` and `/apis/<group>`,
//! which no client of the demo reads.

use serde_json::{Value, json};

use super::catalog::ResourceType;

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// `/apis`: every group but core, in the order served, each with its versions.
pub fn group_list(served: &[ResourceType]) -> Value {
    let mut groups: Vec<(&str, Vec<Value>)> = Vec::new();
    for t in served.iter().filter(|t| !t.group.is_empty()) {
        let version = json!({"groupVersion": t.api_version(), "version": t.version});
        match groups.iter_mut().find(|(g, _)| *g == t.group) {
            Some((_, versions)) if !versions.contains(&version) => versions.push(version),
            Some(_) => {}
            None => groups.push((&t.group, vec![version])),
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(name, vs)| json!({"name": name, "preferredVersion": vs[0], "versions": vs}))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The verbs of every served resource (neither update nor deletecollection is served).
const VERBS: &[&str] = &["create", "delete", "get", "list", "patch", "watch"];

/// A resource's entries: itself, its `status` and a pod's `eviction` (which kubectl drain
/// looks for).
fn entries(rt: &ResourceType) -> Vec<Value> {
    let mut main = json!({
        "name": rt.plural,
        "singularName": rt.kind.to_lowercase(),
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": VERBS,
    });
    if !rt.short_names.is_empty() {
        main["shortNames"] = json!(rt.short_names);
    }
    let sub = |name: &str, kind: &str, verbs: &[&str]| {
        let name = format!("{}/{name}", rt.plural);
        json!({"name": name, "singularName": "", "namespaced": rt.namespaced, "kind": kind, "verbs": verbs})
    };
    let mut entries = vec![main];
    if rt.status_subresource {
        entries.push(sub("status", &rt.kind, &["get", "patch"]));
    }
    if rt.is("", "pods") {
        let mut eviction = sub("eviction", "Eviction", &["create"]);
        eviction["group"] = json!("policy");
        eviction["version"] = json!("v1");
        entries.push(eviction);
    }
    entries
}

/// `/api/v1` or `/apis/<group>/<version>`, None when not served.
pub fn resource_list(served: &[ResourceType], group: &str, version: &str) -> Option<Value> {
    let types = || {
        served
            .iter()
            .filter(|t| t.group == group && t.version == version)
    };
    let first = types().next()?;
    let resources: Vec<Value> = types().flat_map(entries).collect();
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": first.api_version(),
        "resources": resources,
    }))
}
