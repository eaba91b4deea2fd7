//! Shared test harness: a testkit API server with nodes, owners, pods and budgets.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use ttdp_drain::{Backoff, DrainEvent, DrainOptions, Drainer, EventSink, PodRules};
use ttdp_testkit::apiserver::TestApiServer;

pub struct Harness {
    pub server: TestApiServer,
    pub client: Client,
    pub events: Arc<Mutex<Vec<DrainEvent>>>,
}

impl Harness {
    pub async fn start(nodes: &[&str]) -> Self {
        let server = TestApiServer::start().await.unwrap();
        let client = server.client().await.unwrap();
        let h = Self {
            server,
            client,
            events: Arc::default(),
        };
        for n in nodes {
            h.node(n, json!({})).await;
        }
        h
    }

    pub fn drainer(&self) -> Drainer {
        let events = self.events.clone();
        Drainer::new(self.client.clone()).with_events(EventSink::new(move |e| {
            events.lock().unwrap().push(e.clone());
        }))
    }

    pub fn events(&self) -> Vec<DrainEvent> {
        self.events.lock().unwrap().clone()
    }

    pub async fn node(&self, name: &str, patch: Value) {
        let mut v = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        merge(&mut v, patch);
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
    }

    pub async fn get_node(&self, name: &str) -> Node {
        Api::<Node>::all(self.client.clone())
            .get(name)
            .await
            .unwrap()
    }

    /// Create an owner object and return a controller reference to it. ReplicaSets and
    /// DaemonSets are real objects; the testkit serves no StatefulSets or Jobs, so those
    /// references point at a ConfigMap's UID (garbage collection only checks that the UID
    /// exists, and the drain only reads the reference's kind and name).
    pub async fn owner(&self, kind: &str, name: &str) -> Value {
        let (api_version, plural, body) = match kind {
            "ReplicaSet" | "DaemonSet" => (
                "apps/v1",
                if kind == "ReplicaSet" {
                    "replicasets"
                } else {
                    "daemonsets"
                },
                json!({"spec": {"selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
            ),
            _ => ("v1", "configmaps", json!({})),
        };
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let stored_kind = if plural == "configmaps" {
            "ConfigMap"
        } else {
            kind
        };
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, stored_kind),
            plural,
        );
        let mut obj = json!({"apiVersion": api_version, "kind": stored_kind,
            "metadata": {"name": name, "namespace": "default"}});
        merge(&mut obj, body);
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), "default", &ar);
        let created = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(obj).unwrap(),
            )
            .await
            .unwrap();
        json!({"metadata": {"ownerReferences": [{"apiVersion": if kind == "Job" { "batch/v1" } else { "apps/v1" },
            "kind": kind, "name": name, "uid": created.metadata.uid.unwrap(), "controller": true}]}})
    }

    /// Create pod `default/name` on `node`, Running and Ready unless `patch` sets a status.
    pub async fn pod(&self, node: &str, name: &str, patch: Value) -> Pod {
        let status = patch
            .get("status")
            .cloned()
            .unwrap_or(json!({"phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}]}));
        let mut v = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]}});
        let mut patch = patch;
        if let Some(o) = patch.as_object_mut() {
            o.remove("status");
        }
        merge(&mut v, patch);
        let pods = self.pods();
        pods.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap()
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub async fn pod_names(&self, node: &str) -> BTreeSet<String> {
        ttdp_drain::list_node_pods(&self.client, node)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect()
    }

    pub async fn pdb(&self, name: &str, app: &str, spec: Value) {
        let mut v = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": app}}}});
        merge(&mut v, json!({"spec": spec}));
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), "default");
        api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
    }

    pub async fn patch_pdb(&self, name: &str, spec: Value) {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), "default");
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await
        .unwrap();
    }
}

pub fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p,
    }
}

pub fn with(a: Value, b: Value) -> Value {
    let mut a = a;
    merge(&mut a, b);
    a
}

pub fn labels(app: &str) -> Value {
    json!({"metadata": {"labels": {"app": app}}})
}

/// Fast options for tests: short back-off and polling, a 20 s safety timeout.
pub fn fast(rules: PodRules) -> DrainOptions {
    DrainOptions {
        rules,
        timeout: Some(Duration::from_secs(20)),
        backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(400),
        },
        poll_interval: Duration::from_millis(100),
        ..DrainOptions::default()
    }
}
