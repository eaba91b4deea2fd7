//! Where the demo's cluster comes from, in this order:
//!
//! 1. `--kubeconfig FILE`: an existing cluster (kind, a lab cluster). The demo adds simulated
//!    nodes with simulated kubelets, as the end-to-end suites do, under a random name prefix,
//!    with its own operator namespace, a policy that selects only its nodes and a controller
//!    that reconciles only that policy; at exit it deletes what it created (the CRD stays, as
//!    the suites leave it: other policies may use it).
//! 2. Control-plane assets (`TTDP_KUBE_ASSETS`, else `../shared/kube`, found as the test suites
//!    find them): a real etcd, kube-apiserver, kube-controller-manager and kube-scheduler started
//!    for the demo on loopback, and stopped with it.
//! 3. Neither: the testkit's in-process imitation API server, with a DaemonSet controller
//!    stand-in. The demo says so in its first lines.
//!
//! On a real control plane the real DaemonSet controller creates the agent pods, the real
//! scheduler binds them, and the simulated kubelets run them.

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{Api, DeleteParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_testkit::launcher::{Assets, ControlPlane, runs_dir};
use ttdp_testkit::sim::cluster::random_prefix;
use ttdp_testkit::sim::{SimCluster, eventually};

use crate::fleet::DEMO_PREFIX;

/// The policy the demo creates on a cluster of its own.
const OWN_POLICY: &str = "default";

/// The cluster the demo runs on.
pub struct ClusterSource {
    /// As the report names it: `existing` (`--kubeconfig`), `launched` (a real control plane
    /// started for the demo) or `imitation` (the in-process fallback).
    pub kind: &'static str,
    /// The lines the demo starts with: which cluster, and for the imitation why.
    pub description: String,
    /// The kubeconfig of a real cluster; `None` for the imitation (it makes its own).
    pub kubeconfig: Option<PathBuf>,
    /// A control plane started for the demo: kept only to stop it when dropped.
    _plane: Option<ControlPlane>,
}

impl ClusterSource {
    /// `--kubeconfig`, else a control plane from the assets, else the imitation. Only missing
    /// assets lead to the imitation: assets that are there but fail to start are an error.
    /// Blocking, on the main thread (see `ttdp_programs`).
    pub fn choose(kubeconfig: Option<&Path>) -> Result<Self> {
        if let Some(path) = kubeconfig {
            if !path.is_file() {
                anyhow::bail!("--kubeconfig {} does not exist", path.display());
            }
            return Ok(Self {
                kind: "existing",
                description: format!(
                    "cluster: the existing cluster of --kubeconfig {} (the demo adds simulated nodes, and deletes what it created when it ends)",
                    path.display()
                ),
                kubeconfig: Some(path.to_path_buf()),
                _plane: None,
            });
        }
        let assets = match Assets::locate() {
            Ok(assets) => assets,
            Err(missing) => {
                return Ok(Self {
                    kind: "imitation",
                    description: format!(
                        "cluster: NO real control plane: {missing}\n\
                         cluster: falling back to the testkit's in-process IMITATION of an API server (a DaemonSet controller stand-in, no scheduler).\n\
                         cluster: for the real one put control-plane-*.tar.xz in ../shared/kube, set TTDP_KUBE_ASSETS, or pass --kubeconfig FILE"
                    ),
                    kubeconfig: None,
                    _plane: None,
                });
            }
        };
        let plane = ControlPlane::start(&assets, &runs_dir())
            .context("cannot start the real control plane")?;
        let apiserver = assets.binary("kube-apiserver");
        let assets_dir = apiserver
            .parent()
            .and_then(Path::parent)
            .unwrap_or(&apiserver);
        Ok(Self {
            kind: "launched",
            description: format!(
                "cluster: a real control plane started for the demo: etcd, kube-apiserver, kube-controller-manager and kube-scheduler from {} (logs in {})",
                tidy(assets_dir).display(),
                tidy(&plane.dir().join("logs")).display()
            ),
            kubeconfig: Some(plane.kubeconfig().to_path_buf()),
            _plane: Some(plane),
        })
    }

    /// Whether the cluster is shared with others (the demo must keep to its own objects).
    pub fn is_shared(&self) -> bool {
        self.kind == "existing"
    }

    /// The names the demo uses on this cluster.
    pub fn names(&self) -> DemoNames {
        if self.is_shared() {
            let prefix = random_prefix(DEMO_PREFIX);
            DemoNames {
                policy: prefix.clone(),
                operator_namespace: format!("{prefix}-system"),
                own_cluster: false,
                prefix,
            }
        } else {
            DemoNames {
                policy: OWN_POLICY.to_owned(),
                operator_namespace: ttdp_api::names::DEFAULT_NAMESPACE.to_owned(),
                own_cluster: true,
                prefix: DEMO_PREFIX.to_owned(),
            }
        }
    }
}

/// `path` without `..` steps, for printing (as is when it cannot be resolved).
fn tidy(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The names of what the demo creates.
#[derive(Debug, Clone)]
pub struct DemoNames {
    /// Node names start with it; it is the workloads' namespace too.
    pub prefix: String,
    /// The policy.
    pub policy: String,
    /// Where the controller puts the DaemonSet.
    pub operator_namespace: String,
    /// Whether the demo has the cluster to itself (names as in the README). On a shared cluster
    /// the policy selects only the demo's nodes, and the controller reconciles only that policy.
    pub own_cluster: bool,
}

/// On a shared cluster: deletes the policy (the controller, still running, removes its
/// finalizer after lifting any cordon). Best effort: a failure is returned as a line to print.
pub async fn delete_policy(client: &Client, names: &DemoNames) -> Option<String> {
    let policies: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    let name = &names.policy;
    if let Some(failed) = delete(&policies, name).await {
        return Some(failed);
    }
    let gone = || {
        let policies = policies.clone();
        async move { matches!(policies.get_opt(name).await, Ok(None)).then_some(()) }
    };
    let waited = eventually(
        "the policy's finalizer to be removed",
        Duration::from_secs(60),
        gone,
    );
    let error = waited.await.err()?;
    Some(format!("policy {name} is still there: {error}"))
}

/// Deletes `name`, which may be gone already; a failure is returned as a line to print.
pub async fn delete<K>(api: &Api<K>, name: &str) -> Option<String>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(e) => Some(format!("cannot delete {} {name}: {e}", K::kind(&()))),
    }
}

/// The kubeconfig path to show the user: the cluster's, or a copy at `copy_to` (never a copy of
/// the user's own kubeconfig, which may hold credentials).
pub fn publish_kubeconfig(
    cluster: &SimCluster,
    source: &ClusterSource,
    copy_to: Option<&Path>,
) -> Result<PathBuf> {
    let original = cluster.kubeconfig_path();
    let Some(copy) = copy_to.filter(|_| !source.is_shared()) else {
        return Ok(original.to_path_buf());
    };
    if let Some(dir) = copy.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::copy(original, copy)
        .with_context(|| format!("cannot copy the kubeconfig to {}", copy.display()))?;
    Ok(copy.to_path_buf())
}
