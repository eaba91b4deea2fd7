//! Shared fixtures for the API server tests: where they run ([`Target`]), object builders,
//! polling, and finding kubectl.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod target;

pub use target::Target;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

/// Poll `check` every 20 ms until it returns Some, for at most `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached within {secs}s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node named `name` with labels, Ready.
pub fn node(name: &str, labels: Value) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

/// A pod bound to `node` with labels.
pub fn pod(name: &str, node: &str, labels: Value) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox:1.36"}]}
    }))
    .unwrap()
}

/// The kubectl binary: `$TTDP_KUBECTL`, then `$HOME/.local/ttdp-tools/bin/kubectl`, then a
/// v1.35 `kubectl` on PATH. Panics with instructions when none is found: tests that need the
/// real kubectl fail rather than skip.
pub fn kubectl() -> PathBuf {
    if let Ok(p) = std::env::var("TTDP_KUBECTL") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "TTDP_KUBECTL={} does not exist; run .ci/kube-tools",
            p.display()
        );
        return p;
    }
    if let Ok(home) = std::env::var("HOME") {
        let p = PathBuf::from(home).join(".local/ttdp-tools/bin/kubectl");
        if p.is_file() {
            return p;
        }
    }
    if let Ok(out) = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        && String::from_utf8_lossy(&out.stdout).contains("v1.35")
    {
        return PathBuf::from("kubectl");
    }
    panic!(
        "kubectl v1.35 not found: run `bash .ci/kube-tools` (installs into $HOME/.local/ttdp-tools/bin) \
         or set TTDP_KUBECTL to a kubectl v1.35 binary"
    );
}

/// A cluster-scoped CRD `widgets.<test group>` (short name `wd<suffix>`) shaped like ttdp's TenstorrentDriverPolicy: a
/// defaulted and validated spec with CEL rules (one a transition rule on `oldSelf`), and a
/// status subresource whose `nodes` list merges by `name` and `conditions` by `type`.
pub fn widget_crd(t: &Target) -> Value {
    let group = t.group();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": [t.short_name("wd")]},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Version", "type": "string", "jsonPath": ".spec.version"}
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["version"],
                            "x-kubernetes-validations": [
                                {"rule": "self.maxUnavailable <= 10", "message": "maxUnavailable must be at most 10"},
                                {"rule": "!has(oldSelf.mode) || self.mode == oldSelf.mode || oldSelf.mode != 'locked'",
                                 "message": "a locked widget cannot change mode"}
                            ],
                            "properties": {
                                "version": {"type": "string", "pattern": "^[0-9]+[.][0-9]+[.][0-9]+$"},
                                "maxUnavailable": {"type": "integer", "default": 1, "minimum": 0},
                                "mode": {"type": "string", "enum": ["auto", "manual", "locked"], "default": "auto"},
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}}
                            }
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "observedGeneration": {"type": "integer"},
                                "nodes": {
                                    "type": "array",
                                    "x-kubernetes-list-type": "map",
                                    "x-kubernetes-list-map-keys": ["name"],
                                    "items": {"type": "object", "required": ["name"], "properties": {
                                        "name": {"type": "string"},
                                        "state": {"type": "string"},
                                        "version": {"type": "string"}
                                    }}
                                },
                                "conditions": {
                                    "type": "array",
                                    "x-kubernetes-list-type": "map",
                                    "x-kubernetes-list-map-keys": ["type"],
                                    "items": {"type": "object", "required": ["type"], "properties": {
                                        "type": {"type": "string"},
                                        "status": {"type": "string"},
                                        "reason": {"type": "string"}
                                    }}
                                }
                            }
                        }
                    }
                }}
            }]
        }
    })
}

/// A namespaced CRD `gadgets.<test group>` with no status subresource and a free-form spec.
pub fn gadget_crd(t: &Target) -> Value {
    let group = t.group();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("gadgets.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    })
}

/// Create a CRD from JSON through the server, wait until it is Established (a real server
/// serves its resource only then), and return the dynamic API for its resource.
pub async fn install_crd(client: &kube::Client, crd: Value) -> kube::core::ApiResource {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::runtime::wait::{await_condition, conditions};
    let crd: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    let created = api
        .create(&kube::api::PostParams::default(), &crd)
        .await
        .unwrap();
    let name = created.metadata.name.clone().unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    .expect("CRD established within 30s")
    .unwrap();
    let spec = created.spec;
    let version = &spec.versions[0].name;
    kube::core::ApiResource {
        group: spec.group.clone(),
        version: version.clone(),
        api_version: format!("{}/{}", spec.group, version),
        kind: spec.names.kind.clone(),
        plural: spec.names.plural.clone(),
    }
}
