//! The background controllers the real control plane runs and a test cluster needs: owner
//! reference garbage collection (background, foreground, orphan), namespace termination, CRD
//! cleanup, completion of graceful pod deletion when no kubelet does it, and PodDisruptionBudget
//! status (the disruption controller).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::admission::CRD_CLEANUP_FINALIZER;
use super::catalog::ResourceType;
use super::cluster::{Cluster, ClusterState, DeleteOpts, PodTermination};
use super::disruption;
use super::meta;

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

struct Entry {
    rt: ResourceType,
    obj: Value,
}

impl ClusterState {
    fn all_objects(&self) -> Vec<Entry> {
        let mut by_storage: HashMap<String, ResourceType> = HashMap::new();
        for rt in self.catalog.all() {
            by_storage
                .entry(rt.storage_key())
                .or_insert_with(|| rt.clone());
        }
        let mut out = Vec::new();
        for key in self.store.storage_keys() {
            let Some(rt) = by_storage.get(&key) else {
                continue;
            };
            for obj in self.store.list(&key, None) {
                out.push(Entry {
                    rt: rt.clone(),
                    obj: obj.clone(),
                });
            }
        }
        out
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
        self.terminate_namespaces();
        self.clean_up_crds();
        self.finish_pod_deletions();
        self.update_disruption_budgets();
    }

    fn collect_garbage(&mut self) {
        let objects = self.all_objects();
        let by_uid: HashMap<String, &Entry> = objects
            .iter()
            .map(|e| (meta::uid(&e.obj).to_string(), e))
            .collect();
        let mut dependents_of: HashMap<String, Vec<(&Entry, bool)>> = HashMap::new();
        let mut to_delete: Vec<(ResourceType, Value)> = Vec::new();
        let mut to_rewrite: Vec<(ResourceType, Value, Value)> = Vec::new();
        for e in &objects {
            let refs = e.obj["metadata"]["ownerReferences"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if refs.is_empty() {
                continue;
            }
            let mut kept = Vec::new();
            let mut delete_for_foreground = false;
            for r in &refs {
                let uid = r["uid"].as_str().unwrap_or_default();
                let Some(owner) = by_uid.get(uid) else {
                    continue;
                };
                let owner_finalizers = meta::finalizers(&owner.obj);
                let deleting = meta::is_deleting(&owner.obj);
                if deleting && owner_finalizers.iter().any(|f| f == "orphan") {
                    continue;
                }
                if deleting && owner_finalizers.iter().any(|f| f == "foregroundDeletion") {
                    delete_for_foreground = true;
                }
                dependents_of
                    .entry(uid.to_string())
                    .or_default()
                    .push((e, r["blockOwnerDeletion"].as_bool() == Some(true)));
                kept.push(r.clone());
            }
            let all_dangling = refs
                .iter()
                .all(|r| !by_uid.contains_key(r["uid"].as_str().unwrap_or_default()));
            if all_dangling || delete_for_foreground {
                to_delete.push((e.rt.clone(), e.obj.clone()));
            } else if kept.len() != refs.len() {
                let mut updated = e.obj.clone();
                if kept.is_empty() {
                    meta::remove(&mut updated, "ownerReferences");
                } else {
                    meta::set(&mut updated, "ownerReferences", json!(kept));
                }
                to_rewrite.push((e.rt.clone(), e.obj.clone(), updated));
            }
        }
        let mut orphaning: Vec<(ResourceType, Value)> = Vec::new();
        let mut foreground_done: Vec<(ResourceType, Value)> = Vec::new();
        for e in &objects {
            if !meta::is_deleting(&e.obj) {
                continue;
            }
            let finalizers = meta::finalizers(&e.obj);
            if finalizers.iter().any(|f| f == "orphan") {
                orphaning.push((e.rt.clone(), e.obj.clone()));
            }
            let deps = dependents_of
                .get(meta::uid(&e.obj))
                .map(Vec::as_slice)
                .unwrap_or_default();
            if finalizers.iter().any(|f| f == "foregroundDeletion")
                && !deps.iter().any(|(_, blocking)| *blocking)
            {
                foreground_done.push((e.rt.clone(), e.obj.clone()));
            }
        }
        for (rt, old, new) in to_rewrite {
            self.store_direct(&rt, &old, new);
        }
        for (rt, obj) in to_delete {
            if let Some(current) = self
                .store
                .get(&rt.storage_key(), meta::namespace(&obj), meta::name(&obj))
                .cloned()
            {
                self.delete_quietly(&rt, &current, "Background");
            }
        }
        for (rt, obj) in foreground_done {
            if let Some(current) = self
                .store
                .get(&rt.storage_key(), meta::namespace(&obj), meta::name(&obj))
                .cloned()
            {
                self.drop_finalizer(&rt, &current, "foregroundDeletion");
            }
        }
        for (rt, obj) in orphaning {
            let uid = meta::uid(&obj);
            let referenced = self.all_objects().iter().any(|d| {
                d.obj["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
            });
            if !referenced
                && let Some(current) = self
                    .store
                    .get(&rt.storage_key(), meta::namespace(&obj), meta::name(&obj))
                    .cloned()
            {
                self.drop_finalizer(&rt, &current, "orphan");
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
        let objects = self.all_objects();
        for ns in terminating {
            let name = meta::name(&ns);
            let contents: Vec<&Entry> = objects
                .iter()
                .filter(|e| e.rt.namespaced && meta::namespace(&e.obj) == name)
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
                for e in contents {
                    self.delete_quietly(&e.rt, &e.obj, "Background");
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
            let cr_rt = self
                .catalog
                .all()
                .iter()
                .find(|t| t.storage_key() == storage)
                .cloned();
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

    fn finish_pod_deletions(&mut self) {
        let PodTermination::Automatic { delay } = self.options.pod_termination else {
            return;
        };
        let Some(pods_rt) = self.resource("", "v1", "pods") else {
            return;
        };
        let terminating: Vec<Value> = self
            .store
            .list(&pods_rt.storage_key(), None)
            .into_iter()
            .filter(|p| meta::is_deleting(p))
            .cloned()
            .collect();
        let now = Instant::now();
        for pod in terminating {
            let key = (
                meta::namespace(&pod).to_string(),
                meta::name(&pod).to_string(),
            );
            let since = *self.terminating_since.entry(key).or_insert(now);
            let grace = pod["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0)
                .max(0) as u64;
            let wait = delay.min(Duration::from_secs(grace));
            if now.duration_since(since) < wait {
                continue;
            }
            if meta::finalizers(&pod).is_empty() {
                self.remove_now(&pods_rt, &pod);
            } else if grace > 0 {
                let mut updated = pod.clone();
                meta::set(&mut updated, "deletionGracePeriodSeconds", json!(0));
                self.store_direct(&pods_rt, &pod, updated);
            }
        }
    }

    fn update_disruption_budgets(&mut self) {
        let Some(pdb_rt) = self.resource("policy", "v1", "poddisruptionbudgets") else {
            return;
        };
        let Some(pods_rt) = self.resource("", "v1", "pods") else {
            return;
        };
        let pdbs: Vec<Value> = self
            .store
            .list(&pdb_rt.storage_key(), None)
            .into_iter()
            .cloned()
            .collect();
        if pdbs.is_empty() {
            return;
        }
        let pods: Vec<Value> = self
            .store
            .list(&pods_rt.storage_key(), None)
            .into_iter()
            .cloned()
            .collect();
        for pdb in pdbs {
            let budget = disruption::evaluate(&pdb, &pods);
            let mut status = disruption::status(&pdb, &budget);
            // Evicted pods stop counting once they are gone.
            if let Some(disrupted) = status["disruptedPods"].as_object_mut() {
                disrupted.retain(|name, _| {
                    pods.iter().any(|p| {
                        meta::name(p) == name
                            && meta::namespace(p) == meta::namespace(&pdb)
                            && !meta::is_deleting(p)
                    })
                });
                if disrupted.is_empty()
                    && let Some(s) = status.as_object_mut()
                {
                    s.remove("disruptedPods");
                }
            }
            if pdb["status"] != status {
                let mut updated = pdb.clone();
                updated["status"] = status;
                self.store_direct(&pdb_rt, &pdb, updated);
            }
        }
    }
}
