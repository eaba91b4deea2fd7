//! End-to-end harness: simulated Tenstorrent nodes (their kubelet runs the real `ttdp-agent`
//! binary against simulated kernels) joined to a real control plane, and the real controller
//! running in-process through `ttdp_controller::run` (or, for scenarios that kill it, its
//! binary as a child process: [`Harness::spawn_controller_process`]).
//!
//! The control plane is `TTDP_TEST_KUBECONFIG`'s cluster when set, else one the testkit's
//! launcher starts for this test process. Either may be shared with other suites, so:
//! - every name (nodes, namespaces, policies) is prefixed per scenario and policies select only
//!   the scenario's nodes (label `ttdp.test/run=<prefix>`);
//! - each scenario's controller manages only the scenario's policies (they carry the run label
//!   and the controller's `policy_selector` selects it), so neither concurrent scenarios nor
//!   policies other suites left behind are touched; at most [`SCENARIOS_AT_ONCE`] scenarios of
//!   one test binary run at once (each [`Harness`] holds a turn from start to shutdown), however
//!   many test threads cargo uses; cargo runs test binaries one after another;
//! - [`Harness::shutdown`] deletes the scenario's policies (waiting for the controller to run
//!   their finalizers), its namespaces and its nodes; a scenario that panics is cleaned up when
//!   its harness is dropped (policies without their finalizers, pods forced, namespaces,
//!   nodes);
//! - the CRD is cluster-scoped and shared: it is applied idempotently (server-side apply) and
//!   never deleted here; whoever owns the whole run removes it at the end.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use ttdp_api::names::{annotations, labels};
use ttdp_api::node_record::NodeRecord;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};
use ttdp_controller::{RunOptions, Settings};
use ttdp_testkit::cluster_setup::{create_operator_namespace, install_crd};
use ttdp_testkit::node_view::NodeView;
use ttdp_testkit::sim::{
    DeviceUse, DisruptionLimit, SimCluster, SimClusterOptions, TenstorrentNode, Workload,
    WorkloadOwner,
};

/// Time scale of the simulation (agent probe periods, retries, grace periods).
pub const SPEED: f64 = 0.2;
/// The label that ties nodes to one scenario.
pub const RUN_LABEL: &str = "ttdp.test/run";
/// The agent image repository (mapped to the agent binary).
pub const IMAGE_REPOSITORY: &str = ttdp_controller::settings::DEFAULT_IMAGE_REPOSITORY;
/// How long a whole rollout step may take in a test.
pub const STEP: Duration = Duration::from_secs(60);
/// An image whose container sleeps for its argument's seconds (a job that finishes).
pub const SLEEP_IMAGE: &str = "ttdp.test/sleep";

fn scaled(seconds: f64) -> String {
    format!("{}ms", (seconds * SPEED * 1000.0).round() as u64)
}

/// `target/<profile>`, where cargo puts the workspace binaries.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// The `helm` binary: `$TTDP_HELM`, else the one `.ci/kube-tools` installs.
pub fn helm_binary() -> PathBuf {
    if let Ok(p) = std::env::var("TTDP_HELM") {
        return p.into();
    }
    let p =
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".local/ttdp-tools/bin/helm");
    assert!(
        p.is_file(),
        "helm not found at {}: run `bash .ci/kube-tools` first (or set TTDP_HELM)",
        p.display()
    );
    p
}

/// The ttdp-agent binary, built once if missing.
pub fn agent_binary() -> PathBuf {
    static AGENT: OnceLock<PathBuf> = OnceLock::new();
    AGENT
        .get_or_init(|| {
            let path = bin_dir().join("ttdp-agent");
            if !path.is_file() {
                let target = bin_dir().parent().expect("target dir").to_path_buf();
                let status =
                    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                        .args(["build", "-p", "ttdp-agent", "--bin", "ttdp-agent"])
                        .args(["--features", "sim,test-hooks"])
                        .env("CARGO_TARGET_DIR", target)
                        .current_dir(env!("CARGO_MANIFEST_DIR"))
                        .status()
                        .expect("cannot run cargo to build ttdp-agent");
                assert!(status.success(), "building ttdp-agent failed");
            }
            assert!(path.is_file(), "{} is missing", path.display());
            path
        })
        .clone()
}

fn fake_tt_smi(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("tt-smi");
    std::fs::write(&path, "#!/bin/sh\necho tt-smi 3.0.0 simulated\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn random_prefix() -> String {
    use rand_like::next;
    format!("c{}", next())
}

/// A tiny time-and-counter based unique id (no extra dependency).
mod rand_like {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    pub fn next() -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        format!("{:x}{n}", (nanos ^ std::process::id()) & 0xfffff)
    }
}

/// A node of a scenario.
pub fn tt_node(prefix: &str) -> TenstorrentNode {
    TenstorrentNode::new().label(RUN_LABEL, prefix)
}

/// How many scenarios of one test binary run at once. Each scenario's controller manages only
/// its own policies, so they cannot disturb each other's rollouts; the bound keeps the load on
/// a small machine (and the scenarios' timings) predictable.
const SCENARIOS_AT_ONCE: usize = 2;
/// Turns on the shared control plane (see [`SCENARIOS_AT_ONCE`]).
static TURNS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(SCENARIOS_AT_ONCE);

/// One scenario's cluster and controller.
pub struct Harness {
    pub cluster: SimCluster,
    pub client: Client,
    pub prefix: String,
    pub namespace: String,
    pub settings: Settings,
    controller: Option<(
        CancellationToken,
        JoinHandle<Result<(), ttdp_controller::Error>>,
    )>,
    pub monitor: Monitor,
    /// The controller's metrics (shared across restarts).
    pub metrics: Arc<ttdp_controller::metrics::Metrics>,
    _tmp: tempfile::TempDir,
    /// Cleans up if the scenario ends without [`Harness::shutdown`].
    cleanup: CleanupGuard,
    /// This scenario's turn on the control plane (released when the harness is dropped).
    _turn: tokio::sync::SemaphorePermit<'static>,
}

/// Armed while a scenario runs: dropped armed (the scenario panicked), it deletes what the
/// scenario made on a shared cluster, on a thread of its own (the test's runtime is unwinding).
struct CleanupGuard {
    client: Client,
    prefix: String,
    namespaces: Vec<String>,
    armed: bool,
}

impl Drop for CleanupGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (client, prefix) = (self.client.clone(), self.prefix.clone());
        let namespaces = std::mem::take(&mut self.namespaces);
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(leave_nothing_behind(client, prefix, namespaces));
        });
        let _ = cleanup.join();
    }
}

/// Deletes at once everything a scenario made: its policies (finalizers removed), its
/// namespaces (their pods forced first) and its nodes.
async fn leave_nothing_behind(client: Client, prefix: String, namespaces: Vec<String>) {
    let policies: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    let label = ListParams::default().labels(&format!("{RUN_LABEL}={prefix}"));
    for p in policies
        .list(&label)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let name = p.name_any();
        let _ = policies
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
            )
            .await;
        let _ = policies.delete(&name, &DeleteParams::default()).await;
    }
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for ns in &namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let _ = pods.delete_collection(&force, &ListParams::default()).await;
        let _ = Api::<Namespace>::all(client.clone())
            .delete(ns, &DeleteParams::default())
            .await;
    }
    let nodes: Api<Node> = Api::all(client);
    let scenario =
        ListParams::default().labels(&format!("{}={prefix}", ttdp_testkit::sim::SCENARIO_LABEL));
    let _ = nodes
        .delete_collection(&DeleteParams::default(), &scenario)
        .await;
}

impl Harness {
    /// Places a ReplicaSet-owned pod `app=inference` that mounts /dev/tenstorrent on `node`;
    /// returns the pod's name.
    pub async fn device_workload(&self, name: &str, node: &str) -> String {
        let pod = self
            .cluster
            .add_workload(
                &Workload::new(name, node)
                    .device(DeviceUse::HostPath)
                    .owner(WorkloadOwner::ReplicaSet)
                    .label("app", "inference"),
            )
            .await
            .unwrap();
        pod.name_any()
    }

    /// A PodDisruptionBudget `inference` that allows no disruption of `app=inference` pods:
    /// drains of nodes running them wait.
    pub async fn blocking_budget(&self) {
        self.cluster
            .add_disruption_budget(
                "inference",
                BTreeMap::from([("app".to_owned(), "inference".to_owned())]),
                DisruptionLimit::MaxUnavailable(IntOrString::Int(0)),
            )
            .await
            .unwrap();
    }

    /// Removes [`Harness::blocking_budget`]'s budget.
    pub async fn delete_budget(&self) {
        Api::<PodDisruptionBudget>::namespaced(self.client.clone(), self.cluster.namespace())
            .delete("inference", &DeleteParams::default())
            .await
            .unwrap();
    }

    /// Starts a cluster with the nodes `nodes(prefix)` and the controller.
    pub async fn start(nodes: impl Fn(&str) -> Vec<TenstorrentNode>) -> Harness {
        Self::start_with(nodes, |_| {}).await
    }

    /// Like [`Harness::start`], adjusting the controller settings first.
    pub async fn start_with(
        nodes: impl Fn(&str) -> Vec<TenstorrentNode>,
        adjust: impl Fn(&mut Settings),
    ) -> Harness {
        let mut h = Self::start_idle(nodes, adjust).await;
        h.start_controller();
        h
    }

    /// The cluster without a controller (the test runs its own).
    pub async fn start_idle(
        nodes: impl Fn(&str) -> Vec<TenstorrentNode>,
        adjust: impl Fn(&mut Settings),
    ) -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let turn = TURNS
            .acquire()
            .await
            .expect("the turns semaphore is never closed");
        let tmp = tempfile::tempdir().unwrap();
        let prefix = random_prefix();
        let mut options = SimClusterOptions::new()
            .name_prefix(&prefix)
            .image(IMAGE_REPOSITORY, agent_binary())
            // A job's container: sleeps for its first argument's seconds, then exits 0.
            .image(SLEEP_IMAGE, "/bin/sleep")
            .time_scale(SPEED)
            .kmd_versions(&["2.6.0", "2.7.0", "2.8.0"])
            .env(
                "TTDP_TT_SMI_PATH",
                &fake_tt_smi(tmp.path()).display().to_string(),
            )
            // As the agent image's ENV: the version of the tt-smi it carries.
            .env("TT_SMI_VERSION", "3.0.0")
            .env("TTDP_PROBE_PERIOD", &scaled(10.0))
            .env("TTDP_RETRY_INITIAL", &scaled(5.0))
            .env("TTDP_RETRY_MAX", &scaled(20.0))
            .env("TTDP_UNLOAD_WAIT", &scaled(10.0))
            .env("TTDP_BUILD_JOBS", "1");
        for n in nodes(&prefix) {
            options = options.node(n);
        }
        let cluster = SimCluster::start(options).await.expect("simulated cluster");
        let client = cluster.client();
        install_crd(&client).await.expect("the ttdp CRD is served");
        let namespace = format!("{prefix}-system");
        create_namespace(&client, &namespace).await;
        let mut settings = Settings {
            namespace: namespace.clone(),
            default_image: format!("{IMAGE_REPOSITORY}:test"),
            deploy_gates: vec!["tenstorrent.com/deploy.tt-telemetry".into()],
            require_nfd: true,
            kmd_repository: Some(cluster.kmd_repo().url()),
            agent_service_account: "ttdp-agent".into(),
            retry_base: Duration::from_secs(2),
            retry_max: Duration::from_secs(10),
            policy_selector: Some(format!("{RUN_LABEL}={prefix}")),
            agent_pod: Default::default(),
            // The simulated kernels are built by gcc 12, whose image is the default one: their
            // agents stay in the default DaemonSet (the compiler tests name other families).
            builder_images: [(12, format!("{IMAGE_REPOSITORY}:test"))].into(),
        };
        adjust(&mut settings);
        let monitor = Monitor::start(client.clone(), &prefix).await;
        let cleanup = CleanupGuard {
            client: client.clone(),
            prefix: prefix.clone(),
            namespaces: vec![
                namespace.clone(),
                settings.namespace.clone(),
                cluster.namespace().to_owned(),
            ],
            armed: cluster.is_real(),
        };
        Harness {
            cluster,
            client,
            prefix,
            namespace,
            settings,
            controller: None,
            monitor,
            metrics: ttdp_controller::metrics::Metrics::shared(),
            _tmp: tmp,
            cleanup,
            _turn: turn,
        }
    }

    /// The scenario's Tenstorrent node names, in order.
    pub fn nodes(&self) -> Vec<String> {
        self.cluster.tenstorrent_node_names()
    }

    /// A policy name unique to this scenario.
    pub fn policy_name(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    /// Starts the in-process controller.
    pub fn start_controller(&mut self) {
        assert!(self.controller.is_none(), "controller already running");
        let token = CancellationToken::new();
        let task = tokio::spawn(ttdp_controller::run(
            self.client.clone(),
            self.settings.clone(),
            RunOptions {
                metrics: Some(self.metrics.clone()),
                ..RunOptions::default()
            },
            token.clone(),
        ));
        self.controller = Some((token, task));
    }

    /// Starts the controller binary (`ttdp-controller`) as a child process with this scenario's
    /// settings as flags, against the scenario's cluster; its output goes to `log`. Leader
    /// election is on, with a fixed identity: a restarted process is the same pod's container
    /// restarted, so it takes its own lease back at once.
    pub fn spawn_controller_process(&self, log: &Path) -> ControllerProcess {
        ControllerProcess::spawn(
            &self.settings,
            self.cluster.kubeconfig_path(),
            &format!("{}-controller", self.prefix),
            "",
            log,
        )
    }

    /// Starts one replica of the controller binary, as a Deployment's pod would run: its own
    /// `identity` for the Lease, and `/metrics`, `/healthz` and `/readyz` served on
    /// `admin_address`.
    pub fn spawn_controller_replica(
        &self,
        identity: &str,
        admin_address: std::net::SocketAddr,
        log: &Path,
    ) -> ControllerProcess {
        let (kubeconfig, address) = (self.cluster.kubeconfig_path(), admin_address.to_string());
        ControllerProcess::spawn(&self.settings, kubeconfig, identity, &address, log)
    }

    /// Starts the controller binary talking to the API server through `kubeconfig` (a fault
    /// proxy's, say) instead of the scenario's own.
    pub fn spawn_controller_process_via(&self, kubeconfig: &Path, log: &Path) -> ControllerProcess {
        ControllerProcess::spawn(
            &self.settings,
            kubeconfig,
            &format!("{}-controller", self.prefix),
            "",
            log,
        )
    }

    /// Stops the controller gracefully.
    pub async fn stop_controller(&mut self) {
        if let Some((token, task)) = self.controller.take() {
            token.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
        }
    }

    /// Each node's state in `policy`'s rollout: its upgrade record when it carries one (written
    /// before each step), else its entry in the policy's status.
    pub async fn node_states(&self, policy: &str) -> BTreeMap<String, NodeState> {
        let p = self.policies().get(policy).await.unwrap();
        let mut states: BTreeMap<String, NodeState> = p
            .status
            .iter()
            .flat_map(|s| s.nodes.iter())
            .map(|n| (n.name.clone(), n.state))
            .collect();
        let nodes = self
            .node_api()
            .list(&ListParams::default().labels(&format!("{RUN_LABEL}={}", self.prefix)))
            .await
            .unwrap();
        for n in nodes.items {
            let record = ttdp_api::node_record::NodeRecord::of_policy(n.annotations(), policy);
            if let Some(r) = record {
                states.insert(n.name_any(), r.state);
            }
        }
        states
    }

    /// Wipes the policy's whole status, as a restore from a backup without status (or an
    /// admin's mistake) would: what the controller knew is then only on the nodes.
    pub async fn wipe_status(&self, policy: &str) {
        self.policies()
            .patch_status(
                policy,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": null})),
            )
            .await
            .unwrap();
        let p = self.policies().get(policy).await.unwrap();
        assert!(p.status.is_none(), "the status of {policy} is wiped");
    }

    /// Creates a policy selecting this scenario's nodes (plus `extra` spec fields).
    pub async fn create_policy(&self, short: &str, version: &str, extra: Value) -> String {
        self.create_policy_selecting(
            short,
            version,
            json!({"matchLabels": {RUN_LABEL: self.prefix}}),
            extra,
        )
        .await
    }

    /// Creates a policy with this node affinity.
    pub async fn create_policy_selecting(
        &self,
        short: &str,
        version: &str,
        affinity: Value,
        extra: Value,
    ) -> String {
        let name = self.policy_name(short);
        let mut spec = json!({"version": version, "nodeAffinity": affinity});
        merge(&mut spec, extra);
        let policy: TenstorrentDriverPolicy = serde_json::from_value(json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": {"name": name, "labels": {RUN_LABEL: self.prefix}},
            "spec": spec,
        }))
        .unwrap();
        self.policies()
            .create(&PostParams::default(), &policy)
            .await
            .unwrap();
        name
    }

    /// Merge-patches a policy's spec.
    pub async fn patch_spec(&self, name: &str, spec: Value) {
        self.policies()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": spec})),
            )
            .await
            .unwrap();
    }

    pub fn policies(&self) -> Api<TenstorrentDriverPolicy> {
        Api::all(self.client.clone())
    }

    pub fn node_api(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// Waits until `check` holds for the policy; panics with the last status otherwise.
    pub async fn wait_policy(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&TenstorrentDriverPolicy) -> bool,
    ) -> TenstorrentDriverPolicy {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < timeout {
            if let Ok(p) = self.policies().get(name).await {
                if check(&p) {
                    return p;
                }
                last = Some(p);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "timed out after {timeout:?} waiting for {what} on policy {name}; last status: {}",
            serde_json::to_string_pretty(&last.and_then(|p| p.status)).unwrap()
        );
    }

    /// Waits until every listed node is in `state`.
    pub async fn wait_nodes(
        &self,
        name: &str,
        nodes: &[String],
        state: NodeState,
        timeout: Duration,
    ) -> TenstorrentDriverPolicy {
        self.wait_policy(name, &format!("{nodes:?} {state}"), timeout, |p| {
            nodes.iter().all(|n| node_state(p, n) == Some(state))
        })
        .await
    }

    /// Waits until the policy's Ready condition is True for its current generation.
    pub async fn wait_ready(&self, name: &str, timeout: Duration) -> TenstorrentDriverPolicy {
        self.wait_policy(name, "Ready", timeout, |p| {
            condition(p, "Ready").is_some_and(|c| c.0 == "True")
                && p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation
        })
        .await
    }

    /// Waits for a node condition.
    pub async fn wait_node(
        &self,
        node: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Node) -> bool,
    ) -> Node {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(n) = self.node_api().get(node).await
                && check(&n)
            {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out waiting for node {node}: {what}");
    }

    /// Sets (or with `None` removes) a node label.
    pub async fn label_node(&self, node: &str, key: &str, value: Option<&str>) {
        self.node_api()
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"labels": {key: value}}})),
            )
            .await
            .unwrap();
    }

    /// Sets a node annotation.
    pub async fn annotate_node(&self, node: &str, key: &str, value: &str) {
        self.node_api()
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": {key: value}}})),
            )
            .await
            .unwrap();
    }

    /// `kubectl cordon` / `uncordon`.
    pub async fn set_unschedulable(&self, node: &str, on: bool) {
        self.node_api()
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"unschedulable": on}})),
            )
            .await
            .unwrap();
    }

    /// Asserts no scenario node is cordoned by anyone or has a closed deploy gate.
    pub async fn assert_nothing_left_behind(&self) {
        for node in self.nodes() {
            let n = self.node_api().get(&node).await.unwrap();
            let unschedulable = n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            assert!(!unschedulable, "node {node} left cordoned");
            assert!(
                !n.annotations().contains_key(annotations::CORDONED_BY),
                "node {node} keeps the cordon annotation"
            );
            assert!(
                !n.annotations().contains_key(annotations::DEPLOY_GATES),
                "node {node} keeps the gates annotation"
            );
            assert!(
                !n.annotations().contains_key(annotations::UPGRADE_GRANT),
                "node {node} keeps an upgrade grant"
            );
            assert!(
                !n.labels()
                    .contains_key("tenstorrent.com/deploy.tt-telemetry"),
                "node {node} keeps a closed deploy gate"
            );
            assert!(
                !n.annotations().contains_key(annotations::UPGRADE_RECORD)
                    && !n.labels().contains_key(labels::UPGRADE_STATE),
                "node {node} keeps an upgrade record of a finished rollout"
            );
        }
    }

    /// The node's kmd-version label.
    pub async fn kmd_version(&self, node: &str) -> Option<String> {
        self.node_api()
            .get(node)
            .await
            .unwrap()
            .labels()
            .get(labels::KMD_VERSION)
            .cloned()
    }

    /// Stops everything, leaving nothing behind on a real cluster: the scenario's policies
    /// (deleted while the controller still runs, so their finalizers lift what they hold and
    /// their DaemonSets go), the operator namespace, then the simulated cluster (its namespace
    /// and nodes).
    pub async fn shutdown(mut self) {
        if self.cluster.is_real() {
            self.delete_policies().await;
        }
        self.stop_controller().await;
        self.monitor.stop();
        if self.cluster.is_real() {
            let namespaces = Api::<Namespace>::all(self.client.clone());
            delete_and_wait(&namespaces, &self.namespace, Duration::from_secs(60)).await;
            if self.settings.namespace != self.namespace {
                delete_and_wait(
                    &namespaces,
                    &self.settings.namespace,
                    Duration::from_secs(60),
                )
                .await;
            }
        }
        self.cleanup.armed = false;
        let _ = self.cluster.shutdown().await;
    }

    /// Deletes the scenario's policies and waits until they are gone (a controller must be
    /// running to remove the finalizer; without one, the finalizer is removed here).
    async fn delete_policies(&self) {
        let api = self.policies();
        let Ok(list) = api.list(&ListParams::default()).await else {
            return;
        };
        let ours: Vec<String> = list
            .items
            .iter()
            .map(ResourceExt::name_any)
            .filter(|n| n.starts_with(&format!("{}-", self.prefix)))
            .collect();
        for name in &ours {
            if self.controller.is_none() {
                let _ = api
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
            delete_and_wait(&api, name, STEP).await;
        }
    }
}

/// Deletes an object and waits (up to `timeout`) until it is gone.
async fn delete_and_wait<K>(api: &Api<K>, name: &str, timeout: Duration)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let _ = api.delete(name, &DeleteParams::default()).await;
    let _ = tokio::time::timeout(timeout, async {
        while !matches!(api.get_opt(name).await, Ok(None)) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
}

fn merge(into: &mut Value, extra: Value) {
    match (into, extra) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Creates a namespace (if missing) with the agents' ServiceAccount `ttdp-agent`.
pub async fn create_namespace(client: &Client, name: &str) {
    create_operator_namespace(client, name)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// A node's state in a policy's status.
pub fn node_state(p: &TenstorrentDriverPolicy, node: &str) -> Option<NodeState> {
    p.status
        .as_ref()?
        .nodes
        .iter()
        .find(|n| n.name == node)
        .map(|n| n.state)
}

/// A node's status entry.
pub fn node_entry<'a>(
    p: &'a TenstorrentDriverPolicy,
    node: &str,
) -> Option<&'a ttdp_api::NodeStatus> {
    p.status.as_ref()?.nodes.iter().find(|n| n.name == node)
}

/// (status, reason, message) of a condition.
pub fn condition(p: &TenstorrentDriverPolicy, type_: &str) -> Option<(String, String, String)> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Adds `view`'s state to (policy, node)'s sequence and the timeline when it changed.
fn note_state(
    states: &Mutex<StateLog>,
    timeline: &Mutex<Vec<(String, NodeState, Instant)>>,
    (policy, node): (&String, &String),
    view: &NodeView,
    at: Instant,
) {
    let Some(state) = view.state() else { return };
    let mut states = states.lock().unwrap();
    let seq = states.entry((policy.clone(), node.clone())).or_default();
    if seq.last() != Some(&state) {
        seq.push(state);
        timeline.lock().unwrap().push((node.clone(), state, at));
    }
}

/// Every (policy, node)'s sequence of states.
pub type StateLog = BTreeMap<(String, String), Vec<NodeState>>;

/// Watches the scenario's nodes and policies: the most nodes cordoned at once, and every node's
/// sequence of states.
pub struct Monitor {
    pub max_cordoned: Arc<Mutex<usize>>,
    pub cordoned_now: Arc<Mutex<BTreeSet<String>>>,
    pub states: Arc<Mutex<StateLog>>,
    /// Every state change seen, with when it was seen.
    pub timeline: Arc<Mutex<Vec<(String, NodeState, Instant)>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Monitor {
    async fn start(client: Client, prefix: &str) -> Monitor {
        let max_cordoned = Arc::new(Mutex::new(0));
        let cordoned_now = Arc::new(Mutex::new(BTreeSet::new()));
        let states = Arc::new(Mutex::new(BTreeMap::new()));
        let nodes: Api<Node> = Api::all(client.clone());
        let (max, now) = (max_cordoned.clone(), cordoned_now.clone());
        let timeline = Arc::new(Mutex::new(Vec::new()));
        // Each (policy, node)'s state as its record and the status say.
        let views: Arc<Mutex<BTreeMap<(String, String), NodeView>>> = Arc::default();
        let (s1, t1_log, v1) = (states.clone(), timeline.clone(), views.clone());
        let config = watcher::Config::default().labels(&format!("{RUN_LABEL}={prefix}"));
        let t1 = tokio::spawn(async move {
            // With back-off, a watch error waits before the retry: without it, a watch whose
            // server is gone retries in a loop that never yields, and neither `Monitor::stop`
            // nor the test runtime's shutdown can end the task (the test hangs).
            let mut stream = watcher::watcher(nodes, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(n) = stream.next().await {
                let Ok(n) = n else { continue };
                let mut now = now.lock().unwrap();
                {
                    let on = n
                        .spec
                        .as_ref()
                        .and_then(|s| s.unschedulable)
                        .unwrap_or(false);
                    if on {
                        now.insert(n.name_any());
                    } else {
                        now.remove(&n.name_any());
                    }
                }
                let mut m = max.lock().unwrap();
                *m = (*m).max(now.len());
                // Every step is on the node before it is acted on; the status, a coalesced
                // view, may skip a short one.
                let record: Option<NodeRecord> = n
                    .annotations()
                    .get(annotations::UPGRADE_RECORD)
                    .and_then(|r| serde_json::from_str(r).ok());
                let mut views = v1.lock().unwrap();
                if let Some(r) = &record {
                    views.entry((r.policy.clone(), n.name_any())).or_default();
                }
                let at = Instant::now();
                for ((policy, node), view) in views.iter_mut() {
                    if *node == n.name_any() {
                        view.see_record(record.clone().filter(|r| r.policy == *policy));
                        note_state(&s1, &t1_log, (policy, node), view, at);
                    }
                }
            }
        });
        let policies: Api<TenstorrentDriverPolicy> = Api::all(client);
        let s = states.clone();
        let t = timeline.clone();
        let prefix = prefix.to_owned();
        let t2 = tokio::spawn(async move {
            let mut stream = watcher::watcher(policies, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(p) = stream.next().await {
                let Ok(p) = p else { continue };
                if !p.name_any().starts_with(&prefix) {
                    continue;
                }
                let mut views = views.lock().unwrap();
                // One status is one moment: every change it carries gets the same instant.
                let at = Instant::now();
                for n in p.status.iter().flat_map(|st| st.nodes.iter()) {
                    let key = (p.name_any(), n.name.clone());
                    let view = views.entry(key.clone()).or_default();
                    view.see_entry(
                        n.state,
                        n.last_transition_time.clone(),
                        n.current_version.clone(),
                    );
                    note_state(&s, &t, (&key.0, &key.1), view, at);
                }
            }
        });
        Monitor {
            max_cordoned,
            cordoned_now,
            states,
            timeline,
            tasks: vec![t1, t2],
        }
    }

    /// The most scenario nodes that were cordoned at the same time.
    pub fn max_cordoned(&self) -> usize {
        *self.max_cordoned.lock().unwrap()
    }

    /// The states `node` went through under `policy`.
    pub fn sequence(&self, policy: &str, node: &str) -> Vec<NodeState> {
        self.states
            .lock()
            .unwrap()
            .get(&(policy.to_owned(), node.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    /// Forgets recorded sequences (e.g. before an upgrade).
    pub fn reset(&self) {
        self.states.lock().unwrap().clear();
        self.timeline.lock().unwrap().clear();
        *self.max_cordoned.lock().unwrap() = self.cordoned_now.lock().unwrap().len();
    }

    fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The agent pods of a policy, by node.
pub async fn agent_pods(h: &Harness, policy: &str) -> BTreeMap<String, Pod> {
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), &h.namespace);
    let list = pods
        .list(&ListParams::default().labels(&format!("{}={policy}", labels::POLICY)))
        .await
        .unwrap();
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
        .collect()
}

/// The controller binary running as a child process (see [`Harness::spawn_controller_process`]).
/// Started under `setpriv --pdeathsig KILL`, so it dies with the test; killed when dropped.
pub struct ControllerProcess {
    child: std::process::Child,
    pub log: PathBuf,
}

impl ControllerProcess {
    fn spawn(
        settings: &Settings,
        kubeconfig: &Path,
        identity: &str,
        admin_address: &str,
        log: &Path,
    ) -> Self {
        let file = std::fs::File::create(log).unwrap();
        let mut args: Vec<String> = vec![
            format!("--namespace={}", settings.namespace),
            format!("--default-image={}", settings.default_image),
            format!("--deploy-gates={}", settings.deploy_gates.join(",")),
            format!("--require-nfd={}", settings.require_nfd),
            format!("--agent-service-account={}", settings.agent_service_account),
            format!("--retry-base-seconds={}", settings.retry_base.as_secs()),
            format!("--retry-max-seconds={}", settings.retry_max.as_secs()),
            format!("--metrics-address={admin_address}"),
            "--leader-election=true".into(),
            format!("--pod-name={identity}"),
            "--log-format=text".into(),
        ];
        if let Some(repo) = &settings.kmd_repository {
            args.push(format!("--kmd-repository={repo}"));
        }
        if let Some(selector) = &settings.policy_selector {
            args.push(format!("--policy-selector={selector}"));
        }
        if !settings.builder_images.is_empty() {
            let images: std::collections::BTreeMap<String, &String> =
                (settings.builder_images.iter())
                    .map(|(major, image)| (major.to_string(), image))
                    .collect();
            args.push(format!(
                "--builder-images={}",
                serde_json::to_string(&images).unwrap()
            ));
        }
        let child = {
            use std::os::unix::process::CommandExt;
            Command::new("setpriv")
                .args(["--pdeathsig", "KILL", "--"])
                .arg(env!("CARGO_BIN_EXE_ttdp-controller"))
                .args(&args)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("KUBECONFIG", kubeconfig)
                .env(
                    "RUST_LOG",
                    std::env::var("TTDP_TEST_CONTROLLER_LOG").unwrap_or_else(|_| "info".into()),
                )
                // Its own process group: a signal meant for the test's group does not reach it.
                .process_group(0)
                .stdin(std::process::Stdio::null())
                .stdout(file.try_clone().unwrap())
                .stderr(file)
                .spawn()
                .expect("cannot start ttdp-controller under setpriv (util-linux)")
        };
        ControllerProcess {
            child,
            log: log.to_path_buf(),
        }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends the signal `name` (e.g. `STOP`, `CONT`) to the process (this PID only).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args(["-s", name, &self.child.id().to_string()])
            .status()
            .expect("cannot run kill");
        assert!(
            status.success(),
            "kill -s {name} {} failed",
            self.child.id()
        );
    }

    /// SIGKILLs the process (this PID only) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits until the process has taken the lease and synced its watches (its log says
    /// "initial watches synced; ready").
    pub async fn wait_ready(&mut self, timeout: Duration) {
        let start = Instant::now();
        loop {
            self.assert_running();
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains("initial watches synced; ready") {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "the controller (pid {}) not ready after {timeout:?}; see {}",
                self.child.id(),
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Panics (with the end of its log) if the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            panic!(
                "the controller exited ({status}); the end of {}:\n{}",
                self.log.display(),
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for ControllerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerProcess")
            .field("pid", &self.child.id())
            .field("log", &self.log)
            .finish()
    }
}

/// Watches the pods of a namespace and records, per node, every pod that was deleted (or began
/// terminating): a drain's evictions, counted through the API.
pub struct PodRemovals {
    removed: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
    task: JoinHandle<()>,
}

impl PodRemovals {
    /// Starts watching `namespace`'s pods with the label selector `labels`; returns once the
    /// watch has listed them.
    pub async fn start(client: Client, namespace: &str, labels: &str) -> PodRemovals {
        let removed: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> = Arc::default();
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().labels(labels);
        let r = removed.clone();
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut listed_tx = Some(listed_tx);
            let mut stream = watcher::watcher(pods, config).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                let (pod, gone) = match event {
                    watcher::Event::InitDone => {
                        if let Some(tx) = listed_tx.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    watcher::Event::Init | watcher::Event::InitApply(_) => continue,
                    watcher::Event::Apply(p) => {
                        let gone = p.metadata.deletion_timestamp.is_some();
                        (p, gone)
                    }
                    watcher::Event::Delete(p) => (p, true),
                };
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                if let (true, Some(node), Some(uid)) = (gone, node, pod.metadata.uid.clone()) {
                    r.lock().unwrap().entry(node).or_default().insert(uid);
                }
            }
        });
        let _ = tokio::time::timeout(STEP, listed).await;
        PodRemovals { removed, task }
    }

    /// How many distinct pods were removed from each node so far.
    pub fn per_node(&self) -> BTreeMap<String, usize> {
        self.removed
            .lock()
            .unwrap()
            .iter()
            .map(|(n, pods)| (n.clone(), pods.len()))
            .collect()
    }
}

impl Drop for PodRemovals {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The states of one clean upgrade, from Cordoning.
pub const UPGRADE_PATH: [NodeState; 5] = [
    NodeState::Cordoning,
    NodeState::Draining,
    NodeState::Upgrading,
    NodeState::Uncordoning,
    NodeState::Done,
];

impl Harness {
    /// The scenario's nodes at 2.7.0 under policy "fleet", Ready, each running a pod that holds
    /// its device; the policy, the nodes, and the removals of those pods watched from now on.
    pub async fn nodes_holding_their_devices(&self) -> (String, Vec<String>, PodRemovals) {
        let policy = self.create_policy("fleet", "2.7.0", json!({})).await;
        self.wait_ready(&policy, STEP).await;
        let nodes = self.nodes();
        for (i, node) in nodes.iter().enumerate() {
            self.device_workload(&format!("inference-{i}"), node).await;
        }
        let namespace = self.cluster.namespace();
        let removals = PodRemovals::start(self.client.clone(), namespace, "app=inference").await;
        (policy, nodes, removals)
    }

    /// Every node of `p` (the policy, Ready) is Done at 2.8.0 after one clean upgrade:
    /// Cordoning to Done in order, its device pod evicted once, nothing of ours left on it.
    pub async fn assert_upgraded_once(
        &self,
        p: &TenstorrentDriverPolicy,
        nodes: &[String],
        removals: &PodRemovals,
    ) {
        let policy = p.name_any();
        for node in nodes {
            assert_eq!(node_state(p, node), Some(NodeState::Done), "{node}");
            let loaded = self.kmd_version(node).await;
            assert_eq!(loaded.as_deref(), Some("2.8.0"), "{node}");
            let path: Vec<NodeState> = (self.monitor.sequence(&policy, node).into_iter())
                .skip_while(|s| *s != NodeState::Cordoning)
                .collect();
            assert_eq!(path, UPGRADE_PATH, "{node} went another way");
        }
        self.assert_nothing_left_behind().await;
        let removed = removals.per_node();
        for node in nodes {
            let once = removed.get(node).copied();
            assert_eq!(once, Some(1), "{node}: its one device pod evicted once");
        }
    }
}

/// A GET of `path_and_query` on `address` over real HTTP (1.0, so the server closes when done):
/// the body, or `None` when nothing answers.
pub fn http_get_body(address: std::net::SocketAddr, path_and_query: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path_and_query} HTTP/1.0\r\nHost: {address}\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (_, body) = response.split_once("\r\n\r\n")?;
    Some(body.to_owned())
}
