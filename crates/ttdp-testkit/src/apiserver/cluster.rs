//! The cluster state and the verbs on it (get, list, create, patch, delete):
//! optimistic concurrency, `metadata.generation`, the status subresource split, graceful pod
//! deletion and finalizers. Everything runs under one lock, so each request is atomic.

use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::Notify;

use super::catalog::{self, ResourceType};
use super::meta;
use super::patch::{self, PatchType};
use super::selectors::Selection;
use super::status::{self, ApiError};
use super::store::Store;

/// Everything the server knows: objects and history (the served types follow from the CRDs).
#[derive(Debug, Default)]
pub struct ClusterState {
    /// Objects and history.
    pub store: Store,
}

/// The shared handle to the state and the wake-up signal of the disruption controller.
#[derive(Debug, Clone)]
pub struct Cluster {
    state: Arc<Mutex<ClusterState>>,
    /// Poked after every write so PodDisruptionBudget statuses follow promptly.
    pub wake: Arc<Notify>,
}

impl Default for Cluster {
    /// A cluster with the default namespaces.
    fn default() -> Self {
        let mut state = ClusterState::default();
        if let Some(rt) = state.resource("", "v1", "namespaces") {
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                // Seeding an empty store cannot fail.
                let _ = state.create(&rt, "", json!({"metadata": {"name": ns}}));
            }
        }
        Self {
            state: Arc::new(Mutex::new(state)),
            wake: Arc::new(Notify::new()),
        }
    }
}

impl Cluster {
    /// Lock the state (a poisoned lock is recovered: every write is all-or-nothing on JSON
    /// values, so the state stays consistent).
    pub fn lock(&self) -> MutexGuard<'_, ClusterState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ClusterState {
    /// Every served type.
    pub fn served(&self) -> Vec<ResourceType> {
        catalog::served(&self.store)
    }

    /// Find a served type.
    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<ResourceType> {
        let mut served = self.served().into_iter();
        served.find(|t| t.group == group && t.version == version && t.plural == plural)
    }

    /// GET one object.
    pub fn get(&self, rt: &ResourceType, namespace: &str, name: &str) -> Result<Value, ApiError> {
        self.store
            .get(&rt.storage_key(), namespace, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// LIST with selectors, always whole and at the latest revision: a `resourceVersion` is
    /// ignored and so is `limit` (a server may ignore it and return every result; the routes
    /// refuse a `continue`, as no list here is ever paged).
    pub fn list(&self, rt: &ResourceType, selection: &Selection) -> Value {
        let mut items = self.store.list(&rt.storage_key(), selection.namespace());
        items.retain(|o| selection.matches(o));
        json!({
            "kind": format!("{}List", rt.kind),
            "apiVersion": rt.api_version(),
            "metadata": {"resourceVersion": self.store.revision().to_string()},
            "items": items,
        })
    }

    /// POST a new object. Returns the stored object.
    pub fn create(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        mut body: Value,
    ) -> Result<Value, ApiError> {
        check_supported(rt, &body)?;
        if rt.namespaced {
            let in_body = meta::text(&body, "namespace");
            if !in_body.is_empty() && in_body != namespace {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            if let Some(namespaces) = self.resource("", "v1", "namespaces")
                && self.store.get("/namespaces", "", namespace).is_none()
            {
                return Err(ApiError::not_found(&namespaces, namespace));
            }
            meta::set(&mut body, "namespace", json!(namespace));
        } else {
            meta::remove(&mut body, "namespace");
        }
        if meta::text(&body, "name").is_empty() {
            let prefix = meta::text(&body, "generateName").to_string();
            if prefix.is_empty() {
                return Err(ApiError::bad_request(
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            // A generated name that is taken is AlreadyExists, as on the real server.
            let name = format!("{prefix}{}", meta::name_suffix());
            meta::set(&mut body, "name", json!(name));
        }
        let name = meta::text(&body, "name").to_string();
        if self.get(rt, namespace, &name).is_ok() {
            return Err(ApiError::already_exists(rt, &name));
        }
        for field in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
            meta::remove(&mut body, field);
        }
        meta::set(&mut body, "uid", json!(meta::new_uid()));
        meta::set(&mut body, "creationTimestamp", meta::timestamp(0));
        meta::set(&mut body, "generation", json!(1));
        if rt.custom
            && rt.status_subresource
            && let Some(o) = body.as_object_mut()
        {
            o.remove("status");
        }
        Ok(self.commit(rt, None, body))
    }

    /// PATCH (main resource or `status`); an apply patch creates a missing object. Checks the
    /// name and `resourceVersion` of the patched object, then keeps what the client may not
    /// change through `subresource`. Returns the stored object and whether it was created.
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        patch_type: PatchType,
        patch: Value,
        subresource: &str,
    ) -> Result<(Value, bool), ApiError> {
        let existing = match self.get(rt, namespace, name) {
            Ok(existing) => existing,
            Err(_) if patch_type == PatchType::Apply && subresource.is_empty() => {
                let mut applied = patch;
                meta::set(&mut applied, "name", json!(name));
                return Ok((self.create(rt, namespace, applied)?, true));
            }
            Err(e) => return Err(e),
        };
        let mut patched = existing.clone();
        match patch_type {
            PatchType::Merge | PatchType::Apply => json_patch::merge(&mut patched, &patch),
            PatchType::Json => patch::json_patch(&mut patched, patch)?,
        }
        check_supported(rt, &patched)?;
        let patched_name = meta::text(&patched, "name");
        if !patched_name.is_empty() && patched_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({patched_name}) does not match the name on the URL ({name})"
            )));
        }
        let rv = meta::text(&patched, "resourceVersion");
        if !rv.is_empty() && rv != meta::text(&existing, "resourceVersion") {
            return Err(ApiError::stale(rt, name));
        }
        meta::set(&mut patched, "name", json!(name));
        let patched = scope_write(rt, &existing, patched, subresource);
        Ok((self.commit(rt, Some(&existing), patched), false))
    }

    /// Stamp and store a write (`old` None: a create) unless it changes nothing; remove an
    /// object whose deletion it completes.
    fn commit(&mut self, rt: &ResourceType, old: Option<&Value>, mut new: Value) -> Value {
        new["apiVersion"] = json!(rt.api_version());
        new["kind"] = json!(rt.kind);
        if let Some(old) = old {
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "namespace",
                "resourceVersion",
            ] {
                match old["metadata"].get(field) {
                    Some(v) => meta::set(&mut new, field, v.clone()),
                    None => meta::remove(&mut new, field),
                }
            }
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            let bump = spec_of(rt, old) != spec_of(rt, &new);
            meta::set(&mut new, "generation", json!(generation + i64::from(bump)));
            if *old == new {
                return new;
            }
        }
        let stored = self.store.put(&rt.storage_key(), new);
        let grace = stored["metadata"]["deletionGracePeriodSeconds"].as_i64();
        let pod_waits = rt.is("", "pods") && grace.unwrap_or(0) > 0;
        if meta::is_deleting(&stored) && !meta::has_finalizers(&stored) && !pod_waits {
            return self
                .store
                .remove(&rt.storage_key(), &stored)
                .unwrap_or(stored);
        }
        stored
    }

    /// Store a status the server writes itself (a PodDisruptionBudget's), if it changed.
    pub fn store_status(&mut self, storage: &str, old: &Value, status: Value) {
        if old["status"] != status {
            let mut new = old.clone();
            new["status"] = status;
            self.store.put(storage, new);
        }
    }

    /// DELETE one object with `options` (a `DeleteOptions`, null for none). Returns the object
    /// while it is still terminating (finalizers, or a pod's grace period for its kubelet), or
    /// a `Success` status once it is gone. Dependents and a namespace's contents are left alone:
    /// there is no garbage collector.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        options: &Value,
    ) -> Result<Value, ApiError> {
        // kubectl sends `--dry-run=server` of a delete or an eviction in the body.
        if !options["dryRun"].is_null() {
            let message = "dryRun is not supported by this imitation API server";
            return Err(ApiError::bad_request(message));
        }
        let existing = self.get(rt, namespace, name)?;
        let uid = meta::text(&existing, "uid").to_string();
        let preconditions = &options["preconditions"];
        if let Some(want) = preconditions["uid"].as_str().filter(|u| *u != uid) {
            let why = format!(
                "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
            );
            return Err(ApiError::conflict(rt, name, &why));
        }
        let rv = preconditions["resourceVersion"].as_str();
        if rv.is_some_and(|rv| rv != meta::text(&existing, "resourceVersion")) {
            return Err(ApiError::stale(rt, name));
        }
        let grace = grace_period(rt, &existing, options["gracePeriodSeconds"].as_i64());
        if !meta::has_finalizers(&existing) && grace == 0 {
            self.store.remove(&rt.storage_key(), &existing);
            let details = json!({"name": name, "group": rt.group, "kind": rt.plural, "uid": uid});
            return Ok(status::status("Success", 200, details));
        }
        let current = existing["metadata"]["deletionGracePeriodSeconds"].as_i64();
        if meta::is_deleting(&existing) && current.is_none_or(|g| grace >= g) {
            return Ok(existing);
        }
        let mut updated = existing;
        meta::set(&mut updated, "deletionTimestamp", meta::timestamp(grace));
        meta::set(&mut updated, "deletionGracePeriodSeconds", json!(grace));
        Ok(self.store.put(&rt.storage_key(), updated))
    }
}

/// Refuses what the imitation would get wrong: a body that is not an object, and a
/// PodDisruptionBudget other than the demo's kind (`maxUnavailable` over `matchLabels`), which
/// is all the disruption controller and the eviction check evaluate.
fn check_supported(rt: &ResourceType, body: &Value) -> Result<(), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    let spec = &body["spec"];
    let pdb_supported = spec["minAvailable"].is_null()
        && spec["selector"]["matchExpressions"].is_null()
        && spec["unhealthyPodEvictionPolicy"].is_null();
    if rt.is("policy", "poddisruptionbudgets") && !pdb_supported {
        return Err(ApiError::bad_request(
            "this imitation API server supports only PodDisruptionBudgets with maxUnavailable and selector.matchLabels (no minAvailable, matchExpressions or unhealthyPodEvictionPolicy)",
        ));
    }
    Ok(())
}

/// How long a deleted pod is left to its kubelet: 0 for other objects and for pods that are
/// unscheduled or finished, else the `requested` grace period, the pod's, or 30 s.
fn grace_period(rt: &ResourceType, obj: &Value, requested: Option<i64>) -> i64 {
    let phase = obj["status"]["phase"].as_str().unwrap_or_default();
    let node = obj["spec"]["nodeName"].as_str().unwrap_or_default();
    if !rt.is("", "pods") || node.is_empty() || matches!(phase, "Succeeded" | "Failed") {
        return 0;
    }
    let grace = requested
        .or_else(|| obj["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30);
    if grace < 0 { 30 } else { grace }
}

/// The part of an object whose change bumps `metadata.generation`: everything but metadata,
/// and but the status when it has a subresource of its own.
fn spec_of(rt: &ResourceType, obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(o) = v.as_object_mut() {
        for field in ["metadata", "kind", "apiVersion"] {
            o.remove(field);
        }
        if rt.status_subresource {
            o.remove("status");
        }
    }
    v
}

/// The status-subresource split: a status write changes only `status`; a main-resource write
/// of a type with a status subresource cannot change `status`.
fn scope_write(rt: &ResourceType, existing: &Value, new: Value, subresource: &str) -> Value {
    let (mut out, status) = match subresource {
        "status" => (existing.clone(), new.get("status").cloned()),
        _ if rt.status_subresource => (new, existing.get("status").cloned()),
        _ => return new,
    };
    match status {
        Some(status) => out["status"] = status,
        None => {
            if let Some(o) = out.as_object_mut() {
                o.remove("status");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(state: &mut ClusterState, rt: &ResourceType, kind: PatchType, body: Value) -> Value {
        state.patch(rt, "default", "d", kind, body, "").unwrap().0
    }

    #[test]
    fn apply_creates_then_merges_and_only_spec_changes_bump_the_generation() {
        let cluster = Cluster::default();
        let mut state = cluster.lock();
        let ds = state.resource("apps", "v1", "daemonsets").unwrap();
        let applied = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"x": [1, 2]}});
        let created = patch(&mut state, &ds, PatchType::Apply, applied);
        assert_eq!(created["metadata"]["generation"], 1);
        let applied = json!({"metadata": {"labels": {"b": "2"}}, "spec": {"x": [3]}});
        let merged = patch(&mut state, &ds, PatchType::Apply, applied);
        assert_eq!(merged["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        assert_eq!(merged["spec"]["x"], json!([3]), "lists are replaced");
        assert_eq!(merged["metadata"]["generation"], 2);
        let status = json!({"status": {"numberReady": 1}});
        let (written, _) = state
            .patch(&ds, "default", "d", PatchType::Merge, status, "status")
            .unwrap();
        assert_eq!(written["status"]["numberReady"], 1);
        assert_eq!(written["metadata"]["generation"], 2);
    }

    #[test]
    fn a_deleted_object_with_a_finalizer_goes_when_the_finalizer_does() {
        let cluster = Cluster::default();
        let mut state = cluster.lock();
        let ds = state.resource("apps", "v1", "daemonsets").unwrap();
        let body = json!({"metadata": {"name": "d", "finalizers": ["f"]}});
        state.create(&ds, "default", body).unwrap();
        let deleting = state.delete(&ds, "default", "d", &Value::Null).unwrap();
        assert!(meta::is_deleting(&deleting));
        let no_finalizers = json!({"metadata": {"finalizers": null}});
        patch(&mut state, &ds, PatchType::Merge, no_finalizers);
        assert_eq!(state.get(&ds, "default", "d").unwrap_err().code, 404);
    }
}
