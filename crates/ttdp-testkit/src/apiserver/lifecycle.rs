//! The background controllers the real control plane runs and a test cluster needs: owner
//! reference garbage collection (background, foreground, orphan), namespace termination, CRD
//! cleanup, completion of graceful pod deletion when no kubelet does it, and PodDisruptionBudget
//! status (the disruption controller).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::admission::CRD_CLEANUP_FINALIZER;
use super::catalog::ResourceType;
use super::cluster::{Cluster, ClusterState, DeleteOpts, WriteCtx};
use super::disruption;
use super::meta;

/// The `ca.crt` published into every namespace (the test server serves plain HTTP, so no client
/// verifies it).
const TEST_ROOT_CA: &str = "-----BEGIN CERTIFICATE-----\nttdp test API server: plain HTTP, no CA\n-----END CERTIFICATE-----\n";

/// Run the controllers until `stop` is cancelled: after every write and every 100 ms.
pub async fn run(cluster: Cluster, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = cluster.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        cluster.lock().reconcile();
    }
}

impl ClusterState {
    /// The served type objects under a storage key belong to.
    fn type_of_storage(&self, storage: &str) -> Option<ResourceType> {
        self.catalog
            .all()
            .iter()
            .find(|t| t.storage_key() == storage)
            .cloned()
    }

    /// The stored object with `uid` and its type.
    fn by_uid(&self, uid: &str) -> Option<(&Value, &str)> {
        let (storage, ns, name) = self.store.owners.locate(uid)?;
        Some((self.store.get(storage, ns, name)?, storage))
    }

    fn delete_quietly(&mut self, rt: &ResourceType, obj: &Value, propagation: &str) {
        if meta::is_deleting(obj) {
            return;
        }
        let opts = DeleteOpts {
            propagation: Some(propagation.into()),
            ..Default::default()
        };
        // Already gone is fine; nothing else can fail for a background delete.
        let _ = self.delete(rt, meta::namespace(obj), meta::name(obj), &opts);
    }

    /// Remove one finalizer the server owns; completes the deletion when none is left.
    fn drop_finalizer(&mut self, rt: &ResourceType, obj: &Value, finalizer: &str) {
        let mut updated = obj.clone();
        let remaining: Vec<String> = meta::finalizers(obj)
            .into_iter()
            .filter(|f| f != finalizer)
            .collect();
        if remaining.is_empty() {
            meta::remove(&mut updated, "finalizers");
        } else {
            meta::set(&mut updated, "finalizers", json!(remaining));
        }
        let stored = self.store_direct(rt, obj, updated);
        let pod_waiting = rt.group.is_empty()
            && rt.plural == "pods"
            && stored["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0)
                > 0;
        if meta::is_deleting(&stored) && meta::finalizers(&stored).is_empty() && !pod_waiting {
            self.remove_now(rt, &stored);
        }
    }

    /// One pass of every controller.
    pub fn reconcile(&mut self) {
        self.collect_garbage();
        self.publish_namespace_defaults();
        self.terminate_namespaces();
        self.clean_up_crds();
        self.update_disruption_budgets();
    }

    /// Owner-reference garbage collection, for the objects whose owners, dependents, deletion
    /// or finalizers changed since the last pass (the owner index tracks them).
    fn collect_garbage(&mut self) {
        // Each round's writes mark more objects; a few rounds settle any chain a test builds,
        // and whatever is left waits for the next wake-up.
        for _ in 0..8 {
            let dirty = self.store.owners.take_dirty();
            if dirty.is_empty() {
                return;
            }
            let mut dependents = BTreeSet::new();
            for uid in &dirty {
                match self.by_uid(uid) {
                    Some((obj, _)) if !meta::is_deleting(obj) => {}
                    _ => dependents.extend(self.store.owners.dependents_of(uid)),
                }
            }
            for uid in dirty.iter().chain(&dependents) {
                self.check_owners(uid);
            }
            for uid in &dirty {
                self.finish_owner_deletion(uid);
            }
        }
    }

    /// Delete an object whose owners are all gone or being deleted in the foreground, or drop
    /// the references to owners that are gone or orphaning it.
    fn check_owners(&mut self, uid: &str) {
        let Some((obj, storage)) = self.by_uid(uid) else {
            return;
        };
        let refs = obj["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if refs.is_empty() {
            return;
        }
        let mut kept = Vec::new();
        let mut any_owner = false;
        let mut foreground = false;
        for r in &refs {
            let Some((owner, _)) = self.by_uid(r["uid"].as_str().unwrap_or_default()) else {
                continue;
            };
            any_owner = true;
            let finalizers = meta::finalizers(owner);
            if meta::is_deleting(owner) {
                if finalizers.iter().any(|f| f == "orphan") {
                    continue;
                }
                foreground |= finalizers.iter().any(|f| f == "foregroundDeletion");
            }
            kept.push(r.clone());
        }
        let (obj, storage) = (obj.clone(), storage.to_string());
        let Some(rt) = self.type_of_storage(&storage) else {
            return;
        };
        if !any_owner || foreground {
            self.delete_quietly(&rt, &obj, "Background");
        } else if kept.len() != refs.len() {
            let mut updated = obj.clone();
            if kept.is_empty() {
                meta::remove(&mut updated, "ownerReferences");
            } else {
                meta::set(&mut updated, "ownerReferences", json!(kept));
            }
            self.store_direct(&rt, &obj, updated);
        }
    }

    /// Drop `foregroundDeletion` once no dependent blocks it, and `orphan` once no dependent
    /// names the owner any more.
    fn finish_owner_deletion(&mut self, uid: &str) {
        let Some((obj, storage)) = self.by_uid(uid) else {
            return;
        };
        if !meta::is_deleting(obj) {
            return;
        }
        let finalizers = meta::finalizers(obj);
        let (obj, storage) = (obj.clone(), storage.to_string());
        let Some(rt) = self.type_of_storage(&storage) else {
            return;
        };
        let dependents = self.store.owners.dependents_of(uid);
        if finalizers.iter().any(|f| f == "foregroundDeletion") {
            let blocked = dependents.iter().any(|d| {
                self.by_uid(d).is_some_and(|(dep, _)| {
                    dep["metadata"]["ownerReferences"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|r| r["uid"] == uid && r["blockOwnerDeletion"] == true)
                })
            });
            if !blocked {
                self.drop_finalizer(&rt, &obj, "foregroundDeletion");
                return;
            }
        }
        if finalizers.iter().any(|f| f == "orphan") && dependents.is_empty() {
            self.drop_finalizer(&rt, &obj, "orphan");
        }
    }

    /// What the service-account controller and the root-CA publisher add to every namespace:
    /// the `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap.
    fn publish_namespace_defaults(&mut self) {
        let changed = self.store.last_change("/namespaces");
        if changed <= self.namespaces_synced_at {
            return;
        }
        self.namespaces_synced_at = changed;
        let active: Vec<String> = self
            .store
            .list("/namespaces", None)
            .into_iter()
            .filter(|ns| !meta::is_deleting(ns))
            .map(|ns| meta::name(ns).to_owned())
            .collect();
        let ctx = WriteCtx {
            manager: "kube-controller-manager".into(),
            ..Default::default()
        };
        let defaults = [
            ("serviceaccounts", json!({"metadata": {"name": "default"}})),
            (
                "configmaps",
                json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": TEST_ROOT_CA}}),
            ),
        ];
        for (plural, body) in defaults {
            let Some(rt) = self.resource("", "v1", plural) else {
                continue;
            };
            for ns in &active {
                if self
                    .store
                    .get(&rt.storage_key(), ns, meta::name(&body))
                    .is_none()
                {
                    // A client may have created it first; nothing else can fail here.
                    let _ = self.create(&rt, ns, body.clone(), &ctx);
                }
            }
        }
    }

    fn terminate_namespaces(&mut self) {
        let terminating: Vec<Value> = self
            .store
            .list("/namespaces", None)
            .into_iter()
            .filter(|ns| meta::is_deleting(ns))
            .cloned()
            .collect();
        if terminating.is_empty() {
            return;
        }
        let Some(ns_rt) = self.resource("", "v1", "namespaces") else {
            return;
        };
        let mut namespaced: Vec<ResourceType> = Vec::new();
        for rt in self.catalog.all() {
            if rt.namespaced
                && !namespaced
                    .iter()
                    .any(|t| t.storage_key() == rt.storage_key())
            {
                namespaced.push(rt.clone());
            }
        }
        for ns in terminating {
            let name = meta::name(&ns);
            let contents: Vec<(ResourceType, Value)> = namespaced
                .iter()
                .flat_map(|rt| {
                    self.store
                        .list(&rt.storage_key(), Some(name))
                        .into_iter()
                        .map(|obj| (rt.clone(), obj.clone()))
                })
                .collect();
            if contents.is_empty() {
                let mut updated = ns.clone();
                if let Some(f) = updated["spec"]["finalizers"].as_array_mut() {
                    f.retain(|x| x != "kubernetes");
                }
                let stored = self.store_direct(&ns_rt, &ns, updated);
                if meta::finalizers(&stored).is_empty() {
                    self.remove_now(&ns_rt, &stored);
                }
            } else {
                for (rt, obj) in contents {
                    self.delete_quietly(&rt, &obj, "Background");
                }
            }
        }
    }

    fn clean_up_crds(&mut self) {
        let Some(crd_rt) = self.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        else {
            return;
        };
        let deleting: Vec<Value> = self
            .store
            .list(&crd_rt.storage_key(), None)
            .into_iter()
            .filter(|c| {
                meta::is_deleting(c)
                    && meta::finalizers(c)
                        .iter()
                        .any(|f| f == CRD_CLEANUP_FINALIZER)
            })
            .cloned()
            .collect();
        for crd in deleting {
            let group = crd["spec"]["group"].as_str().unwrap_or_default();
            let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
            let storage = format!("{group}/{plural}");
            let remaining: Vec<Value> = self
                .store
                .list(&storage, None)
                .into_iter()
                .cloned()
                .collect();
            let cr_rt = self.type_of_storage(&storage);
            match (remaining.is_empty(), cr_rt) {
                (true, _) | (false, None) => {
                    self.drop_finalizer(&crd_rt, &crd, CRD_CLEANUP_FINALIZER)
                }
                (false, Some(rt)) => {
                    for obj in remaining {
                        self.delete_quietly(&rt, &obj, "Background");
                    }
                }
            }
        }
    }

    /// The disruption controller: each budget's status from the pods it selects, recomputed
    /// when pods or budgets changed.
    fn update_disruption_budgets(&mut self) {
        let Some(pdb_rt) = self.resource("policy", "v1", "poddisruptionbudgets") else {
            return;
        };
        let Some(pods_rt) = self.resource("", "v1", "pods") else {
            return;
        };
        let (pdb_key, pods_key) = (pdb_rt.storage_key(), pods_rt.storage_key());
        let changed = self
            .store
            .last_change(&pdb_key)
            .max(self.store.last_change(&pods_key));
        if changed <= self.budgets_synced_at {
            return;
        }
        self.budgets_synced_at = self.store.revision();
        let mut updates: Vec<(Value, Value)> = Vec::new();
        for pdb in self.store.list(&pdb_key, None) {
            let namespace = meta::namespace(pdb);
            let pods = self.store.list(&pods_key, Some(namespace));
            let scale = |owner: &Value| self.controller_scale(owner, namespace);
            let status = match disruption::evaluate(pdb, pods.iter().copied(), scale) {
                Ok(budget) => {
                    let mut status = disruption::status(pdb, &budget);
                    // Evicted pods stop counting once they are gone or terminating.
                    if let Some(disrupted) = status["disruptedPods"].as_object_mut() {
                        disrupted.retain(|name, _| {
                            pods.iter()
                                .any(|p| meta::name(p) == name && !meta::is_deleting(p))
                        });
                        if disrupted.is_empty()
                            && let Some(s) = status.as_object_mut()
                        {
                            s.remove("disruptedPods");
                        }
                    }
                    status
                }
                Err(message) => disruption::fail_safe_status(pdb, &message),
            };
            if pdb["status"] != status {
                updates.push((pdb.clone(), status));
            }
        }
        for (pdb, status) in updates {
            let mut updated = pdb.clone();
            updated["status"] = status;
            self.store_direct(&pdb_rt, &pdb, updated);
        }
    }

    /// The uid and desired scale of a pod's controller, as the disruption controller's finders
    /// answer it: a ReplicaSet's replicas, or its Deployment's when a Deployment controls it
    /// (replicas default to 1). Other controllers (DaemonSets among them) have no scale here.
    fn controller_scale(&self, owner: &Value, namespace: &str) -> Option<(String, i64)> {
        let find = |plural: &str, reference: &Value| {
            let obj = self.store.get(
                &format!("apps/{plural}"),
                namespace,
                reference["name"].as_str()?,
            )?;
            (meta::uid(obj) == reference["uid"].as_str()?).then_some(obj)
        };
        let replicas = |obj: &Value| obj["spec"]["replicas"].as_i64().unwrap_or(1);
        if owner["kind"] != "ReplicaSet" || owner["apiVersion"] != "apps/v1" {
            return None;
        }
        let rs = find("replicasets", owner)?;
        let parent = rs["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["controller"] == true && r["kind"] == "Deployment");
        match parent {
            Some(d) => find("deployments", d).map(|d| (meta::uid(d).to_owned(), replicas(d))),
            None => Some((meta::uid(rs).to_owned(), replicas(rs))),
        }
    }
}
