//! The cluster state and the verbs on it (get, list, create, update, patch, delete) with the
//! real server's semantics: optimistic concurrency, generation, managed fields, graceful
//! deletion and finalizers. Everything runs under one lock, so each request is atomic.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Notify;

use super::admission;
use super::apply;
use super::catalog::{Catalog, ResourceType, types_from_crd};
use super::events;
use super::managed_fields;
use super::meta;
use super::patch::{self, PatchType};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{self, ApiError, ObjectRef, StatusCause};
use super::store::Store;

/// Server behaviour knobs. Pods deleted gracefully are left to a kubelet (the testkit's
/// simulated nodes), which deletes them with grace period 0, as on a real cluster.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// How many change events watches can resume from before a `resourceVersion` is 410 Gone.
    pub watch_history: usize,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            watch_history: 10_000,
            bookmark_interval: Duration::from_secs(1),
        }
    }
}

/// Per-request write context.
#[derive(Debug, Clone, Default)]
pub struct WriteCtx {
    /// Field manager (the `fieldManager` parameter, or derived from the user agent).
    pub manager: String,
    /// `dryRun=All`: validate and answer, store nothing.
    pub dry_run: bool,
    /// `status` for the status subresource, "" for the main resource.
    pub subresource: String,
    /// The `fieldValidation` parameter.
    pub field_validation: admission::FieldValidation,
}

/// Options of a delete.
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    /// `gracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
    /// `propagationPolicy`: `Background`, `Foreground` or `Orphan`.
    pub propagation: Option<String>,
    /// `preconditions.uid`.
    pub precondition_uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub precondition_rv: Option<String>,
    /// `dryRun=All`.
    pub dry_run: bool,
}

impl DeleteOpts {
    /// Read a `DeleteOptions` body (missing fields stay unset).
    pub fn merge_body(&mut self, body: &Value) {
        if let Some(g) = body["gracePeriodSeconds"].as_i64() {
            self.grace_period_seconds = Some(g);
        }
        if let Some(p) = body["propagationPolicy"].as_str() {
            self.propagation = Some(p.to_string());
        }
        if body["orphanDependents"].as_bool() == Some(true) && self.propagation.is_none() {
            self.propagation = Some("Orphan".into());
        }
        if let Some(u) = body["preconditions"]["uid"].as_str() {
            self.precondition_uid = Some(u.to_string());
        }
        if let Some(r) = body["preconditions"]["resourceVersion"].as_str() {
            self.precondition_rv = Some(r.to_string());
        }
        if body["dryRun"].as_array().is_some_and(|a| !a.is_empty()) {
            self.dry_run = true;
        }
    }
}

/// List parameters.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// `labelSelector`.
    pub label_selector: Option<String>,
    /// `fieldSelector`.
    pub field_selector: Option<String>,
    /// `limit`.
    pub limit: Option<usize>,
    /// `continue`.
    pub continue_token: Option<String>,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch` (`Exact` or `NotOlderThan`).
    pub resource_version_match: Option<String>,
}

/// Everything the server knows.
#[derive(Debug)]
pub struct ClusterState {
    /// Served types.
    pub catalog: Catalog,
    /// Objects and history.
    pub store: Store,
    /// Behaviour knobs.
    pub options: ServerOptions,
    /// Warnings of the current request (sent as `Warning` headers), drained by the router.
    pub warnings: Vec<String>,
    /// The revision PodDisruptionBudget statuses were last computed at.
    pub budgets_synced_at: u64,
    /// The revision namespaces last got their default ServiceAccount and root CA at.
    pub namespaces_synced_at: u64,
}

/// The shared handle to the state and the wake-up signal of the background controllers.
#[derive(Debug, Clone)]
pub struct Cluster {
    state: Arc<Mutex<ClusterState>>,
    /// Poked after every write so garbage collection and friends run promptly.
    pub wake: Arc<Notify>,
}

impl Cluster {
    /// A cluster with the default namespaces.
    pub fn new(options: ServerOptions) -> Self {
        let mut state = ClusterState {
            catalog: Catalog::builtin(),
            store: Store::new(options.watch_history),
            options,
            warnings: Vec::new(),
            budgets_synced_at: 0,
            namespaces_synced_at: 0,
        };
        state.seed();
        Self {
            state: Arc::new(Mutex::new(state)),
            wake: Arc::new(Notify::new()),
        }
    }

    /// Lock the state (a poisoned lock is recovered: every write is all-or-nothing on JSON
    /// values, so the state stays consistent).
    pub fn lock(&self) -> MutexGuard<'_, ClusterState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn object_ref<'a>(rt: &'a ResourceType, qualified: &'a str, name: &'a str) -> ObjectRef<'a> {
    ObjectRef {
        qualified_resource: qualified,
        group: &rt.group,
        plural: &rt.plural,
        name,
    }
}

fn ns_key(rt: &ResourceType, namespace: &str) -> String {
    if rt.namespaced {
        namespace.to_string()
    } else {
        String::new()
    }
}

/// Resource types whose objects carry `metadata.generation`.
fn has_generation(rt: &ResourceType) -> bool {
    rt.is_custom()
        || matches!(
            rt.plural.as_str(),
            "pods"
                | "daemonsets"
                | "deployments"
                | "replicasets"
                | "poddisruptionbudgets"
                | "customresourcedefinitions"
        )
}

impl ClusterState {
    fn seed(&mut self) {
        let Some(rt) = self.catalog.find("", "v1", "namespaces").cloned() else {
            return;
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            let ctx = WriteCtx {
                manager: "kube-apiserver".into(),
                ..Default::default()
            };
            // Seeding a fresh store cannot conflict.
            let _ = self.create(&rt, "", body, &ctx);
        }
    }

    /// Find a served type.
    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<ResourceType> {
        self.catalog.find(group, version, plural).cloned()
    }

    fn present(rt: &ResourceType, obj: Value) -> Value {
        present(rt, obj)
    }

    /// The type whose shape objects of `rt` are stored in (core Events for events.k8s.io).
    fn storage_type(&self, rt: &ResourceType) -> ResourceType {
        if events::is_events_v1(rt)
            && let Some(core) = self.catalog.find("", "v1", "events")
        {
            return core.clone();
        }
        rt.clone()
    }

    /// One object as [`ClusterState::get`] returns it, shared with the store when it is stored
    /// as presented (the common case): a writer copies it once, to change it.
    fn get_shared(&self, rt: &ResourceType, namespace: &str, name: &str) -> Option<Arc<Value>> {
        let stored = self
            .store
            .get_shared(&rt.storage_key(), &ns_key(rt, namespace), name)?;
        Some(if is_presented(rt, stored) {
            stored.clone()
        } else {
            Arc::new(Self::present(rt, (**stored).clone()))
        })
    }

    /// GET one object.
    pub fn get(&self, rt: &ResourceType, namespace: &str, name: &str) -> Result<Value, ApiError> {
        self.get_shared(rt, namespace, name)
            .map(Arc::unwrap_or_clone)
            .ok_or_else(|| ApiError::not_found(object_ref(rt, &rt.qualified(), name)))
    }

    /// The objects of a type a list looks at, in key order (namespace None: all namespaces):
    /// only the node's pods when a field selector names `spec.nodeName`.
    fn candidates(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        fields: &FieldSelector,
    ) -> Vec<&Value> {
        let ns = namespace.filter(|_| rt.namespaced);
        let storage = rt.storage_key();
        fields
            .required("spec.nodeName")
            .filter(|node| !node.is_empty())
            .and_then(|node| self.store.list_on_node(&storage, node, ns))
            .unwrap_or_else(|| self.store.list(&storage, ns))
    }

    /// LIST with selectors and pagination.
    pub fn list(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        q: &ListQuery,
    ) -> Result<Value, ApiError> {
        let labels = LabelSelector::parse(q.label_selector.as_deref().unwrap_or_default())?;
        let fields = FieldSelector::parse(
            q.field_selector.as_deref().unwrap_or_default(),
            &rt.field_labels,
        )?;
        let (list_rv, start) = self.list_revision(q)?;
        let snapshot;
        let candidates: Vec<&Value> = if list_rv < self.store.revision() {
            let ns = namespace.filter(|_| rt.namespaced);
            snapshot = self
                .store
                .snapshot(&rt.storage_key(), ns, list_rv)
                .ok_or_else(|| {
                    ApiError::gone(if start.is_some() {
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."
                    } else {
                        "The resourceVersion for the provided list is too old."
                    })
                })?;
            snapshot.iter().collect()
        } else {
            self.candidates(rt, namespace, &fields)
        };
        // A page starts after the continue key and stops one past the limit, as an etcd range
        // read does: the candidates are in key order, so neither scans the whole type again.
        let from = match &start {
            Some(start) => {
                let (ns, name) = start.split_once('/').unwrap_or(("", start.as_str()));
                candidates.partition_point(|o| (meta::namespace(o), meta::name(o)) <= (ns, name))
            }
            None => 0,
        };
        let limit = q.limit.filter(|l| *l > 0);
        let mut items: Vec<&Value> = candidates[from..]
            .iter()
            .copied()
            .filter(|o| labels.matches(&o["metadata"]["labels"]) && fields.matches(o))
            .take(limit.map_or(usize::MAX, |l| l + 1))
            .collect();
        let mut list_meta = json!({"resourceVersion": list_rv.to_string()});
        if let Some(limit) = limit
            && items.len() > limit
        {
            items.truncate(limit);
            if let Some(last) = items.last() {
                list_meta["continue"] = json!(encode_continue(list_rv, &continue_key(last)));
                // The real server counts what is left only when no selector filters the list.
                let filtered = [&q.label_selector, &q.field_selector]
                    .iter()
                    .any(|sel| sel.as_deref().is_some_and(|s| !s.is_empty()));
                if !filtered {
                    list_meta["remainingItemCount"] = json!(candidates.len() - from - limit);
                }
            }
        }
        let items: Vec<Value> = items
            .into_iter()
            .map(|o| Self::present(rt, o.clone()))
            .collect();
        Ok(json!({
            "kind": format!("{}List", rt.kind),
            "apiVersion": rt.api_version(),
            "metadata": list_meta,
            "items": items,
        }))
    }

    /// The revision a list is served at, and where a continued list goes on from, checked as
    /// the real server checks them: a `continue` token's revision; `resourceVersionMatch=Exact`
    /// (or a non-zero `resourceVersion` with `limit`) that revision; otherwise the latest, and a
    /// `resourceVersion` newer than that is a 504 "Too large resource version".
    fn list_revision(&self, q: &ListQuery) -> Result<(u64, Option<String>), ApiError> {
        let current = self.store.revision();
        let rv = q.resource_version.as_deref().filter(|v| !v.is_empty());
        let version_match = q
            .resource_version_match
            .as_deref()
            .filter(|m| !m.is_empty());
        if let Some(token) = q.continue_token.as_deref().filter(|t| !t.is_empty()) {
            if version_match.is_some() {
                return Err(ApiError::bad_request(
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            let (at, start) = decode_continue(token)?;
            return Ok((at, Some(start)));
        }
        let Some(rv) = rv else {
            if version_match.is_some() {
                return Err(ApiError::bad_request(
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            return Ok((current, None));
        };
        let asked: u64 = rv.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {rv:?}: must be an integer"
            ))
        })?;
        let exact = match version_match {
            Some("Exact") if asked == 0 => {
                return Err(ApiError::bad_request(
                    "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
            Some("Exact") => true,
            Some("NotOlderThan") => false,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
                )));
            }
            None => asked != 0 && q.limit.is_some_and(|l| l > 0),
        };
        if asked > current {
            return Err(ApiError::too_large_resource_version(asked, current));
        }
        Ok((if exact { asked } else { current }, None))
    }

    /// POST a new object. Returns the stored object.
    pub fn create(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        mut body: Value,
        ctx: &WriteCtx,
    ) -> Result<Value, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        check_type(rt, &body)?;
        self.check_namespace(rt, namespace, &mut body)?;
        if meta::name(&body).is_empty() {
            let prefix = body["metadata"]["generateName"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if prefix.is_empty() {
                let q = rt.qualified();
                return Err(ApiError::invalid(
                    &rt.kind,
                    object_ref(rt, &q, ""),
                    vec![StatusCause {
                        reason: "FieldValueRequired".into(),
                        message: "Required value: name or generateName is required".into(),
                        field: Some("metadata.name".into()),
                    }],
                ));
            }
            let mut name = format!("{prefix}{}", meta::name_suffix());
            while self
                .store
                .get(&rt.storage_key(), &ns_key(rt, namespace), &name)
                .is_some()
            {
                name = format!("{prefix}{}", meta::name_suffix());
            }
            meta::set(&mut body, "name", json!(name));
        }
        let name = meta::name(&body).to_string();
        let q = rt.qualified();
        if !meta::is_dns_subdomain(&name) {
            return Err(ApiError::invalid(
                &rt.kind,
                object_ref(rt, &q, &name),
                vec![StatusCause {
                    reason: "FieldValueInvalid".into(),
                    message: format!(
                        "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                    ),
                    field: Some("metadata.name".into()),
                }],
            ));
        }
        if self
            .store
            .get(&rt.storage_key(), &ns_key(rt, namespace), &name)
            .is_some()
        {
            return Err(ApiError::already_exists(object_ref(rt, &q, &name)));
        }
        for field in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta::remove(&mut body, field);
        }
        meta::set(&mut body, "uid", json!(meta::new_uid()));
        meta::set(&mut body, "creationTimestamp", json!(meta::now()));
        if has_generation(rt) {
            meta::set(&mut body, "generation", json!(1));
        } else {
            meta::remove(&mut body, "generation");
        }
        admission::prepare_for_create(rt, &mut body);
        self.commit(rt, None, body, ctx)
    }

    fn check_namespace(
        &self,
        rt: &ResourceType,
        namespace: &str,
        body: &mut Value,
    ) -> Result<(), ApiError> {
        if !rt.namespaced {
            meta::remove(body, "namespace");
            return Ok(());
        }
        let in_body = meta::namespace(body).to_string();
        if !in_body.is_empty() && in_body != namespace {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        meta::set(body, "namespace", json!(namespace));
        match self.store.get("/namespaces", "", namespace) {
            None => Err(ApiError::not_found(ObjectRef {
                qualified_resource: "namespaces",
                group: "",
                plural: "namespaces",
                name: namespace,
            })),
            Some(ns) if meta::is_deleting(ns) => Err(ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                rt.qualified(),
                meta::name(body)
            ))),
            Some(_) => Ok(()),
        }
    }

    /// PUT (main resource or `status`). `body` is the full object the client sent.
    pub fn update(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        mut body: Value,
        ctx: &WriteCtx,
    ) -> Result<Value, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        check_type(rt, &body)?;
        let q = rt.qualified();
        let existing = self.get(rt, namespace, name)?;
        let body_name = meta::name(&body);
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let rv = meta::resource_version(&body).to_string();
        if rv.is_empty() {
            if rt.is_custom() {
                return Err(ApiError::invalid(
                    &rt.kind,
                    object_ref(rt, &q, name),
                    vec![StatusCause {
                        reason: "FieldValueInvalid".into(),
                        message: "Invalid value: 0x0: must be specified for an update".into(),
                        field: Some("metadata.resourceVersion".into()),
                    }],
                ));
            }
        } else if rv != meta::resource_version(&existing) {
            return Err(ApiError::stale(object_ref(rt, &q, name)));
        }
        meta::set(&mut body, "name", json!(name));
        let new = scope_write(rt, &existing, body, &ctx.subresource);
        self.commit(rt, Some(Arc::new(existing)), new, ctx)
    }

    /// PATCH (main resource or `status`); `apply` patches may create the object.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        patch_type: PatchType,
        body: &[u8],
        force: bool,
        ctx: &WriteCtx,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let q = rt.qualified();
        let existing = self.get_shared(rt, namespace, name);
        if patch_type == PatchType::Apply {
            let existing = existing.map(Arc::unwrap_or_clone);
            return self.apply_patch(rt, namespace, name, existing, body, force, ctx);
        }
        let Some(existing) = existing else {
            return Err(ApiError::not_found(object_ref(rt, &q, name)));
        };
        let patch: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
        let mut patched = (*existing).clone();
        match patch_type {
            PatchType::Merge => patch::merge_patch(&mut patched, &patch),
            PatchType::Json => patch::json_patch(&mut patched, patch)?,
            PatchType::Strategic => {
                if rt.is_custom() {
                    return Err(ApiError::unsupported_media_type(
                        "application/strategic-merge-patch+json",
                    ));
                }
                patch::strategic_merge(rt, &mut patched, &patch, &mut Vec::new());
            }
            PatchType::Apply => {}
        }
        let rv = meta::resource_version(&patched);
        if !rv.is_empty() && rv != meta::resource_version(&existing) {
            return Err(ApiError::stale(object_ref(rt, &q, name)));
        }
        if meta::name(&patched) != name {
            return Err(ApiError::bad_request(
                "metadata.name: the name of an object cannot be changed by a patch",
            ));
        }
        let new = scope_write(rt, &existing, patched, &ctx.subresource);
        Ok((self.commit_shared(rt, Some(existing), new, ctx)?, false))
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_patch(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        existing: Option<Value>,
        body: &[u8],
        force: bool,
        ctx: &WriteCtx,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let q = rt.qualified();
        if ctx.manager.is_empty() {
            return Err(ApiError::invalid(
                &rt.kind,
                object_ref(rt, &q, name),
                vec![StatusCause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value: is required for apply patch".into(),
                    field: Some("fieldManager".into()),
                }],
            ));
        }
        let text = std::str::from_utf8(body)
            .map_err(|_| ApiError::bad_request("apply patch is not UTF-8"))?;
        let applied: Value = serde_saphyr::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
        if !applied.is_object() {
            return Err(ApiError::bad_request("apply patch must be an object"));
        }
        check_type(rt, &applied)?;
        let applied_name = meta::name(&applied);
        if !applied_name.is_empty() && applied_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({applied_name}) does not match the name on the URL ({name})"
            )));
        }
        match existing {
            Some(existing) => {
                let rv = meta::resource_version(&applied);
                if !rv.is_empty() && rv != meta::resource_version(&existing) {
                    return Err(ApiError::stale(object_ref(rt, &q, name)));
                }
                let merged = apply::apply(
                    rt,
                    Some(&existing),
                    &applied,
                    &ctx.manager,
                    force,
                    &ctx.subresource,
                )?;
                let ctx = WriteCtx {
                    manager: String::new(),
                    ..ctx.clone()
                };
                Ok((
                    self.commit_shared(rt, Some(Arc::new(existing)), merged, &ctx)?,
                    false,
                ))
            }
            None if ctx.subresource.is_empty() => {
                let mut merged = apply::apply(rt, None, &applied, &ctx.manager, force, "")?;
                meta::set(&mut merged, "name", json!(name));
                let ctx = WriteCtx {
                    manager: String::new(),
                    ..ctx.clone()
                };
                Ok((Arc::new(self.create(rt, namespace, merged, &ctx)?), true))
            }
            None => Err(ApiError::not_found(object_ref(rt, &q, name))),
        }
    }

    /// Admit, stamp and store a write. `old` None means create. An empty `ctx.manager` means
    /// managed fields were already computed (server-side apply).
    pub fn commit(
        &mut self,
        rt: &ResourceType,
        old: Option<Arc<Value>>,
        new: Value,
        ctx: &WriteCtx,
    ) -> Result<Value, ApiError> {
        self.commit_shared(rt, old, new, ctx)
            .map(Arc::unwrap_or_clone)
    }

    /// [`ClusterState::commit`], returning the stored object itself (no copy of it).
    fn commit_shared(
        &mut self,
        rt: &ResourceType,
        old: Option<Arc<Value>>,
        mut new: Value,
        ctx: &WriteCtx,
    ) -> Result<Arc<Value>, ApiError> {
        if events::is_events_v1(rt) {
            let core = self.storage_type(rt);
            let old = old.map(|o| Arc::new(events::to_core(&o)));
            let stored = self.commit(&core, old, events::to_core(&new), ctx)?;
            return Ok(Arc::new(present(rt, stored)));
        }
        let q = rt.qualified();
        let name = meta::name(&new).to_string();
        new = Self::present(rt, new);
        if let Some(old) = &old {
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "namespace",
            ] {
                match old["metadata"].get(field) {
                    Some(v) => meta::set(&mut new, field, v.clone()),
                    None => meta::remove(&mut new, field),
                }
            }
            if meta::is_deleting(old) {
                let before = meta::finalizers(old);
                if let Some(added) = meta::finalizers(&new)
                    .into_iter()
                    .find(|f| !before.contains(f))
                {
                    return Err(ApiError::invalid(
                        &rt.kind,
                        object_ref(rt, &q, &name),
                        vec![StatusCause {
                            reason: "FieldValueForbidden".into(),
                            message: format!(
                                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{\"{added}\"}}"
                            ),
                            field: Some("metadata.finalizers".into()),
                        }],
                    ));
                }
            }
            let generation = old["metadata"]["generation"].as_i64();
            match generation {
                Some(g) => {
                    let bump = spec_of(rt, old) != spec_of(rt, &new);
                    meta::set(&mut new, "generation", json!(if bump { g + 1 } else { g }));
                }
                None => meta::remove(&mut new, "generation"),
            }
        }
        let warnings = admission::admit(rt, old.as_deref(), &mut new, ctx.field_validation)?;
        self.warnings.extend(warnings);
        if !ctx.manager.is_empty() {
            managed_fields::record_update(
                rt,
                old.as_deref(),
                &mut new,
                &ctx.manager,
                &ctx.subresource,
            );
        }
        if let Some(old) = &old {
            meta::set(
                &mut new,
                "resourceVersion",
                json!(meta::resource_version(old)),
            );
            if **old == new {
                return Ok(old.clone());
            }
        }
        if ctx.dry_run {
            return Ok(Arc::new(new));
        }
        let revision = self.store.next_revision();
        meta::set(&mut new, "resourceVersion", json!(revision.to_string()));
        let namespace = ns_key(rt, meta::namespace(&new));
        if rt.plural == "customresourcedefinitions" && rt.group == "apiextensions.k8s.io" {
            self.catalog.set_crd_types(&name, types_from_crd(&new));
        }
        let new = Arc::new(new);
        self.store
            .put_shared(&rt.storage_key(), &namespace, &name, new.clone(), revision);
        if meta::is_deleting(&new)
            && meta::finalizers(&new).is_empty()
            && !self.awaits_kubelet(rt, &new)
        {
            self.remove_now(rt, &new);
        }
        Ok(new)
    }

    /// Whether a terminating object is a pod still waiting for its kubelet (grace period > 0).
    fn awaits_kubelet(&self, rt: &ResourceType, obj: &Value) -> bool {
        rt.group.is_empty()
            && rt.plural == "pods"
            && obj["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0)
                > 0
    }

    /// Remove an object from storage now (its final DELETED event carries a new revision).
    pub fn remove_now(&mut self, rt: &ResourceType, obj: &Value) {
        let revision = self.store.next_revision();
        let mut last = obj.clone();
        meta::set(&mut last, "resourceVersion", json!(revision.to_string()));
        let namespace = ns_key(rt, meta::namespace(obj));
        let name = meta::name(obj).to_string();
        self.store
            .remove(&rt.storage_key(), &namespace, &name, last, revision);
        if rt.plural == "customresourcedefinitions" && rt.group == "apiextensions.k8s.io" {
            self.catalog.set_crd_types(&name, Vec::new());
        }
    }

    /// DELETE one object. Returns the response body: the object while it is still terminating,
    /// or a `Success` status once it is gone.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        if events::is_events_v1(rt) {
            let core = self.storage_type(rt);
            let out = self.delete(&core, namespace, name, opts)?;
            return Ok(if out["kind"] == "Status" {
                out
            } else {
                present(rt, out)
            });
        }
        let q = rt.qualified();
        let existing = self.get(rt, namespace, name)?;
        if let Some(uid) = &opts.precondition_uid
            && uid != meta::uid(&existing)
        {
            return Err(ApiError::conflict(
                object_ref(rt, &q, name),
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta::uid(&existing)
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && rv != meta::resource_version(&existing)
        {
            return Err(ApiError::conflict(
                object_ref(rt, &q, name),
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta::resource_version(&existing)
                ),
            ));
        }
        let grace = self.grace_period(rt, &existing, opts);
        let mut updated = existing.clone();
        let mut finalizers = meta::finalizers(&existing);
        match opts.propagation.as_deref() {
            Some("Foreground") if !finalizers.iter().any(|f| f == "foregroundDeletion") => {
                finalizers.push("foregroundDeletion".into());
            }
            Some("Orphan") if !finalizers.iter().any(|f| f == "orphan") => {
                finalizers.push("orphan".into())
            }
            _ => {}
        }
        if !finalizers.is_empty() {
            meta::set(&mut updated, "finalizers", json!(finalizers));
        }
        let is_pod = rt.group.is_empty() && rt.plural == "pods";
        let is_namespace = rt.group.is_empty() && rt.plural == "namespaces";
        if is_namespace && matches!(name, "default" | "kube-system" | "kube-public") {
            return Err(ApiError::forbidden(format!(
                "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
            )));
        }
        if is_namespace {
            updated["status"]["phase"] = json!("Terminating");
        }
        let keep = !finalizers.is_empty() || (is_pod && grace > 0) || is_namespace;
        if opts.dry_run {
            return Ok(if keep {
                updated
            } else {
                status::success(name, &rt.group, &rt.plural, meta::uid(&existing))
            });
        }
        if !keep {
            self.remove_now(rt, &existing);
            return Ok(if rt.is_custom() {
                existing
            } else {
                status::success(name, &rt.group, &rt.plural, meta::uid(&existing))
            });
        }
        let already = meta::is_deleting(&existing);
        let current_grace = existing["metadata"]["deletionGracePeriodSeconds"].as_i64();
        if !already || (is_pod && current_grace.is_some_and(|g| grace < g)) {
            meta::set(
                &mut updated,
                "deletionTimestamp",
                json!(meta::now_plus(grace)),
            );
            meta::set(&mut updated, "deletionGracePeriodSeconds", json!(grace));
        }
        let stored = self.store_direct(rt, &existing, updated);
        if is_pod && grace == 0 && meta::finalizers(&stored).is_empty() {
            self.remove_now(rt, &stored);
            return Ok(status::success(
                name,
                &rt.group,
                &rt.plural,
                meta::uid(&existing),
            ));
        }
        Ok(stored)
    }

    /// Store a server-made change (no admission, no managed-field change) if anything changed.
    pub fn store_direct(&mut self, rt: &ResourceType, old: &Value, mut new: Value) -> Value {
        if *old == new {
            return new;
        }
        let revision = self.store.next_revision();
        meta::set(&mut new, "resourceVersion", json!(revision.to_string()));
        let namespace = ns_key(rt, meta::namespace(&new));
        self.store.put(
            &rt.storage_key(),
            &namespace,
            meta::name(&new),
            new.clone(),
            revision,
        );
        new
    }

    fn grace_period(&self, rt: &ResourceType, obj: &Value, opts: &DeleteOpts) -> i64 {
        if !(rt.group.is_empty() && rt.plural == "pods") {
            return 0;
        }
        let phase = obj["status"]["phase"].as_str().unwrap_or_default();
        let unscheduled = obj["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .is_empty();
        if unscheduled || phase == "Succeeded" || phase == "Failed" {
            return 0;
        }
        let grace = opts
            .grace_period_seconds
            .or_else(|| obj["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30);
        // A negative grace period means "use the default", as on the real server; an explicit 0
        // via the API becomes 1 unless it is a forced (kubelet) deletion, which the real server
        // expresses as 0 too. We honour 0 as immediate.
        if grace < 0 { 30 } else { grace }
    }

    /// DELETE a collection (selectors apply). Returns the list of deleted objects.
    pub fn delete_collection(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        q: &ListQuery,
        opts: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        let list = self.list(
            rt,
            namespace,
            &ListQuery {
                limit: None,
                continue_token: None,
                ..q.clone()
            },
        )?;
        let mut items = Vec::new();
        for item in list["items"].as_array().cloned().unwrap_or_default() {
            let ns = meta::namespace(&item).to_string();
            let name = meta::name(&item).to_string();
            match self.delete(rt, &ns, &name, opts) {
                Ok(_) => items.push(item),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(json!({
            "kind": format!("{}List", rt.kind),
            "apiVersion": rt.api_version(),
            "metadata": {"resourceVersion": self.store.revision().to_string()},
            "items": items,
        }))
    }
}

/// A stored object as clients of `rt` see it: `apiVersion`/`kind` of the requested version, and
/// events.k8s.io Events converted from the stored core shape.
pub fn present(rt: &ResourceType, mut obj: Value) -> Value {
    if is_presented(rt, &obj) {
        return obj;
    }
    if events::is_events_v1(rt) {
        return events::to_events_v1(&obj);
    }
    obj["apiVersion"] = json!(rt.api_version());
    obj["kind"] = json!(rt.kind);
    obj
}

/// Whether `obj` is already as [`present`] would return it (so it can be sent without a copy).
pub fn is_presented(rt: &ResourceType, obj: &Value) -> bool {
    !events::is_events_v1(rt)
        && obj["apiVersion"].as_str() == Some(rt.api_version().as_str())
        && obj["kind"].as_str() == Some(rt.kind.as_str())
}

/// The part of an object whose change bumps `metadata.generation`.
fn spec_of(rt: &ResourceType, obj: &Value) -> Value {
    let mut v = meta::generation_relevant(obj);
    if !rt.status_subresource
        && let Some(status) = obj.get("status")
    {
        v["status"] = status.clone();
    }
    v
}

/// Apply the status-subresource split: a status write changes only `status`; a main-resource
/// write of a type with a status subresource cannot change `status`.
fn scope_write(rt: &ResourceType, existing: &Value, mut new: Value, subresource: &str) -> Value {
    if subresource == "status" {
        // The existing object with the new status; built from `new`, as the status is the
        // large part (thousands of entries) and the rest is small.
        let status = new.as_object_mut().and_then(|o| o.remove("status"));
        let mut out = match existing {
            Value::Object(fields) => Value::Object(
                fields
                    .iter()
                    .filter(|(k, _)| k.as_str() != "status")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
            other => other.clone(),
        };
        if let (Some(status), Some(o)) = (status, out.as_object_mut()) {
            o.insert("status".to_string(), status);
        }
        return out;
    }
    if rt.status_subresource {
        match existing.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
    new
}

fn check_type(rt: &ResourceType, body: &Value) -> Result<(), ApiError> {
    if let Some(kind) = body["kind"].as_str()
        && !kind.is_empty()
        && kind != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    if let Some(av) = body["apiVersion"].as_str() {
        let group = av.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        if !av.is_empty() && group != rt.group {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                rt.api_version()
            )));
        }
    }
    Ok(())
}

fn continue_key(obj: &Value) -> String {
    format!("{}/{}", meta::namespace(obj), meta::name(obj))
}

fn encode_continue(rv: u64, key: &str) -> String {
    hex::encode(json!({"rv": rv, "start": key}).to_string())
}

fn decode_continue(token: &str) -> Result<(u64, String), ApiError> {
    let bad = || {
        ApiError::bad_request("continue key is not valid: the continue token could not be decoded")
    };
    let bytes = hex::decode(token).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    Ok((
        v["rv"].as_u64().ok_or_else(bad)?,
        v["start"].as_str().ok_or_else(bad)?.to_string(),
    ))
}
