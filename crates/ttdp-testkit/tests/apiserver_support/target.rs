//! Where an API-server semantic test runs: the real control plane of
//! [`launcher::test_kubeconfig`] (the cluster `TTDP_TEST_KUBECONFIG` names, else one started for
//! the test process and shared by its tests).
//!
//! A test gets a client whose default namespace is a fresh namespace of its own, the kubeconfig
//! for kubectl, and [`Target::name`] / [`Target::group`] for unique cluster-scoped names (nodes,
//! namespaces, CRD groups), so that many tests, and several suites, can share one cluster and
//! run in parallel. Dropping the target removes what the test created (also when the test
//! panics): the namespaces, nodes, node leases and CRDs named with the test's prefix, and the
//! events it left in `default` about its nodes.
//!
//! No kubelet serves the nodes a test creates: a test that needs a pod to finish terminating
//! either runs a simulated kubelet for its node ([`Target::kubelet`], from `ttdp_testkit::sim`)
//! or deletes with grace period 0, as a kubelet finally does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount, Taint};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};
use ttdp_testkit::sim::cluster::random_prefix;
use ttdp_testkit::sim::{KubeletConfig, SCENARIO_LABEL, SimKubelet, SimNodeSpec, TimeScale};
use ttdp_testkit::{launcher, scratch};

/// The label every node a test creates through [`Target::node`] carries, valued with the
/// test's prefix; selectors include it so a test only ever sees its own nodes.
pub const RUN_LABEL: &str = SCENARIO_LABEL;

/// One test's view of the API server it runs against.
pub struct Target {
    client: Client,
    kubeconfig: PathBuf,
    prefix: String,
}

impl Target {
    /// Connects to the test control plane ([`launcher::test_kubeconfig`]); creates the test's
    /// namespace and makes it the client's default namespace.
    pub async fn start() -> Target {
        let prefix = random_prefix("tk");
        let kubeconfig = launcher::test_kubeconfig();
        let client = client_for(&kubeconfig, &prefix).await;
        let target = Target {
            client,
            kubeconfig,
            prefix,
        };
        target.create_namespace(target.namespace()).await;
        target
    }

    /// A client (no automatic retries of 429/503) whose default namespace is [`Target::namespace`].
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The kubeconfig for kubectl.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The test's own namespace.
    pub fn namespace(&self) -> &str {
        &self.prefix
    }

    /// A cluster-unique name for `short` (nodes, further namespaces).
    pub fn name(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    /// `RUN_LABEL=<prefix>`: selects exactly the nodes of this test.
    pub fn run_selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.prefix)
    }

    /// `selector` restricted to objects carrying this test's run label.
    pub fn own(&self, selector: &str) -> String {
        format!("{selector},{}", self.run_selector())
    }

    /// The API group for this test's CRDs.
    pub fn group(&self) -> String {
        format!("{}.example.com", self.prefix)
    }

    /// A cluster-unique CRD short name starting with `short`.
    pub fn short_name(&self, short: &str) -> String {
        format!("{short}{}", self.prefix.trim_start_matches("tk-"))
    }

    /// Strips the test prefix from a node name (for comparing lists).
    pub fn short<'a>(&self, name: &'a str) -> &'a str {
        name.strip_prefix(&format!("{}-", self.prefix))
            .unwrap_or(name)
    }

    /// A Ready node `name(short)` with `labels` plus the run label.
    pub fn node(&self, short: &str, labels: Value) -> Node {
        let mut labels = labels;
        labels[RUN_LABEL] = json!(self.prefix);
        super::node(&self.name(short), labels)
    }

    /// Creates a namespace with its `default` service account: the controller manager creates
    /// that one shortly after the namespace, and pods cannot be created before it exists
    /// (ServiceAccount admission); creating it right away (409 if the controller was first)
    /// avoids the wait.
    pub async fn create_namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        api.create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), name);
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create service account {name}/default: {e}"),
        }
    }

    /// A simulated kubelet (from `ttdp_testkit::sim`) registering and serving the node
    /// `name(short)` with `labels` plus the run label: it runs the pods bound there and completes
    /// their graceful deletion. The node is tainted
    /// `RUN_LABEL=<prefix>:NoSchedule`, so a real scheduler places no other workloads on it (the
    /// tests bind their pods by `nodeName`). Stop it with
    /// [`SimKubelet::shutdown_and_unregister`].
    pub async fn kubelet(&self, short: &str, labels: &[(&str, &str)]) -> SimKubelet {
        let mut spec = SimNodeSpec::new(self.name(short));
        for (k, v) in labels {
            spec.labels.insert((*k).to_owned(), (*v).to_owned());
        }
        spec.labels
            .insert(RUN_LABEL.to_owned(), self.prefix.clone());
        spec.taints.push(Taint {
            key: RUN_LABEL.to_owned(),
            value: Some(self.prefix.clone()),
            effect: "NoSchedule".to_owned(),
            time_added: None,
        });
        let config = KubeletConfig {
            time_scale: TimeScale::new(0.05),
            ..KubeletConfig::default()
        };
        SimKubelet::start(self.client.clone(), config, vec![spec])
            .await
            .expect("simulated kubelet starts")
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let kubeconfig = self.kubeconfig.clone();
        let prefix = self.prefix.clone();
        let group = self.group();
        // The test's runtime may be unwinding or blocked right here, and the test's client lives
        // on it: clean up from a thread with a runtime and client of its own.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("cleanup runtime");
            rt.block_on(async move {
                let run = cleanup(&kubeconfig, &prefix, &group);
                if tokio::time::timeout(Duration::from_secs(60), run)
                    .await
                    .is_err()
                {
                    eprintln!("cleanup of test {prefix} did not finish within 60s");
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// Like `ttdp_testkit::sim::cluster::client_for` (no kube retries, so a budget-blocked eviction
/// answers 429 at once), with `namespace` as the default namespace.
async fn client_for(path: &Path, namespace: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(path)
        .unwrap_or_else(|e| panic!("read kubeconfig {}: {e}", path.display()));
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", path.display()));
    config.default_retry = false;
    config.default_namespace = namespace.to_owned();
    Client::try_from(config).expect("kube client")
}

/// Best effort: delete everything named with `prefix` (`ttdp_testkit::scratch::cleanup`) and
/// the CRDs of `group`.
async fn cleanup(kubeconfig: &Path, prefix: &str, group: &str) {
    if let Err(e) = scratch::cleanup(kubeconfig, prefix).await {
        eprintln!("cleanup {prefix}: {e}");
    }
    let client = client_for(kubeconfig, "default").await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        if crd.spec.group == group
            && let Err(e) = crds.delete(&crd.name_any(), &DeleteParams::default()).await
        {
            eprintln!("cleanup {prefix}: delete crd {}: {e}", crd.name_any());
        }
    }
}
