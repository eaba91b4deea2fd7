//! How each list in an object merges: by key (`x-kubernetes-list-type: map` /
//! `patchMergeKey`), as a set, or atomically (replaced whole). Built-in types use the
//! Kubernetes API's own markers for the fields ttdp and kubectl touch; custom resources use
//! their CRD schema.

use serde_json::Value;

use super::catalog::ResourceType;

/// How a list merges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListKind {
    /// Replaced as a whole.
    Atomic,
    /// A set of scalars (merged by value).
    Set,
    /// A list of objects keyed by these fields.
    Map(Vec<String>),
}

/// Which patch mechanism asks: server-side apply (OpenAPI list-type markers) or strategic
/// merge patch (Go struct `patchStrategy`/`patchMergeKey` tags). They differ in the keys of a
/// few lists, e.g. container ports merge by `containerPort` in strategic merge patch but by
/// `containerPort` and `protocol` for apply. Node taints and pod tolerations are atomic in both
/// (kubectl taint sends the whole new list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merger {
    /// Server-side apply.
    Apply,
    /// Strategic merge patch.
    Strategic,
}

fn keys(k: &[&str]) -> ListKind {
    ListKind::Map(k.iter().map(|s| s.to_string()).collect())
}

/// Normalise a built-in field path (field names only, list items skipped) to the pod-spec
/// relative form used in the table below.
fn normalise(rt: &ResourceType, path: &[String]) -> String {
    let mut parts: Vec<&str> = path.iter().map(String::as_str).collect();
    let templated = matches!(
        rt.plural.as_str(),
        "daemonsets" | "deployments" | "replicasets"
    );
    if templated && parts.len() >= 2 && parts[0] == "spec" && parts[1] == "template" {
        parts.drain(0..2);
    }
    let joined = parts.join(".");
    joined
        .replace("spec.initContainers", "spec.containers")
        .replace("spec.ephemeralContainers", "spec.containers")
}

fn builtin_kind(rt: &ResourceType, path: &[String], merger: Merger) -> ListKind {
    let p = normalise(rt, path);
    match p.as_str() {
        "metadata.ownerReferences" => keys(&["uid"]),
        "metadata.finalizers" => ListKind::Set,
        "spec.containers" | "spec.volumes" | "spec.imagePullSecrets" | "spec.containers.env" => {
            keys(&["name"])
        }
        "spec.containers.ports" => match merger {
            Merger::Apply => keys(&["containerPort", "protocol"]),
            Merger::Strategic => keys(&["containerPort"]),
        },
        "spec.containers.volumeMounts" => keys(&["mountPath"]),
        "spec.containers.volumeDevices" => keys(&["devicePath"]),
        "spec.hostAliases" => keys(&["ip"]),
        "spec.schedulingGates" | "spec.resourceClaims" => keys(&["name"]),
        "spec.topologySpreadConstraints" => match merger {
            Merger::Apply => keys(&["topologyKey", "whenUnsatisfiable"]),
            Merger::Strategic => keys(&["topologyKey"]),
        },
        "status.conditions" => keys(&["type"]),
        "status.addresses" if rt.plural == "nodes" => keys(&["type"]),
        "status.podIPs" | "status.hostIPs" => keys(&["ip"]),
        _ => ListKind::Atomic,
    }
}

fn schema_kind(schema: &Value, path: &[String]) -> ListKind {
    let mut node = schema;
    for segment in path {
        // Descend through arrays' items until we reach an object with properties.
        while node["type"].as_str() == Some("array") {
            node = &node["items"];
        }
        let next = &node["properties"][segment.as_str()];
        node = if next.is_null() {
            &node["additionalProperties"]
        } else {
            next
        };
        if node.is_null() {
            return ListKind::Atomic;
        }
    }
    match node["x-kubernetes-list-type"].as_str() {
        Some("map") => ListKind::Map(
            node["x-kubernetes-list-map-keys"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect(),
        ),
        Some("set") => ListKind::Set,
        _ => ListKind::Atomic,
    }
}

/// How the list at `path` (field names from the object root, list items skipped) merges.
pub fn list_kind(rt: &ResourceType, path: &[String], merger: Merger) -> ListKind {
    if path.first().map(String::as_str) == Some("metadata") {
        return builtin_kind(rt, path, merger);
    }
    match &rt.schema {
        Some(schema) => schema_kind(&schema.openapi, path),
        None => builtin_kind(rt, path, merger),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::catalog::{Catalog, CrdSchema};
    use serde_json::json;
    use std::sync::Arc;

    fn path(p: &str) -> Vec<String> {
        p.split('.').map(str::to_string).collect()
    }

    #[test]
    fn daemonset_template_containers_merge_by_name() {
        let catalog = Catalog::builtin();
        let ds = catalog.find("apps", "v1", "daemonsets").unwrap();
        assert_eq!(
            list_kind(
                ds,
                &path("spec.template.spec.containers.env"),
                Merger::Apply
            ),
            keys(&["name"])
        );
        assert_eq!(
            list_kind(
                ds,
                &path("spec.template.spec.tolerations"),
                Merger::Strategic
            ),
            ListKind::Atomic
        );
    }

    #[test]
    fn crd_schema_markers_decide_for_custom_resources() {
        let mut rt = Catalog::builtin().find("", "v1", "pods").unwrap().clone();
        rt.schema = Some(Arc::new(CrdSchema::new(json!({
            "type": "object",
            "properties": {"status": {"type": "object", "properties": {"nodes": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {"name": {"type": "string"}}}
            }}}}
        }))));
        assert_eq!(
            list_kind(&rt, &path("status.nodes"), Merger::Apply),
            keys(&["name"])
        );
        assert_eq!(
            list_kind(&rt, &path("status.other"), Merger::Apply),
            ListKind::Atomic
        );
    }
}
