//! Minimal OpenAPI documents. The v3 group/version documents list one PATCH operation per
//! resource, tagged with `x-kubernetes-group-version-kind` and the `fieldValidation` query
//! parameter: that is how kubectl decides the server validates fields itself (so it skips
//! client-side schema validation). No schemas are served; `kubectl explain` does not work.

use serde_json::{Map, Value, json};

use super::catalog::{Catalog, ResourceType};

fn info() -> Value {
    json!({"title": "Kubernetes", "version": "v1.35.0"})
}

/// `/openapi/v3`: one entry per served group/version.
pub fn v3_root(catalog: &Catalog) -> Value {
    let mut paths = Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": "/openapi/v3/api/v1"}),
    );
    for (group, versions) in catalog.groups() {
        for v in versions {
            paths.insert(
                format!("apis/{group}/{v}"),
                json!({"serverRelativeURL": format!("/openapi/v3/apis/{group}/{v}")}),
            );
        }
    }
    json!({"paths": paths})
}

fn object_path(rt: &ResourceType) -> String {
    let prefix = if rt.group.is_empty() {
        format!("/api/{}", rt.version)
    } else {
        format!("/apis/{}/{}", rt.group, rt.version)
    };
    if rt.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
    } else {
        format!("{prefix}/{}/{{name}}", rt.plural)
    }
}

fn query_param(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/<group>/<version>`.
pub fn v3_group_version(catalog: &Catalog, group: &str, version: &str) -> Option<Value> {
    if !catalog.has_group_version(group, version) {
        return None;
    }
    let mut paths = Map::new();
    for rt in catalog
        .all()
        .iter()
        .filter(|t| t.group == group && t.version == version)
    {
        let gvk = json!({"group": rt.group, "version": rt.version, "kind": rt.kind});
        paths.insert(
            object_path(rt),
            json!({
                "patch": {
                    "operationId": format!("patch{}", rt.kind),
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [
                        query_param("dryRun"),
                        query_param("fieldManager"),
                        query_param("fieldValidation"),
                        query_param("force"),
                    ],
                    "responses": {"200": {"description": "OK"}},
                }
            }),
        );
    }
    Some(json!({"openapi": "3.0.0", "info": info(), "paths": paths, "components": {"schemas": {}}}))
}
