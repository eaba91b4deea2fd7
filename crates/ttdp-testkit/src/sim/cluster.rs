//! [`SimCluster`]: one entry point for tests and the demo. It joins the real control plane of
//! [`launcher::test_kubeconfig`] (or another existing cluster; or, for the demo's fallback,
//! starts the in-process imitation API server with its DaemonSet controller stand-in), registers
//! simulated Tenstorrent and plain nodes with a simulated host each, runs their simulated
//! kubelet, and cleans up what it created.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ttdp_testkit::sim::SimError> {
//! use ttdp_testkit::sim::{SimCluster, SimClusterOptions, TenstorrentNode};
//! let cluster = SimCluster::start(
//!     SimClusterOptions::new()
//!         .node(TenstorrentNode::new().loaded("2.7.0"))
//!         .tenstorrent_nodes(2)
//!         .plain_nodes(1)
//!         .kmd_versions(&["2.8.0"])
//!         // DaemonSet pods with this image run the agent binary cargo built.
//!         .image("ghcr.io/tenstorrent/ttdp-agent", "target/debug/ttdp-agent")
//!         .time_scale(0.1),
//! )
//! .await?;
//! println!("KUBECONFIG={}", cluster.kubeconfig_path().display());
//! cluster.shutdown().await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount, Taint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, Resource, ResourceExt};
use rand::Rng;
use serde_json::json;
use tracing::info;
use ttdp_api::names::{env, labels};
use ttdp_kmod::{
    BuildOptions, Kernel, KmdVersion, MODULE_NAME, SimHost, SimKernel, SimKmdRepo, build_module,
};

use super::daemonset::DaemonSetStandIn;
use super::error::{SimError, allow_status};
use super::eventually::eventually;
use super::image_map::ImageMap;
use super::kubelet::{KubeletConfig, SimKubelet, delete_nodes};
use super::node_heartbeat::{SimNodeSpec, ensure_namespace};
use super::time_scale::TimeScale;
use super::workload::{DEVICE_RESOURCE, DisruptionLimit, Workload, WorkloadOwner, typed};
use crate::apiserver::TestApiServer;
use crate::launcher;

/// The environment variable naming a real cluster's kubeconfig to run scenarios against.
pub const REAL_CLUSTER_KUBECONFIG_ENV: &str = launcher::EXISTING_CLUSTER_ENV;
/// Label on every node a scenario registers, valued with the scenario's prefix: a DaemonSet that
/// selects it stays on the scenario's own nodes even in a shared real cluster.
pub const SCENARIO_LABEL: &str = "sim.ttdp.tenstorrent.com/scenario";
/// The kernel release of every simulated host.
pub const DEFAULT_KERNEL_RELEASE: &str = "6.8.0-sim";

/// One simulated Tenstorrent node.
#[derive(Debug, Clone, Default)]
pub struct TenstorrentNode {
    /// A tt-kmd version already loaded when the cluster starts.
    pub loaded_version: Option<String>,
    /// The version is installed by DKMS on the host (host-managed node); implies it is loaded.
    pub host_managed: bool,
    /// Extra node labels.
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    pub taints: Vec<Taint>,
}

impl TenstorrentNode {
    /// A node with no module loaded.
    pub fn new() -> Self {
        Self::default()
    }

    /// A node with `version` loaded (by an earlier container install).
    pub fn loaded(mut self, version: &str) -> Self {
        self.loaded_version = Some(version.to_owned());
        self
    }

    /// A host-managed node: `version` installed by DKMS and loaded.
    pub fn host_managed(mut self, version: &str) -> Self {
        self.loaded_version = Some(version.to_owned());
        self.host_managed = true;
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds a taint.
    pub fn taint(mut self, key: &str, value: Option<&str>, effect: &str) -> Self {
        self.taints.push(Taint {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
            time_added: None,
        });
        self
    }
}

/// How to build a [`SimCluster`].
#[derive(Debug, Clone, Default)]
pub struct SimClusterOptions {
    /// The Tenstorrent nodes.
    pub tenstorrent_nodes: Vec<TenstorrentNode>,
    /// How many nodes without Tenstorrent devices.
    pub plain_nodes: usize,
    /// Images run as local binaries.
    pub image_map: ImageMap,
    /// Speed of simulated time.
    pub time_scale: TimeScale,
    /// tt-kmd versions the simulated tt-kmd repository has tags for (loaded versions are added).
    pub kmd_versions: Vec<String>,
    /// Extra environment for every mapped container.
    pub env: Vec<(String, String)>,
    /// Prefix of every name the cluster creates (default: `sim-<random>`).
    pub name_prefix: Option<String>,
    /// Join the existing cluster of this kubeconfig (default: the test control plane of
    /// [`launcher::test_kubeconfig`]: `TTDP_TEST_KUBECONFIG`, else a real control plane started
    /// for the test process).
    pub existing_cluster: Option<PathBuf>,
    /// Start the in-process imitation API server instead (the demo's fallback only).
    pub in_process: bool,
}

impl SimClusterOptions {
    /// No nodes, real time.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `count` Tenstorrent nodes with no module loaded.
    pub fn tenstorrent_nodes(mut self, count: usize) -> Self {
        self.tenstorrent_nodes
            .extend(std::iter::repeat_n(TenstorrentNode::new(), count));
        self
    }

    /// Adds one Tenstorrent node.
    pub fn node(mut self, node: TenstorrentNode) -> Self {
        self.tenstorrent_nodes.push(node);
        self
    }

    /// Sets the number of plain nodes.
    pub fn plain_nodes(mut self, count: usize) -> Self {
        self.plain_nodes = count;
        self
    }

    /// Maps images starting with `prefix` to the local `binary`.
    pub fn image(mut self, prefix: &str, binary: impl Into<PathBuf>) -> Self {
        self.image_map = self.image_map.with(prefix, binary);
        self
    }

    /// Sets the time scale (e.g. 0.1: ten times faster).
    pub fn time_scale(mut self, factor: f64) -> Self {
        self.time_scale = TimeScale::new(factor);
        self
    }

    /// Adds tt-kmd versions to the simulated repository.
    pub fn kmd_versions(mut self, versions: &[&str]) -> Self {
        self.kmd_versions
            .extend(versions.iter().map(|v| (*v).to_owned()));
        self
    }

    /// Adds an environment variable for every mapped container.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Sets the name prefix.
    pub fn name_prefix(mut self, prefix: &str) -> Self {
        self.name_prefix = Some(prefix.to_owned());
        self
    }

    /// Joins the existing cluster of `kubeconfig` (its own controllers and scheduler do their
    /// work; only the simulated nodes are added).
    pub fn existing_cluster(mut self, kubeconfig: impl Into<PathBuf>) -> Self {
        self.existing_cluster = Some(kubeconfig.into());
        self
    }

    /// Starts the in-process imitation API server instead of joining a real control plane
    /// (only the demo does, when no control plane can be had; fault tests put the fault proxy in
    /// front of a real one).
    pub fn in_process(mut self) -> Self {
        self.existing_cluster = None;
        self.in_process = true;
        self
    }
}

/// A node of the cluster and, for Tenstorrent nodes, its simulated host.
#[derive(Debug, Clone)]
pub struct SimNode {
    /// Node name.
    pub name: String,
    /// The simulated host (Tenstorrent nodes only).
    pub host: Option<SimHost>,
}

impl SimNode {
    /// The host root directory, if the node has a simulated host.
    pub fn host_root(&self) -> Option<&Path> {
        self.host.as_ref().map(|h| h.host().dir())
    }

    /// The node's simulated kernel.
    pub fn kernel(&self) -> Option<SimKernel> {
        self.host.as_ref().map(SimHost::kernel)
    }

    /// The tt-kmd version loaded in the node's simulated kernel, if any.
    pub fn loaded_version(&self) -> Option<String> {
        self.module_file("version")
    }

    /// The module's reference count (open device descriptors), if it is loaded.
    pub fn device_refcnt(&self) -> Option<u32> {
        self.module_file("refcnt")?.parse().ok()
    }

    fn module_file(&self, file: &str) -> Option<String> {
        let host = self.host.as_ref()?;
        let path = host
            .host()
            .path(format!("/sys/module/{MODULE_NAME}/{file}"));
        Some(std::fs::read_to_string(path).ok()?.trim().to_owned())
    }
}

/// A running simulated cluster. Call [`SimCluster::shutdown`] at the end: on a real cluster it
/// deletes what the scenario created.
pub struct SimCluster {
    server: Option<TestApiServer>,
    client: Client,
    kubeconfig: PathBuf,
    /// The scenario's name prefix, also the name of its namespace.
    prefix: String,
    nodes: Vec<SimNode>,
    kmd_repo: SimKmdRepo,
    kubelet_config: KubeletConfig,
    /// One per node, so nodes can be added while the cluster runs.
    kubelets: Vec<SimKubelet>,
    daemonsets: Option<DaemonSetStandIn>,
    /// Set once [`SimCluster::shutdown`] has succeeded; until then dropping the cluster on a
    /// real cluster deletes what it created (a test that panics never reaches its shutdown).
    shut_down: bool,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for SimCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCluster")
            .field("real", &self.is_real())
            .field("prefix", &self.prefix)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl SimCluster {
    /// Starts the cluster.
    pub async fn start(options: SimClusterOptions) -> Result<Self, SimError> {
        let dir = tempfile::Builder::new()
            .prefix("ttdp-sim-")
            .tempdir()
            .map_err(|source| SimError::HostIo {
                path: std::env::temp_dir(),
                source,
            })?;
        let prefix = options
            .name_prefix
            .clone()
            .unwrap_or_else(|| random_prefix("sim"));
        let joined = match (&options.existing_cluster, options.in_process) {
            (_, true) => None,
            (Some(path), false) => Some(path.clone()),
            (None, false) => Some(
                launcher::try_test_kubeconfig()
                    .map_err(|message| SimError::ApiServer { message })?,
            ),
        };
        let (server, client, kubeconfig) = match joined {
            Some(path) => {
                let client = client_for(&path).await?;
                info!(kubeconfig = %path.display(), "simulated nodes join a real cluster");
                (None, client, path)
            }
            None => {
                let server = TestApiServer::start()
                    .await
                    .map_err(|e| SimError::ApiServer {
                        message: e.to_string(),
                    })?;
                let kubeconfig = server.kubeconfig_path().to_path_buf();
                let client = client_for(&kubeconfig).await?;
                (Some(server), client, kubeconfig)
            }
        };

        let loaded = options
            .tenstorrent_nodes
            .iter()
            .filter_map(|n| n.loaded_version.clone());
        let versions: BTreeSet<String> =
            options.kmd_versions.iter().cloned().chain(loaded).collect();
        let repo_dir = dir.path().join("tt-kmd.git");
        let kmd_repo = blocking(move || {
            let refs: Vec<&str> = versions.iter().map(String::as_str).collect();
            SimKmdRepo::create(repo_dir.clone(), &refs).map_err(|source| SimError::HostIo {
                path: repo_dir,
                source,
            })
        })
        .await?;

        let mut common_env = vec![
            ("KUBECONFIG".to_owned(), kubeconfig.display().to_string()),
            (env::TT_KMD_REPOSITORY.to_owned(), kmd_repo.url()),
            ("HOME".to_owned(), dir.path().display().to_string()),
        ];
        let inherited = ["PATH", "RUST_LOG", "RUST_BACKTRACE"].into_iter();
        common_env.extend(inherited.filter_map(|k| Some((k.to_owned(), std::env::var(k).ok()?))));
        common_env.extend(options.env.iter().cloned());
        let kubelet_config = KubeletConfig {
            image_map: options.image_map.clone(),
            time_scale: options.time_scale,
            common_env,
            log_dir: Some(dir.path().join("logs")),
            first_node_index: 0,
        };
        let daemonsets = server
            .is_some()
            .then(|| DaemonSetStandIn::start(client.clone()));
        create_namespace(&client, &prefix).await?;
        let mut cluster = Self {
            server,
            client,
            kubeconfig,
            prefix,
            nodes: Vec::new(),
            kmd_repo,
            kubelet_config,
            kubelets: Vec::new(),
            daemonsets,
            shut_down: false,
            dir,
        };
        for node in &options.tenstorrent_nodes {
            cluster.add_tenstorrent_node(node.clone()).await?;
        }
        for _ in 0..options.plain_nodes {
            cluster.add_plain_node().await?;
        }
        info!(prefix = %cluster.prefix, nodes = cluster.nodes.len(), real = cluster.is_real(), "simulated cluster started");
        Ok(cluster)
    }

    /// Adds a Tenstorrent node to the running cluster (served by a kubelet of its own) and
    /// returns its name.
    pub async fn add_tenstorrent_node(
        &mut self,
        node: TenstorrentNode,
    ) -> Result<String, SimError> {
        if let Some(version) = &node.loaded_version {
            self.ensure_kmd_version(version).await?;
        }
        let count = self.nodes.iter().filter(|n| n.host.is_some()).count();
        let name = format!("{}-tt-{count}", self.prefix);
        let root = self.dir.path().join("hosts").join(&name);
        let (host_name, tt, repository) = (name.clone(), node.clone(), self.kmd_repo.url());
        let host = blocking(move || create_host(root, &host_name, &tt, repository)).await?;
        let mut spec = SimNodeSpec::new(&name);
        spec.labels = node.labels;
        spec.labels
            .insert(SCENARIO_LABEL.to_owned(), self.prefix.clone());
        spec.labels.insert(
            labels::NFD_TENSTORRENT.to_owned(),
            labels::NFD_PRESENT.to_owned(),
        );
        spec.taints = node.taints;
        spec.extra_capacity
            .insert(DEVICE_RESOURCE.to_owned(), Quantity("4".to_owned()));
        spec.env = vec![
            (
                env::HOST_ROOT.to_owned(),
                host.host().dir().display().to_string(),
            ),
            (env::KERNEL.to_owned(), "sim".to_owned()),
        ];
        spec.kernel = Some(host.kernel());
        self.start_kubelet(spec).await?;
        self.nodes.push(SimNode {
            name: name.clone(),
            host: Some(host),
        });
        Ok(name)
    }

    /// Adds a plain node to the running cluster and returns its name.
    pub async fn add_plain_node(&mut self) -> Result<String, SimError> {
        let count = self.nodes.iter().filter(|n| n.host.is_none()).count();
        let name = format!("{}-cpu-{count}", self.prefix);
        let mut spec = SimNodeSpec::new(&name);
        spec.labels
            .insert(SCENARIO_LABEL.to_owned(), self.prefix.clone());
        self.start_kubelet(spec).await?;
        self.nodes.push(SimNode {
            name: name.clone(),
            host: None,
        });
        Ok(name)
    }

    /// Adds tag `ttkmd-<version>` to the simulated tt-kmd repository unless it is there.
    async fn ensure_kmd_version(&self, version: &str) -> Result<(), SimError> {
        let repo = self.kmd_repo.clone();
        let version = version.to_owned();
        blocking(move || {
            if repo.tag_commit(&version).is_ok() {
                return Ok(());
            }
            repo.add_version(&version)
                .map_err(|source| SimError::HostIo {
                    path: repo.dir().to_path_buf(),
                    source,
                })
        })
        .await
    }

    async fn start_kubelet(&mut self, spec: SimNodeSpec) -> Result<(), SimError> {
        let config = KubeletConfig {
            first_node_index: self.nodes.len(),
            ..self.kubelet_config.clone()
        };
        let kubelet = SimKubelet::start(self.client.clone(), config, vec![spec]).await?;
        self.kubelets.push(kubelet);
        Ok(())
    }

    /// True when running against an existing (real) cluster rather than the in-process
    /// imitation API server.
    pub fn is_real(&self) -> bool {
        self.server.is_none()
    }

    /// The test API server (simulation only).
    pub fn api_server(&self) -> Option<&TestApiServer> {
        self.server.as_ref()
    }

    /// A client for the cluster (kube's automatic retries of 429/503/504 are off).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The kubeconfig of the cluster (for binaries and `kubectl`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The scenario's unique name prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The scenario's namespace for workloads (created at start, deleted at shutdown).
    pub fn namespace(&self) -> &str {
        &self.prefix
    }

    /// Where container output goes: `<namespace>_<pod>_<container>.log`.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    /// All nodes, in the order they were added (at start: Tenstorrent nodes first).
    pub fn nodes(&self) -> &[SimNode] {
        &self.nodes
    }

    /// The Tenstorrent nodes' names.
    pub fn tenstorrent_node_names(&self) -> Vec<String> {
        self.node_names(true)
    }

    /// The plain nodes' names.
    pub fn plain_node_names(&self) -> Vec<String> {
        self.node_names(false)
    }

    fn node_names(&self, tenstorrent: bool) -> Vec<String> {
        (self.nodes.iter())
            .filter(|n| n.host.is_some() == tenstorrent)
            .map(|n| n.name.clone())
            .collect()
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&SimNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The simulated tt-kmd repository (tags `ttkmd-<version>`).
    pub fn kmd_repo(&self) -> &SimKmdRepo {
        &self.kmd_repo
    }

    /// Places a workload in the scenario namespace and returns its pod once it exists.
    pub async fn add_workload(&self, workload: &Workload) -> Result<Pod, SimError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.prefix);
        let owner = match workload.owner {
            WorkloadOwner::Bare => None,
            WorkloadOwner::ReplicaSet => {
                let sets: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &self.prefix);
                let rs = (sets
                    .create(&PostParams::default(), &workload.replica_set(&self.prefix)?))
                .await
                .map_err(|e| {
                    SimError::api(format!("create workload replicaset {}", workload.name), e)
                })?;
                if self.is_real() {
                    let uid = rs.uid().unwrap_or_default();
                    return eventually(
                        &format!("the pod of replicaset {}", workload.name),
                        Duration::from_secs(60),
                        || {
                            let (pods, uid) = (pods.clone(), uid.clone());
                            async move {
                                let listed = pods.list(&ListParams::default()).await.ok()?;
                                (listed.items.into_iter())
                                    .find(|p| p.owner_references().iter().any(|o| o.uid == uid))
                            }
                        },
                    )
                    .await;
                }
                // No ReplicaSet controller here: create its pod as it would.
                rs.controller_owner_ref(&())
            }
        };
        let pod = workload.pod(&self.prefix, owner)?;
        (pods.create(&PostParams::default(), &pod).await)
            .map_err(|e| SimError::api(format!("create workload pod {}", workload.name), e))
    }

    /// Creates a PodDisruptionBudget in the scenario namespace.
    pub async fn add_disruption_budget(
        &self,
        name: &str,
        match_labels: BTreeMap<String, String>,
        limit: DisruptionLimit,
    ) -> Result<PodDisruptionBudget, SimError> {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), &self.prefix);
        let (key, value) = match limit {
            DisruptionLimit::MinAvailable(v) => ("minAvailable", v),
            DisruptionLimit::MaxUnavailable(v) => ("maxUnavailable", v),
        };
        let budget = typed(
            "poddisruptionbudget",
            json!({
                "metadata": {"name": name, "namespace": self.prefix},
                "spec": {key: value, "selector": {"matchLabels": match_labels}},
            }),
        )?;
        api.create(&PostParams::default(), &budget)
            .await
            .map_err(|e| SimError::api(format!("create poddisruptionbudget {name}"), e))
    }

    /// Reads a node.
    pub async fn get_node(&self, name: &str) -> Result<Node, SimError> {
        Api::<Node>::all(self.client.clone())
            .get(name)
            .await
            .map_err(|e| SimError::api(format!("read node {name}"), e))
    }

    /// Stops everything. On a real cluster it first deletes the scenario namespace (waiting for
    /// its pods to finish) and afterwards the simulated nodes.
    pub async fn shutdown(mut self) -> Result<(), SimError> {
        if let Some(ds) = self.daemonsets.take() {
            ds.shutdown().await;
        }
        let kubelets = std::mem::take(&mut self.kubelets);
        if self.is_real() {
            let namespaces: Api<Namespace> = Api::all(self.client.clone());
            let deleted = namespaces
                .delete(&self.prefix, &DeleteParams::default())
                .await;
            allow_status(deleted, 404, || format!("delete namespace {}", self.prefix))?;
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.prefix);
            let _ = eventually("the scenario's pods to go", Duration::from_secs(60), || {
                let pods = pods.clone();
                async move {
                    pods.list(&ListParams::default())
                        .await
                        .ok()
                        .filter(|l| l.items.is_empty())
                }
            })
            .await;
            for kubelet in kubelets {
                kubelet.shutdown_and_unregister().await?;
            }
        } else {
            for kubelet in kubelets {
                kubelet.shutdown().await;
            }
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
        self.shut_down = true;
        Ok(())
    }
}

impl Drop for SimCluster {
    /// A cluster dropped without [`SimCluster::shutdown`] (a test that panicked) on a real
    /// cluster: stop the kubelets and delete the scenario's namespace (its pods at once, since no
    /// kubelet is left to finish them) and nodes, best effort, from a thread with a runtime and
    /// client of its own (the test's runtime may be unwinding or blocked right here).
    fn drop(&mut self) {
        if self.shut_down || !self.is_real() {
            return;
        }
        // Dropping a kubelet stops its tasks before its nodes go.
        self.kubelets.clear();
        let kubeconfig = self.kubeconfig.clone();
        let namespace = self.prefix.clone();
        let nodes: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        let cleanup = std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    eprintln!("cleanup of scenario {namespace}: no runtime: {e}");
                    return;
                }
            };
            runtime.block_on(async {
                let run = delete_scenario(&kubeconfig, &namespace, &nodes);
                match tokio::time::timeout(Duration::from_secs(30), run).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => eprintln!("cleanup of scenario {namespace}: {e}"),
                    Err(_) => {
                        eprintln!("cleanup of scenario {namespace} did not finish within 30s")
                    }
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// Deletes a scenario's namespace (its pods first, with grace period 0) and nodes; their Leases
/// go with them (the garbage collector follows the Leases' owner references to the nodes).
async fn delete_scenario(
    kubeconfig: &Path,
    namespace: &str,
    nodes: &[String],
) -> Result<(), SimError> {
    let client = client_for(kubeconfig).await?;
    let now = DeleteParams::default().grace_period(0);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let listed = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| SimError::api(format!("list the pods of namespace {namespace}"), e))?;
    for pod in listed.items {
        let _ = pods.delete(&pod.name_any(), &now).await;
    }
    let deleted = (Api::<Namespace>::all(client.clone()))
        .delete(namespace, &DeleteParams::default())
        .await;
    allow_status(deleted, 404, || format!("delete namespace {namespace}"))?;
    delete_nodes(&client, nodes).await
}

/// `<kind>-` and five random characters: a DNS label, unique enough to keep the objects of one
/// scenario apart from others' on a shared cluster.
pub fn random_prefix(kind: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("{kind}-{suffix}")
}

/// A client for the kubeconfig at `path`, without kube's default retries: a 429 (e.g. an eviction
/// blocked by a PodDisruptionBudget) reaches the caller at once instead of after minutes of
/// retrying.
pub async fn client_for(path: &Path) -> Result<Client, SimError> {
    let fail = |message: String| SimError::Kubeconfig {
        path: path.to_path_buf(),
        message,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| fail(e.to_string()))?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| fail(e.to_string()))?;
    config.default_retry = false;
    Client::try_from(config).map_err(|e| fail(e.to_string()))
}

async fn create_namespace(client: &Client, name: &str) -> Result<(), SimError> {
    ensure_namespace(client, name).await?;
    // A real cluster refuses pods in a namespace until its `default` ServiceAccount exists (the
    // ServiceAccount admission plugin), which the controller manager creates shortly after the
    // namespace: create it right away instead of waiting (409 when the controller was first).
    let account = typed("serviceaccount", json!({"metadata": {"name": "default"}}))?;
    let created = (Api::<ServiceAccount>::namespaced(client.clone(), name))
        .create(&PostParams::default(), &account)
        .await;
    allow_status(created, 409, || {
        format!("create service account {name}/default")
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SimError> + Send + 'static,
) -> Result<T, SimError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SimError::Setup {
            message: e.to_string(),
        })?
}

/// Creates a node's simulated host and loads its starting module.
fn create_host(
    root: PathBuf,
    node: &str,
    tt: &TenstorrentNode,
    repository: String,
) -> Result<SimHost, SimError> {
    let io = |source| SimError::HostIo {
        path: root.clone(),
        source,
    };
    let host = SimHost::create(root.clone(), DEFAULT_KERNEL_RELEASE).map_err(io)?;
    let Some(version) = &tt.loaded_version else {
        return Ok(host);
    };
    if tt.host_managed {
        host.add_dkms_state(&[version]).map_err(io)?;
        host.add_dkms_source(version).map_err(io)?;
    }
    let kernel_error = |action: &str, message: String| SimError::Kernel {
        node: node.to_owned(),
        action: format!("{action} tt-kmd {version}"),
        message,
    };
    let options = BuildOptions {
        repository,
        jobs: 1,
        ..BuildOptions::default()
    };
    let kmd_version =
        (version.parse::<KmdVersion>()).map_err(|e| kernel_error("build", e.to_string()))?;
    let built = build_module(host.host(), host.release(), &kmd_version, &options)
        .map_err(|e| kernel_error("build", e.to_string()))?;
    (host.kernel().load(&built.ko_path, "")).map_err(|e| kernel_error("load", e.to_string()))?;
    Ok(host)
}
