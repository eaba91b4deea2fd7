//! One test's corner of a shared real cluster ([`crate::launcher::test_kubeconfig`]).
//!
//! A [`Scratch`] has a random prefix ([`crate::sim::cluster::random_prefix`]): its namespace is
//! the prefix itself, and every cluster-scoped object the test makes (nodes, policies, further
//! namespaces, ClusterRoles and their bindings) is named `<prefix>-<short>`, so tests run in
//! parallel on one cluster without seeing each other's objects. Dropping it, also while the test
//! panics, deletes whatever is named with the prefix: namespaces (after removing pod finalizers
//! and force-deleting pods, since no kubelet may be left to finish them), nodes, their leases,
//! TenstorrentDriverPolicies, ClusterRoles, ClusterRoleBindings, and the Events in `default`
//! about those objects. The ttdp CRD ([`crate::cluster_setup::install_crd`]) is never
//! deleted: other suites share it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::ApiResource;
use kube::{Client, Config, ResourceExt};
use serde_json::json;

use ttdp_api::TenstorrentDriverPolicy;

use crate::cluster_setup::{apply_namespace, apply_service_account};
use crate::launcher;
use crate::sim::cluster::random_prefix;

/// How long the cleanup of a dropped [`Scratch`] may take.
const CLEANUP_WITHIN: Duration = Duration::from_secs(60);

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
    pub async fn new(kind: &str) -> Result<Scratch> {
        let kubeconfig =
            launcher::try_test_kubeconfig().map_err(|e| anyhow!("no test cluster: {e}"))?;
        let prefix = random_prefix(kind);
        let client = admin_client(&kubeconfig, &prefix).await?;
        apply_namespace(&client, &prefix).await?;
        // The controller manager would create it a moment later; pods cannot be created
        // before it exists.
        apply_service_account(&client, &prefix, "default").await?;
        Ok(Scratch {
            prefix,
            kubeconfig,
            client,
        })
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
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // The test's runtime may be unwinding or blocked right here: clean up on a runtime and
        // with a client of its own.
        let run = tokio::time::timeout(CLEANUP_WITHIN, cleanup(&self.kubeconfig, &self.prefix));
        let problem = match launcher::blocking(run) {
            Ok(Ok(Ok(()))) => return,
            Ok(Ok(Err(e))) => format!("{e:#}"),
            Ok(Err(_)) => format!("did not finish within {}s", CLEANUP_WITHIN.as_secs()),
            Err(e) => e.to_string(),
        };
        eprintln!("cleanup of test {}: {problem}", self.prefix);
    }
}

/// An admin client of the kubeconfig at `path` with `namespace` as the default namespace and
/// without kube's automatic retries.
pub async fn admin_client(path: &Path, namespace: &str) -> Result<Client> {
    let context = || format!("kubeconfig {}", path.display());
    let kubeconfig = Kubeconfig::read_from(path).with_context(context)?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(context)?;
    config.default_retry = false;
    config.default_namespace = namespace.to_owned();
    Client::try_from(config).with_context(context)
}

fn mine(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
}

/// What the cleanup lists, patches and deletes.
trait Object: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug {}
impl<K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug> Object for K {}

/// Every object of `api` (none when it cannot be listed), or those named with `prefix`.
async fn list<K: Object>(api: &Api<K>, prefix: Option<&str>) -> Vec<K> {
    let objects = api.list(&ListParams::default()).await;
    let mut objects = objects.map(|l| l.items).unwrap_or_default();
    objects.retain(|o| prefix.is_none_or(|prefix| mine(prefix, &o.name_any())));
    objects
}

/// Removes the finalizers of those `objects` that have some: no controller may be left to
/// finish them.
async fn strip_finalizers<K: Object>(api: &Api<K>, objects: &[K]) {
    let no_finalizers = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    for object in objects.iter().filter(|o| !o.finalizers().is_empty()) {
        let _ = api
            .patch(&object.name_any(), &PatchParams::default(), &no_finalizers)
            .await;
    }
}

/// Deletes `objects` after removing their finalizers, reporting failures other than NotFound.
async fn delete_all<K: Object>(api: &Api<K>, objects: &[K], params: &DeleteParams, prefix: &str) {
    strip_finalizers(api, objects).await;
    for object in objects {
        let name = object.name_any();
        match api.delete(&name, params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => eprintln!("cleanup {prefix}: delete {name}: {e}"),
        }
    }
}

/// Deletes the objects of `api` named with `prefix`.
async fn delete_owned<K: Object>(api: Api<K>, prefix: &str) {
    let objects = list(&api, Some(prefix)).await;
    delete_all(&api, &objects, &DeleteParams::default(), prefix).await;
}

/// Best effort: deletes everything named with `prefix` (namespaces with their pods at once and
/// finalizers of their ConfigMaps and DaemonSets removed, policies, nodes, node leases, cluster
/// roles and bindings, Events in `default` about them), reporting what could not be deleted.
pub async fn cleanup(kubeconfig: &Path, prefix: &str) -> Result<()> {
    let client = admin_client(kubeconfig, "default").await?;
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let normal = DeleteParams::default();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let owned_namespaces = list(&namespaces, Some(prefix)).await;
    for ns in owned_namespaces.iter().map(ResourceExt::name_any) {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        delete_all(&pods, &list(&pods, None).await, &now, prefix).await;
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        strip_finalizers(&config_maps, &list(&config_maps, None).await).await;
        let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
        strip_finalizers(&daemonsets, &list(&daemonsets, None).await).await;
    }
    delete_all(&namespaces, &owned_namespaces, &normal, prefix).await;
    let policy = ApiResource::erase::<TenstorrentDriverPolicy>(&());
    let policies = Api::<DynamicObject>::all_with(client.clone(), &policy);
    delete_owned(policies, prefix).await;
    delete_owned(Api::<Node>::all(client.clone()), prefix).await;
    let node_leases = Api::<Lease>::namespaced(client.clone(), "kube-node-lease");
    delete_owned(node_leases, prefix).await;
    delete_owned(Api::<ClusterRoleBinding>::all(client.clone()), prefix).await;
    delete_owned(Api::<ClusterRole>::all(client.clone()), prefix).await;
    let events: Api<Event> = Api::namespaced(client, "default");
    let mut about_ours = list(&events, None).await;
    about_ours.retain(|e| {
        e.involved_object
            .name
            .as_deref()
            .is_some_and(|n| mine(prefix, n))
    });
    delete_all(&events, &about_ours, &normal, prefix).await;
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
