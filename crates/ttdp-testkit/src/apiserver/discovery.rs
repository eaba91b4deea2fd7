//! Discovery documents: `/version`, `/api`, `/apis`, `/apis/<group>`, the per-group-version
//! resource lists, and the aggregated discovery (`apidiscovery.k8s.io/v2`) that kubectl asks for
//! first, all generated from the catalog (so CRDs appear as soon as they are created).

use serde_json::{Value, json};

use super::catalog::{Catalog, ResourceType};

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "emulationMajor": "1",
        "emulationMinor": "35",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "34",
        "gitVersion": "v1.35.0-ttdp-testkit",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

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

/// `/apis/<group>`, None when the group is not served.
pub fn group(catalog: &Catalog, name: &str) -> Option<Value> {
    catalog
        .groups()
        .into_iter()
        .find(|(g, _)| g == name)
        .map(|(g, vs)| {
            let mut v = group_json(&g, &vs);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            v
        })
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// One subresource as discovery lists it.
struct Subresource {
    name: &'static str,
    kind: String,
    verbs: &'static [&'static str],
    /// Group and version of the kind when it differs from the parent's (eviction).
    group_version: Option<(&'static str, &'static str)>,
}

fn subresources(rt: &ResourceType) -> Vec<Subresource> {
    let mut out = Vec::new();
    if rt.status_subresource {
        out.push(Subresource {
            name: "status",
            kind: rt.kind.clone(),
            verbs: &["get", "patch", "update"],
            group_version: None,
        });
    }
    if rt.group.is_empty() && rt.plural == "pods" {
        out.push(Subresource {
            name: "eviction",
            kind: "Eviction".into(),
            verbs: &["create"],
            group_version: Some(("policy", "v1")),
        });
        out.push(Subresource {
            name: "binding",
            kind: "Binding".into(),
            verbs: &["create"],
            group_version: None,
        });
    }
    out
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
        let mut r = json!({
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": VERBS,
        });
        if !rt.short_names.is_empty() {
            r["shortNames"] = json!(rt.short_names);
        }
        if !rt.categories.is_empty() {
            r["categories"] = json!(rt.categories);
        }
        resources.push(r);
        for sub in subresources(rt) {
            let mut s = json!({
                "name": format!("{}/{}", rt.plural, sub.name),
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": sub.kind,
                "verbs": sub.verbs,
            });
            if let Some((g, v)) = sub.group_version {
                s["group"] = json!(g);
                s["version"] = json!(v);
            }
            resources.push(s);
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

fn aggregated_resource(rt: &ResourceType) -> Value {
    let mut r = json!({
        "resource": rt.plural,
        "responseKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "scope": if rt.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": rt.singular,
        "verbs": VERBS,
    });
    if !rt.short_names.is_empty() {
        r["shortNames"] = json!(rt.short_names);
    }
    if !rt.categories.is_empty() {
        r["categories"] = json!(rt.categories);
    }
    let subs: Vec<Value> = subresources(rt)
        .into_iter()
        .map(|sub| {
            let (g, v) = sub.group_version.unwrap_or((rt.group.as_str(), rt.version.as_str()));
            json!({"subresource": sub.name, "responseKind": {"group": g, "version": v, "kind": sub.kind}, "verbs": sub.verbs})
        })
        .collect();
    if !subs.is_empty() {
        r["subresources"] = json!(subs);
    }
    r
}

/// Aggregated discovery (`APIGroupDiscoveryList`, `apidiscovery.k8s.io/v2`) for `/api`
/// (`core` true) or `/apis`.
pub fn aggregated(catalog: &Catalog, core: bool) -> Value {
    let mut groups: Vec<(String, Vec<String>)> = if core {
        vec![(String::new(), vec!["v1".into()])]
    } else {
        catalog.groups()
    };
    groups.retain(|(g, _)| g.is_empty() == core);
    let items: Vec<Value> = groups
        .iter()
        .map(|(g, versions)| {
            let vs: Vec<Value> = versions
                .iter()
                .map(|v| {
                    let resources: Vec<Value> = catalog
                        .all()
                        .iter()
                        .filter(|t| t.group == *g && t.version == *v)
                        .map(aggregated_resource)
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            let mut meta = json!({"creationTimestamp": null});
            if !g.is_empty() {
                meta["name"] = json!(g);
            }
            json!({"metadata": meta, "versions": vs})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}
