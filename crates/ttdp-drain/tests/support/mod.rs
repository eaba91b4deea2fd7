//! Shared test harness: a test's own corner of the real control plane
//! (`ttdp_testkit::launcher::test_kubeconfig`) with simulated kubelets for its nodes, owners,
//! pods and budgets.
//!
//! - Nodes are `<prefix>-<short>` ([`Harness::n`]), registered and kept Ready by a
//!   `SimKubelet` that runs their pods and completes graceful deletions, and tainted
//!   `SCENARIO_LABEL=<prefix>:NoSchedule` so the real scheduler puts nothing else there.
//! - Pods live in the test's namespace ([`Harness::ns`]); the drainer's client goes through a
//!   recording, fault-injecting proxy ([`Harness::proxy`]), so tests see exactly what the drain
//!   sent, and can make the server answer 503/403/409 on demand.
//! - Owners are real objects that the real controllers cannot act on: their pod templates name a
//!   ServiceAccount that does not exist, so the ReplicaSet/StatefulSet/Job/DaemonSet
//!   controllers fail to create pods of their own; ReplicaSets are scaled up with each pod the
//!   test gives them (waiting until the controller has seen the new scale), so the controller
//!   never deletes one, and the disruption controller finds the real scale.
//! - PodDisruptionBudgets get their status from the real disruption controller;
//!   [`Harness::pdb`] waits until it has been computed.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use ttdp_drain::{Backoff, DrainEvent, DrainOptions, Drainer, EventSink, PodRules};
use ttdp_testkit::sim::{
    ImageMap, KubeletConfig, SCENARIO_LABEL, SimKubelet, SimNodeSpec, TimeScale,
};

pub use ttdp_testkit::fault_proxy::FaultProxy;
pub use ttdp_testkit::scratch::Scratch;

/// Image the kubelets run as `/bin/true`: a container that exits 0 at once.
const EXIT_0_IMAGE: &str = "ttdp.test/exit-0";
/// An image whose container sleeps for its first argument's seconds, then exits 0.
pub const SLEEP_IMAGE: &str = "ttdp.test/sleep";
/// A ServiceAccount that never exists: owners' templates name it so their controllers cannot
/// create pods.
const NO_SA: &str = "no-such-serviceaccount";
const WAIT: Duration = Duration::from_secs(30);

pub struct Harness {
    pub scratch: Scratch,
    pub proxy: FaultProxy,
    /// A client through the proxy, default namespace [`Harness::ns`].
    pub client: Client,
    /// A client straight to the server (setup and checks, not recorded).
    pub admin: Client,
    pub events: Arc<Mutex<Vec<DrainEvent>>>,
    kubelet: Option<SimKubelet>,
}

impl Harness {
    pub async fn start(nodes: &[&str]) -> Self {
        let scratch = Scratch::new("dr")
            .await
            .expect("a scratch namespace on the test cluster");
        let admin = scratch.client();
        let proxy = FaultProxy::start(admin.clone())
            .await
            .expect("the fault proxy starts");
        let client = proxy
            .client(scratch.namespace())
            .expect("a client of the fault proxy");
        let specs = nodes.iter().map(|n| node_spec(&scratch, n)).collect();
        let config = KubeletConfig {
            image_map: ImageMap::new()
                .with(EXIT_0_IMAGE, "/bin/true")
                .with(SLEEP_IMAGE, "/bin/sleep"),
            time_scale: TimeScale::new(0.05),
            ..KubeletConfig::default()
        };
        let kubelet = SimKubelet::start(admin.clone(), config, specs)
            .await
            .expect("simulated kubelet starts");
        Self {
            scratch,
            proxy,
            client,
            admin,
            events: Arc::default(),
            kubelet: Some(kubelet),
        }
    }

    /// The full name of node `short`.
    pub fn n(&self, short: &str) -> String {
        self.scratch.name(short)
    }

    /// The test's namespace.
    pub fn ns(&self) -> &str {
        self.scratch.namespace()
    }

    /// `<namespace>/<name>`.
    pub fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.ns())
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

    /// A node without a kubelet (only cordon tests use these), with `patch` merged in.
    pub async fn node(&self, short: &str, patch: Value) {
        let mut v = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.n(short), "labels": {SCENARIO_LABEL: self.ns()}}});
        merge(&mut v, patch);
        let nodes: Api<Node> = Api::all(self.admin.clone());
        nodes
            .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
    }

    pub async fn get_node(&self, short: &str) -> Node {
        Api::<Node>::all(self.admin.clone())
            .get(&self.n(short))
            .await
            .unwrap()
    }

    /// Create an owner object of `kind` (ReplicaSet, DaemonSet, StatefulSet or Job) and return
    /// a controller reference to it plus the label its selector matches.
    pub async fn owner(&self, kind: &str, name: &str) -> Value {
        let selector = json!({"matchLabels": {"owner": name}});
        let template = json!({"metadata": {"labels": {"owner": name}},
            "spec": {"serviceAccountName": NO_SA, "restartPolicy": if kind == "Job" { "Never" } else { "Always" },
                "containers": [{"name": "c", "image": "busybox"}]}});
        let (api_version, plural, spec) = match kind {
            "ReplicaSet" => (
                "apps/v1",
                "replicasets",
                json!({"replicas": 0, "selector": selector, "template": template}),
            ),
            "DaemonSet" => (
                "apps/v1",
                "daemonsets",
                json!({"selector": selector, "updateStrategy": {"type": "OnDelete"},
                    "template": with(template, json!({"spec": {"nodeSelector": {SCENARIO_LABEL: self.ns()}}}))}),
            ),
            "StatefulSet" => (
                "apps/v1",
                "statefulsets",
                json!({"replicas": 1, "serviceName": name, "selector": selector, "template": template,
                    "updateStrategy": {"type": "OnDelete"}}),
            ),
            "Job" => (
                "batch/v1",
                "jobs",
                json!({"parallelism": 100, "completions": 100, "manualSelector": true,
                    "selector": selector, "template": template}),
            ),
            other => panic!("no owner of kind {other}"),
        };
        let (group, version) = api_version.split_once('/').unwrap();
        let ar =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let obj = json!({"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": self.ns()}, "spec": spec});
        let api: Api<DynamicObject> = Api::namespaced_with(self.admin.clone(), self.ns(), &ar);
        let created = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(obj).unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("create {kind} {name}: {e}"));
        json!({"metadata": {
            "labels": {"owner": name},
            "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": name,
                "uid": created.metadata.uid.unwrap(), "controller": true}]}})
    }

    /// Create pod `name` in the test's namespace on node `node` and wait until the kubelet runs
    /// it (Running and Ready), or until it Succeeded when `patch` asks for
    /// `{"status": {"phase": "Succeeded"}}` (its container then exits 0).
    pub async fn pod(&self, node: &str, name: &str, patch: Value) -> Pod {
        let succeeded = patch["status"]["phase"] == "Succeeded";
        let mut v = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns()},
            "spec": {"nodeName": self.n(node), "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "busybox"}]}});
        let mut patch = patch;
        if let Some(o) = patch.as_object_mut() {
            o.remove("status");
        }
        merge(&mut v, patch);
        if succeeded {
            v["spec"]["restartPolicy"] = json!("Never");
            for c in v["spec"]["containers"].as_array_mut().unwrap() {
                c["image"] = json!(EXIT_0_IMAGE);
            }
        }
        if let Some(owner) = v["metadata"]["ownerReferences"][0].as_object()
            && owner["kind"] == "ReplicaSet"
        {
            self.scale_up(owner["name"].as_str().unwrap()).await;
        }
        let pods = self.admin_pods();
        pods.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap_or_else(|e| panic!("create pod {name}: {e}"));
        let started = std::time::Instant::now();
        loop {
            let pod = pods.get(name).await.unwrap();
            let status = pod.status.clone().unwrap_or_default();
            let phase = status.phase.as_deref().unwrap_or_default();
            let ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if (succeeded && phase == "Succeeded") || (!succeeded && phase == "Running" && ready) {
                return pod;
            }
            assert!(
                started.elapsed() < WAIT,
                "pod {name} never ran on {node}: {status:?}",
                status = pod.status
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One more replica for ReplicaSet `name`, so the controller keeps the pod about to be made.
    async fn scale_up(&self, name: &str) {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps", "v1", "ReplicaSet"),
            "replicasets",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(self.admin.clone(), self.ns(), &ar);
        let rs = api.get(name).await.unwrap();
        let replicas = rs.data["spec"]["replicas"].as_i64().unwrap_or(0);
        let scaled = api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas + 1}})),
            )
            .await
            .unwrap();
        // The ReplicaSet controller watches pods and ReplicaSets apart, so it may see the new
        // pod before the new scale and delete the pod as one too many. Once it has written
        // this generation as observed, its cache holds the new scale.
        let generation = scaled.metadata.generation.unwrap();
        let started = std::time::Instant::now();
        loop {
            let rs = api.get(name).await.unwrap();
            if rs.data["status"]["observedGeneration"].as_i64() >= Some(generation) {
                return;
            }
            assert!(
                started.elapsed() < WAIT,
                "ReplicaSet {name} never observed replicas {}",
                replicas + 1
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Pods through the proxy (recorded).
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), self.ns())
    }

    /// Pods straight from the server.
    pub fn admin_pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), self.ns())
    }

    /// The pods on node `short` (listed straight from the server).
    pub async fn pod_names(&self, short: &str) -> BTreeSet<String> {
        ttdp_drain::list_node_pods(&self.admin, &self.n(short))
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect()
    }

    /// Creates a budget over pods labelled `app=<app>` and waits until the disruption
    /// controller has computed its status.
    pub async fn pdb(&self, name: &str, app: &str, spec: Value) {
        let mut v = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": self.ns()},
            "spec": {"selector": {"matchLabels": {"app": app}}}});
        merge(&mut v, json!({"spec": spec}));
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.admin.clone(), self.ns());
        api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
        self.wait_pdb_observed(name).await;
    }

    pub async fn patch_pdb(&self, name: &str, spec: Value) {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.admin.clone(), self.ns());
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await
        .unwrap();
        self.wait_pdb_observed(name).await;
    }

    /// Waits until the disruption controller observed the budget's latest generation.
    pub async fn wait_pdb_observed(&self, name: &str) -> PodDisruptionBudget {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.admin.clone(), self.ns());
        let started = std::time::Instant::now();
        loop {
            let pdb = api.get(name).await.unwrap();
            let observed = pdb.status.as_ref().and_then(|s| s.observed_generation);
            if observed.is_some() && observed == pdb.metadata.generation {
                return pdb;
            }
            assert!(
                started.elapsed() < WAIT,
                "the disruption controller never computed {name}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the budget's status allows `allowed` disruptions: the disruption controller may
    /// mark a new budget observed before its pod cache shows the pods Ready.
    pub async fn wait_pdb_allows(&self, name: &str, allowed: i32) {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.admin.clone(), self.ns());
        let started = std::time::Instant::now();
        loop {
            let pdb = api.get(name).await.unwrap();
            let status = pdb.status.unwrap_or_default();
            if status.disruptions_allowed == allowed {
                return;
            }
            assert!(
                started.elapsed() < WAIT,
                "{name} never allowed {allowed} disruptions: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the kubelets (the Drop of [`Scratch`] removes the nodes and namespace).
    pub async fn shutdown(mut self) {
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.shutdown().await;
        }
    }
}

fn node_spec(scratch: &Scratch, short: &str) -> SimNodeSpec {
    let mut spec = SimNodeSpec::new(scratch.name(short));
    spec.labels
        .insert(SCENARIO_LABEL.to_owned(), scratch.namespace().to_owned());
    spec.taints.push(Taint {
        key: SCENARIO_LABEL.to_owned(),
        value: Some(scratch.namespace().to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    });
    spec
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
