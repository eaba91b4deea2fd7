//! One test's corner of a shared real cluster ([`crate::launcher::test_kubeconfig`]).
//!
//! A [`Scratch`] has a random prefix ([`crate::sim::cluster::random_prefix`]): its namespace is
//! the prefix itself, and every cluster-scoped object the test makes (nodes, policies, further
//! namespaces, ClusterRoles and their bindings) is named `<prefix>-<short>`, so tests run in
//! parallel on one cluster without seeing each other's objects. Dropping it, also while the test
//! panics, deletes whatever is named with the prefix: namespaces (after removing pod finalizers
//! and force-deleting pods, since no kubelet may be left to finish them), nodes, their leases,
//! TenstorrentDriverPolicies, ClusterRoles, ClusterRoleBindings, and the Events in `default`
//! about those objects. The ttdp CRD is applied idempotently when asked for and never deleted
//! (other suites share it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config, ResourceExt};
use serde_json::json;

use crate::launcher;
use crate::sim::cluster::random_prefix;

/// Field manager of the CRD applied by [`Scratch::install_ttdp_crd`].
const CRD_FIELD_MANAGER: &str = "ttdp-e2e-tests";
/// How long [`Scratch::install_ttdp_crd`] waits for the CRD to be Established.
const CRD_ESTABLISHED_WITHIN: Duration = Duration::from_secs(30);
/// How long the cleanup of a dropped [`Scratch`] may take.
const CLEANUP_WITHIN: Duration = Duration::from_secs(60);

/// Why a scratch space could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    /// No cluster to work on (no `TTDP_TEST_KUBECONFIG` and no control plane could start).
    #[error("no test cluster: {0}")]
    NoCluster(String),
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// Its path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A request to the cluster failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done, naming the object.
        what: String,
        /// The server's answer.
        #[source]
        source: kube::Error,
    },
    /// The CRD was applied but did not become Established in time.
    #[error(
        "CRD {name} not Established within {}s; see the apiserver log",
        CRD_ESTABLISHED_WITHIN.as_secs()
    )]
    CrdNotEstablished {
        /// The CRD's name.
        name: String,
    },
}

impl ScratchError {
    fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ScratchError {
        let what = what.into();
        move |source| ScratchError::Api { what, source }
    }
}

/// One test's objects on the shared real cluster.
pub struct Scratch {
    prefix: String,
    kubeconfig: PathBuf,
    client: Client,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("prefix", &self.prefix)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl Scratch {
    /// A fresh prefix starting with `kind`, and its namespace (with its `default`
    /// ServiceAccount, so pods can be created at once), on the cluster of
    /// [`launcher::try_test_kubeconfig`].
    pub async fn new(kind: &str) -> Result<Scratch, ScratchError> {
        let kubeconfig = launcher::try_test_kubeconfig().map_err(ScratchError::NoCluster)?;
        let prefix = random_prefix(kind);
        let client = admin_client(&kubeconfig, &prefix).await?;
        let scratch = Scratch {
            prefix,
            kubeconfig,
            client,
        };
        scratch.create_namespace(scratch.namespace()).await?;
        Ok(scratch)
    }

    /// The test's prefix (also its namespace).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The test's own namespace.
    pub fn namespace(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>-<short>`: a cluster-unique name cleaned up with the test.
    pub fn name(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    /// `<short>` back from `<prefix>-<short>` (other names unchanged).
    pub fn short<'a>(&self, name: &'a str) -> &'a str {
        name.strip_prefix(&self.prefix)
            .and_then(|rest| rest.strip_prefix('-'))
            .unwrap_or(name)
    }

    /// Whether `name` is one of this test's names (the prefix itself or `<prefix>-...`).
    pub fn owns(&self, name: &str) -> bool {
        mine(&self.prefix, name)
    }

    /// The admin kubeconfig of the real cluster.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// An admin client of the real cluster, default namespace [`Scratch::namespace`], without
    /// kube's automatic retries.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Creates namespace `name` and its `default` ServiceAccount (the controller manager would
    /// create it a moment later; pods cannot be created before it exists). Existing ones are
    /// fine.
    pub async fn create_namespace(&self, name: &str) -> Result<(), ScratchError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns = Namespace {
            metadata: named(name),
            ..Namespace::default()
        };
        ignore_conflict(api.create(&PostParams::default(), &ns).await)
            .map_err(ScratchError::api(format!("create namespace {name}")))?;
        self.create_service_account(name, "default").await
    }

    /// Creates the ServiceAccount `name` in `namespace` (an existing one is fine).
    pub async fn create_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(), ScratchError> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let sa = ServiceAccount {
            metadata: named(name),
            ..ServiceAccount::default()
        };
        ignore_conflict(api.create(&PostParams::default(), &sa).await).map_err(ScratchError::api(
            format!("create service account {namespace}/{name}"),
        ))
    }

    /// Applies the ttdp CRD (forced server-side apply, so it is idempotent and other suites may
    /// have applied it first) and waits until it is Established. It is never deleted by a test.
    pub async fn install_ttdp_crd(&self) -> Result<(), ScratchError> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let crd = ttdp_api::crd();
        let name = crd.name_any();
        let mut value = serde_json::to_value(&crd).map_err(|e| ScratchError::Api {
            what: format!("serialize CRD {name}"),
            source: kube::Error::SerdeError(e),
        })?;
        value["apiVersion"] = json!("apiextensions.k8s.io/v1");
        value["kind"] = json!("CustomResourceDefinition");
        crds.patch(
            &name,
            &PatchParams::apply(CRD_FIELD_MANAGER).force(),
            &Patch::Apply(value),
        )
        .await
        .map_err(ScratchError::api(format!("apply CRD {name}")))?;
        let started = std::time::Instant::now();
        loop {
            let established = crds
                .get(&name)
                .await
                .ok()
                .and_then(|c| c.status)
                .is_some_and(|s| {
                    s.conditions
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            if established {
                return Ok(());
            }
            if started.elapsed() > CRD_ESTABLISHED_WITHIN {
                return Err(ScratchError::CrdNotEstablished { name });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let kubeconfig = self.kubeconfig.clone();
        let prefix = self.prefix.clone();
        // The test's runtime may be unwinding or blocked right here: clean up from a thread
        // with a runtime and client of its own.
        let cleanup = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("cleanup of test {prefix}: no runtime: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                let run = cleanup(&kubeconfig, &prefix);
                match tokio::time::timeout(CLEANUP_WITHIN, run).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => eprintln!("cleanup of test {prefix}: {e}"),
                    Err(_) => eprintln!(
                        "cleanup of test {prefix} did not finish within {}s",
                        CLEANUP_WITHIN.as_secs()
                    ),
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// An admin client of the kubeconfig at `path` with `namespace` as the default namespace and
/// without kube's automatic retries.
pub async fn admin_client(path: &Path, namespace: &str) -> Result<Client, ScratchError> {
    let failed = |reason: String| ScratchError::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| failed(e.to_string()))?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| failed(e.to_string()))?;
    config.default_retry = false;
    config.default_namespace = namespace.to_owned();
    Client::try_from(config).map_err(|e| failed(e.to_string()))
}

fn named(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

fn ignore_conflict<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

fn mine(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
}

/// Removes the finalizers of every object of `api` that has some.
async fn strip_finalizers<K>(api: &Api<K>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let no_finalizers = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let objects = api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for object in objects.iter().filter(|o| !o.finalizers().is_empty()) {
        let _ = api
            .patch(&object.name_any(), &PatchParams::default(), &no_finalizers)
            .await;
    }
}

async fn names_of<K>(api: &Api<K>, prefix: &str) -> Vec<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .map(ResourceExt::name_any)
        .filter(|n| mine(prefix, n))
        .collect()
}

/// Best effort: deletes everything named with `prefix` (namespaces with their pods at once and
/// finalizers of their ConfigMaps and DaemonSets removed, policies, nodes, node leases, cluster
/// roles and bindings, Events in `default` about them), reporting what could not be deleted.
pub async fn cleanup(kubeconfig: &Path, prefix: &str) -> Result<(), ScratchError> {
    let client = admin_client(kubeconfig, "default").await?;
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let no_finalizers = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let pp = PatchParams::default();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in names_of(&namespaces, prefix).await {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        for pod in pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let name = pod.name_any();
            if !pod.finalizers().is_empty() {
                let _ = pods.patch(&name, &pp, &no_finalizers).await;
            }
            let _ = pods.delete(&name, &now).await;
        }
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        strip_finalizers(&config_maps).await;
        let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
        strip_finalizers(&daemonsets).await;
        if let Err(e) = namespaces.delete(&ns, &DeleteParams::default()).await {
            eprintln!("cleanup {prefix}: delete namespace {ns}: {e}");
        }
    }
    let policy = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "driver.tenstorrent.com",
            "v1alpha1",
            "TenstorrentDriverPolicy",
        ),
        "tenstorrentdriverpolicies",
    );
    let policies: Api<DynamicObject> = Api::all_with(client.clone(), &policy);
    for name in names_of(&policies, prefix).await {
        let _ = policies.patch(&name, &pp, &no_finalizers).await;
        let _ = policies.delete(&name, &DeleteParams::default()).await;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for name in names_of(&nodes, prefix).await {
        let _ = nodes.patch(&name, &pp, &no_finalizers).await;
        if let Err(e) = nodes.delete(&name, &DeleteParams::default()).await {
            eprintln!("cleanup {prefix}: delete node {name}: {e}");
        }
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    for name in names_of(&leases, prefix).await {
        let _ = leases.delete(&name, &DeleteParams::default()).await;
    }
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    for name in names_of(&bindings, prefix).await {
        if let Err(e) = bindings.delete(&name, &DeleteParams::default()).await {
            eprintln!("cleanup {prefix}: delete clusterrolebinding {name}: {e}");
        }
    }
    let roles: Api<ClusterRole> = Api::all(client.clone());
    for name in names_of(&roles, prefix).await {
        if let Err(e) = roles.delete(&name, &DeleteParams::default()).await {
            eprintln!("cleanup {prefix}: delete clusterrole {name}: {e}");
        }
    }
    let events: Api<Event> = Api::namespaced(client, "default");
    for event in events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        if event
            .involved_object
            .name
            .as_deref()
            .is_some_and(|n| mine(prefix, n))
        {
            let _ = events
                .delete(&event.name_any(), &DeleteParams::default())
                .await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::mine;

    #[test]
    fn names_belong_to_a_prefix_only_whole() {
        assert!(mine("kt-abcde", "kt-abcde"));
        assert!(mine("kt-abcde", "kt-abcde-node-1"));
        assert!(!mine("kt-abcde", "kt-abcdef"));
        assert!(!mine("kt-abcde", "x-kt-abcde"));
    }
}
