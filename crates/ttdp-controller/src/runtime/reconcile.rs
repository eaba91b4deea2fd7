//! The reconciler: finalizer dispatch to [`apply`] and [`cleanup`]; `apply` observes the
//! cluster, runs the pure planner, writes the status (one JSON patch: what changed, or the whole
//! status), then acts: the new state is recorded before the action, so a crash in between
//! repeats the action on the next reconcile instead of skipping it. Lifting a cordon, harmless
//! to repeat, runs while its Uncordoning is written. While the fleet keeps changing, one
//! reconcile follows it pass after pass for up to [`FOLLOW_FOR`], observing and planning again
//! only the nodes whose inputs changed ([`crate::runtime::refresh`], [`rollout::Planner`]) and building
//! only their status entries; status writes are spaced by the status's size
//! ([`WRITE_SPACING_PER_ENTRY`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};
use tracing::{info, instrument, warn};
use ttdp_api::names;
use ttdp_api::{NodeState, NodeStatus, TenstorrentDriverPolicy, TenstorrentDriverPolicyStatus};
use ttdp_drain::{DevicePredicate, DrainOptions, TwoPassDrain, UncordonOutcome};

use crate::error::{Error, error_chain};
use crate::pure::agent_blocker::{self, Blocker};
use crate::pure::cached::{CachedNode, CachedPod};
use crate::pure::daemonset::{daemonset_template_hash, desired_daemonset};
use crate::pure::observe::{self, ObserveInput};
use crate::pure::overlap::{OlderPolicies, selection_of};
use crate::pure::rollout::{self, RolloutPlan};
use crate::pure::status::{
    BuiltStatus, Entries, NodeReport, PolicyFacts, build_status, update_status,
};
use crate::pure::transition::{
    Action, AgentCondition, AgentPod, NodeObservation, NodeTransition, RolloutRules,
};
use crate::runtime::context::{Applied, Context, Written};
use crate::runtime::node_actions;
use crate::runtime::refresh;

/// Requeue while nodes are in flight (a safety net; watches drive progress).
const IN_FLIGHT_RESYNC: Duration = Duration::from_secs(30);
/// How long a reconcile waits for the node and agent-pod caches to fill.
const STORE_SYNC_WAIT: Duration = Duration::from_secs(30);
/// Requeue while a managed node has no agent pod (to read the DaemonSet's Events again).
const MISSING_AGENT_RESYNC: Duration = Duration::from_secs(5);
/// Requeue when nothing is happening.
const IDLE_RESYNC: Duration = Duration::from_secs(300);
/// How long one reconcile follows the fleet pass after pass (see [`apply`]) before it ends and
/// the next one observes everything again.
pub const FOLLOW_FOR: Duration = Duration::from_secs(5);
/// The least time between the starts of two status writes of a policy, per node entry listed
/// in `status.nodes`. At each write the API server stores the whole object (etcd keeps every
/// revision until it compacts) and sends it to every watcher; at many nodes the object is
/// mostly node entries, about 140 bytes each. Spacing the writes by the entries bounds what a
/// rollout writes to about 14 MB/s however fast the fleet changes: a write at most every 10 ms
/// with 1,000 entries (the most listed before [`crate::pure::status::COMPACT_THRESHOLD`] leaves the
/// Done and waiting nodes out), every 5 ms with 500.
pub const WRITE_SPACING_PER_ENTRY: Duration = Duration::from_micros(10);
/// How many nodes' actions the reconcile itself waits for (lifting cordons, whose outcome its
/// next pass needs) run at once; the others run in [`crate::runtime::node_tasks`].
const NODE_ACTIONS_AT_ONCE: usize = 16;

/// Reconciles one policy.
#[instrument(skip_all, fields(policy = %policy.name_any()))]
pub async fn reconcile(
    policy: Arc<TenstorrentDriverPolicy>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    let started = Instant::now();
    let name = policy.name_any();
    // Never decide from half-filled caches: after a restart a node missing from the store would
    // look unmatched and a missing agent pod like one being replaced.
    let mut synced_rx = ctx.synced.clone();
    let synced = tokio::time::timeout(STORE_SYNC_WAIT, async {
        synced_rx
            .wait_for(|v| *v == crate::runtime::run::SYNCED_ALL)
            .await
            .is_ok()
    })
    .await;
    if synced != Ok(true) {
        return Err(Error::NotSynced { policy: name });
    }
    let api: Api<TenstorrentDriverPolicy> = Api::all(ctx.client.clone());
    match ensure_finalizer(&api, &policy).await {
        // Added: the update wakes the next reconcile, which sees it.
        Ok(true) => return Ok(Requeue::await_change()),
        Ok(false) => {}
        Err(e) => {
            ctx.metrics
                .record_reconcile(started.elapsed(), Some(e.reason()));
            return Err(e);
        }
    }
    let result = finalizer(&api, names::FINALIZER, policy, |event| async {
        match event {
            FinalizerEvent::Apply(p) => apply(p, ctx.clone()).await,
            FinalizerEvent::Cleanup(p) => cleanup(p, ctx.clone()).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer {
        policy: name.clone(),
        source: Box::new(e),
    });
    ctx.metrics
        .record_reconcile(started.elapsed(), result.as_ref().err().map(Error::reason));
    if result.is_ok() {
        ctx.backoff.succeeded(&name);
    }
    result
}

/// Requeues a failed policy with per-object exponential back-off.
pub fn error_policy(
    policy: Arc<TenstorrentDriverPolicy>,
    err: &Error,
    ctx: Arc<Context>,
) -> Requeue {
    let delay = ctx.backoff.failed(&policy.name_any());
    warn!(policy = %policy.name_any(), reason = err.reason(), error = %error_chain(err), retry_in = ?delay, "reconcile failed");
    Requeue::requeue(delay)
}

/// Adds the finalizer to a live policy that lacks it, with a merge patch guarded by the
/// resourceVersion (so no other finalizer is lost). kube's finalizer helper would add it with a
/// JSON patch whose `test` of a missing list some API server implementations reject; once it is
/// present, the helper only dispatches.
/// Returns whether it patched.
async fn ensure_finalizer(
    api: &Api<TenstorrentDriverPolicy>,
    policy: &TenstorrentDriverPolicy,
) -> Result<bool, Error> {
    if policy.metadata.deletion_timestamp.is_some()
        || policy.finalizers().iter().any(|f| f == names::FINALIZER)
    {
        return Ok(false);
    }
    let mut finalizers = policy.finalizers().to_vec();
    finalizers.push(names::FINALIZER.to_owned());
    let patch = serde_json::json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": policy.resource_version(),
    }});
    let name = policy.name_any();
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        // A newer version exists: the reconcile it triggers tries again.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(true),
        Err(e) => Err(Error::kube(format!("add finalizer to policy {name}"), e)),
    }
}

/// The previous status and node entries: what this controller last wrote, else the API's copy
/// (read once: the cached policy carries no node entries, see [`crate::pure::cached::WatchedPolicy`]).
/// Shared, not copied: with thousands of nodes a copy costs megabytes.
async fn previous_of(
    policy: &TenstorrentDriverPolicy,
    ctx: &Context,
) -> Result<Arc<Written>, Error> {
    let uid = policy.uid().unwrap_or_default();
    if let Some(written) = ctx.written(&uid) {
        return Ok(written);
    }
    let name = policy.name_any();
    let api: Api<TenstorrentDriverPolicy> = Api::all(ctx.client.clone());
    let (mut status, resource_version) = match api.get_opt(&name).await {
        Ok(Some(p)) if p.uid() == policy.uid() => {
            (p.status.unwrap_or_default(), p.metadata.resource_version)
        }
        Ok(_) => (policy.status.clone().unwrap_or_default(), None),
        Err(e) => return Err(Error::kube(format!("get policy {name}"), e)),
    };
    let nodes = std::mem::take(&mut status.nodes)
        .into_iter()
        .map(|n| (Arc::from(n.name.as_str()), Arc::new(n)))
        .collect();
    Ok(Arc::new(Written {
        status,
        nodes,
        resource_version,
        written_at: None,
    }))
}

/// Whether two statuses are equal but for `nodes` (the cached policy's status has none).
fn same_but_nodes(a: &TenstorrentDriverPolicyStatus, b: &TenstorrentDriverPolicyStatus) -> bool {
    let TenstorrentDriverPolicyStatus {
        observed_generation,
        conditions,
        summary,
        nodes: _,
    } = a;
    *observed_generation == b.observed_generation
        && *conditions == b.conditions
        && *summary == b.summary
}

/// Writes the status unless it is unchanged (and the cached policy's copy agrees); returns the
/// policy's new `resourceVersion` when it wrote.
///
/// While the policy is still at the version of the last write, only what changed is sent: a JSON
/// patch replacing the changed node entries and top-level fields, guarded by a `test` of that
/// `resourceVersion` (see [`status_delta`]). Otherwise (after a start, someone else's write, a
/// node joining or leaving, most entries changed) the whole status is replaced with one
/// `add /status`: the controller is the status's only writer, and a replace costs the API
/// server a plain write, where a server-side apply of thousands of node entries makes it merge
/// every entry's managed fields. The reply is asked for as `PartialObjectMetadata` (the watch
/// delivers the object): with 5,000 nodes the whole object back would be 0.7 MB at every write.
async fn write_status(
    ctx: &Context,
    policy: &TenstorrentDriverPolicy,
    built: &BuiltStatus,
    last: &Written,
    unchanged: bool,
) -> Result<Option<String>, Error> {
    if unchanged
        && policy
            .status
            .as_ref()
            .is_some_and(|s| same_but_nodes(s, &built.status))
    {
        return Ok(None);
    }
    let name = policy.name_any();
    let failed = |e: kube::Error| Error::kube(format!("write status of policy {name}"), e);
    if let Some(ops) = status_delta(last, built) {
        let body = serde_json::to_vec(&ops).map_err(Error::Serialize)?;
        match patch_status(ctx, &name, body).await {
            Ok(version) => return Ok(version),
            // The policy moved on since (or the server refused the patch): replace it whole.
            Err(kube::Error::Api(e)) => {
                tracing::debug!(policy = %name, code = e.code, "status delta not applied; writing the whole status");
            }
            Err(e) => return Err(failed(e)),
        }
    }
    #[derive(serde::Serialize)]
    struct ReplaceStatus {
        op: &'static str,
        path: &'static str,
        value: TenstorrentDriverPolicyStatus,
    }
    let body = serde_json::to_vec(&[ReplaceStatus {
        op: "add",
        path: "/status",
        value: built.whole(),
    }])
    .map_err(Error::Serialize)?;
    patch_status(ctx, &name, body).await.map_err(failed)
}

/// Sends a JSON patch to the policy's status; returns the new `resourceVersion`.
async fn patch_status(
    ctx: &Context,
    name: &str,
    body: Vec<u8>,
) -> Result<Option<String>, kube::Error> {
    let url = format!(
        "{}/{name}/status",
        TenstorrentDriverPolicy::url_path(&(), None)
    );
    let request = http::Request::patch(url)
        .header(http::header::CONTENT_TYPE, "application/json-patch+json")
        .header(
            http::header::ACCEPT,
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        )
        .body(body)
        .map_err(|e| kube::Error::BuildRequest(kube::core::request::Error::BuildRequest(e)))?;
    let reply = ctx.client.request_text(request).await?;
    let meta: kube::core::PartialObjectMeta<TenstorrentDriverPolicy> =
        serde_json::from_str(&reply).map_err(kube::Error::SerdeError)?;
    Ok(meta.metadata.resource_version)
}

/// The JSON patch from the status last written to `built`: a `test` that the policy is still
/// at the `resourceVersion` of that write, then the changed top-level fields and node entries
/// (by index). None when that is unknown or not worth it: no `resourceVersion`, a field
/// removed, entries left out (compaction) before or now, a node joined or left, or more than
/// half of the entries changed (a version bump).
fn status_delta(last: &Written, built: &BuiltStatus) -> Option<Vec<serde_json::Value>> {
    use serde_json::json;
    let version = last.resource_version.as_ref()?;
    let (before, status) = (&last.status, &built.status);
    let lists_all = |s: &TenstorrentDriverPolicyStatus| {
        s.summary.as_ref().is_some_and(|s| s.nodes_omitted == 0)
    };
    if !lists_all(before)
        || !lists_all(status)
        || !built.same_nodes
        || status.observed_generation.is_none()
        || status.conditions.is_empty()
        || built.changed.len() > built.all_nodes.len() / 2
    {
        return None;
    }
    let mut ops =
        vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": version})];
    if status.observed_generation != before.observed_generation {
        ops.push(json!({"op": "add", "path": "/status/observedGeneration", "value": status.observed_generation}));
    }
    if status.conditions != before.conditions {
        ops.push(json!({"op": "add", "path": "/status/conditions", "value": status.conditions}));
    }
    if status.summary != before.summary {
        ops.push(json!({"op": "add", "path": "/status/summary", "value": status.summary}));
    }
    // Both in name order: one walk finds each changed entry's index.
    let mut changed = built.changed.iter().peekable();
    for (i, (name, entry)) in built.all_nodes.iter().enumerate() {
        if changed.peek().is_none() {
            break;
        }
        if changed.next_if(|c| *c == name).is_some() {
            ops.push(
                json!({"op": "replace", "path": format!("/status/nodes/{i}"), "value": **entry}),
            );
        }
    }
    Some(ops)
}

/// Writes `built` unless it is what was last written (and the API's copy agrees), and
/// remembers it, the node entries once (in `nodes`, not again in `status`).
async fn record(
    ctx: &Context,
    policy: &TenstorrentDriverPolicy,
    built: BuiltStatus,
    last: &Written,
) -> Result<Arc<Written>, Error> {
    let unchanged =
        built.changed.is_empty() && built.same_nodes && same_but_nodes(&built.status, &last.status);
    // Writes are spaced by the status's size (see WRITE_SPACING_PER_ENTRY).
    if let Some(due) = next_write(last).filter(|_| !unchanged) {
        tokio::time::sleep_until(due.into()).await;
    }
    let started = Instant::now();
    let version = write_status(ctx, policy, &built, last, unchanged).await?;
    let written_at = if version.is_some() {
        Some(started)
    } else {
        last.written_at
    };
    let written = Arc::new(Written {
        status: built.status,
        nodes: built.all_nodes,
        resource_version: version.or_else(|| last.resource_version.clone()),
        written_at,
    });
    ctx.remember(&policy.uid().unwrap_or_default(), written.clone());
    Ok(written)
}

/// sha256 (hex) of an object's JSON.
fn digest_of(value: &impl serde::Serialize) -> Result<String, Error> {
    let json = serde_json::to_vec(value).map_err(Error::Serialize)?;
    Ok(hex::encode(Sha256::digest(&json)))
}

/// Whether the cached DaemonSet is still what the controller applied (same object, same
/// generation, our labels and owner) and the desired one is unchanged: then applying again would
/// change nothing.
fn up_to_date(existing: &DaemonSet, desired: &DaemonSet, applied: &Applied, digest: &str) -> bool {
    let has_labels = desired
        .labels()
        .iter()
        .all(|(k, v)| existing.labels().get(k) == Some(v));
    let owned = desired
        .owner_references()
        .iter()
        .all(|o| existing.owner_references().iter().any(|e| e.uid == o.uid));
    applied.digest == digest
        && applied.uid == existing.metadata.uid
        && applied.generation == existing.metadata.generation
        && has_labels
        && owned
}

/// Applies the DaemonSet (unless paused and it exists, or it is already as desired) and returns
/// its template hash. Reads the DaemonSet from the cache, so an unchanged policy costs no request.
async fn ensure_daemonset(
    ctx: &Context,
    policy: &TenstorrentDriverPolicy,
    selection: &ttdp_api::node_selection::NodeSelection,
) -> Result<String, Error> {
    let desired = desired_daemonset(policy, &ctx.settings, selection)?;
    let ds_name = names::daemonset_name(&policy.name_any());
    let ns = &ctx.settings.namespace;
    let existing = ctx
        .daemonsets
        .get(&ObjectRef::<DaemonSet>::new(&ds_name).within(ns));
    if policy.spec.paused
        && let Some(hash) = existing.as_deref().and_then(daemonset_template_hash)
    {
        return Ok(hash.to_owned());
    }
    let hash = daemonset_template_hash(&desired)
        .unwrap_or_default()
        .to_owned();
    let digest = digest_of(&desired)?;
    if let (Some(existing), Some(applied)) = (existing.as_deref(), ctx.applied(&ds_name))
        && up_to_date(existing, &desired, &applied, &digest)
    {
        return Ok(hash);
    }
    let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), ns);
    let result = api
        .patch(
            &ds_name,
            &PatchParams::apply(names::CONTROLLER_MANAGER).force(),
            &Patch::Apply(&desired),
        )
        .await
        .map_err(|source| Error::ApplyDaemonSet {
            daemonset: format!("{ns}/{ds_name}"),
            source,
        })?;
    ctx.remember_applied(
        &ds_name,
        Some(Applied {
            digest,
            uid: result.metadata.uid,
            generation: result.metadata.generation,
        }),
    );
    Ok(hash)
}

/// Why the policy's DaemonSet cannot create agent pods, when a node it manages has none and
/// the DaemonSet controller's `FailedCreate` Events say (see [`agent_blocker::failed_create`]).
/// Without permission to list Events the nodes just wait, as without an Event.
async fn daemonset_blocker(
    ctx: &Context,
    policy: &str,
    matched: &[Arc<CachedNode>],
    by_node: &[Vec<Arc<CachedPod>>],
    conflicts: &BTreeMap<String, String>,
) -> Option<Blocker> {
    let missing = matched
        .iter()
        .zip(by_node)
        .any(|(n, pods)| pods.is_empty() && !conflicts.contains_key(n.name()));
    if !missing {
        return None;
    }
    let ns = &ctx.settings.namespace;
    let ds_name = names::daemonset_name(policy);
    let uid = ctx
        .daemonsets
        .get(&ObjectRef::<DaemonSet>::new(&ds_name).within(ns))
        .and_then(|d| d.metadata.uid.clone());
    let fields = format!(
        "involvedObject.kind=DaemonSet,involvedObject.name={ds_name},reason={}",
        agent_blocker::FAILED_CREATE
    );
    let events = match Api::<Event>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default().fields(&fields))
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(policy, error = %e, "cannot list the DaemonSet's events");
            return None;
        }
    };
    let newest_pod = ctx
        .agent_pods
        .state()
        .iter()
        .filter(|p| {
            p.labels()
                .get(ttdp_api::names::labels::POLICY)
                .map(String::as_str)
                == Some(policy)
        })
        .filter_map(|p| p.metadata.creation_timestamp.clone())
        .max_by_key(|t| t.0);
    agent_blocker::failed_create(
        &events,
        &format!("{ns}/{ds_name}"),
        uid.as_deref(),
        newest_pod.as_ref(),
        &Time(Timestamp::now()),
    )
}

/// Whether a node holds something of ours: our cordon or upgrade grant, or gates we closed
/// while it was ours.
fn holds_ours(
    meta: &kube::core::ObjectMeta,
    policy: &str,
    ours_before: impl FnOnce() -> bool,
) -> bool {
    observe::cordoned_by(meta, policy)
        || observe::granted_by(meta, policy)
        || (observe::gates_closed(meta) && ours_before())
}

/// Observe, plan, record, act; then, while something changed, again with only the changed nodes
/// observed anew: nodes released in a pass (their upgrade finished) are recorded Done and their
/// slots handed to the next nodes in the next pass, and an agent's Ready, a finished cordon or
/// drain is acted on in the pass after it arrives, instead of in a new reconcile that observes
/// the whole fleet. It stops when a pass finds nothing changed, after [`FOLLOW_FOR`], when a
/// retry gate opens, when an action fails, or when a policy, the selection or the set of nodes
/// changed ([`refresh::Restart`]); the next reconcile observes everything again.
///
/// A failure reaches the user: the policy's `Reconciled` condition turns False with the API
/// server's message (and stays so until a reconcile succeeds) and a Warning Event is recorded
/// when the failure is new.
pub async fn apply(
    policy: Arc<TenstorrentDriverPolicy>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    let result = apply_policy(policy.clone(), ctx.clone()).await;
    match &result {
        Ok(_) => clear_failure(&policy, &ctx).await,
        Err(err) if reaches_the_user(err) => report_failure(&policy, &ctx, err).await,
        Err(_) => {}
    }
    result
}

/// Whether a reconcile error is the user's business (not a controller still starting).
fn reaches_the_user(err: &Error) -> bool {
    !matches!(err, Error::NotSynced { .. } | Error::InvalidSpec { .. })
}

/// The facts of a policy whose nodes are left as recorded (the spec is invalid, or the
/// reconcile failed before planning them).
fn facts_as_recorded(
    policy: &TenstorrentDriverPolicy,
    recorded: &Entries,
    invalid_spec: Option<String>,
    failure: Option<crate::pure::status::ReconcileFailure>,
) -> PolicyFacts {
    let managed = recorded
        .values()
        .filter(|e| e.state != NodeState::Conflict)
        .count();
    PolicyFacts {
        generation: policy.metadata.generation,
        target_version: policy.spec.version.clone(),
        paused: policy.spec.paused,
        max_unavailable: policy.spec.max_unavailable(managed).unwrap_or(1),
        invalid_spec,
        failure,
    }
}

/// Writes the status with every node entry as recorded and the conditions of `facts`.
async fn record_as_recorded(
    ctx: &Context,
    policy: &TenstorrentDriverPolicy,
    last: &Written,
    facts: &PolicyFacts,
    now: &Time,
) -> Result<Arc<Written>, Error> {
    let reports = last
        .nodes
        .values()
        .map(|e| NodeReport {
            name: e.name.clone(),
            transition: NodeTransition {
                state: e.state,
                reason: e.reason.clone(),
                message: e.message.clone(),
                actions: vec![],
            },
            current_version: e.current_version.clone(),
            install_mode: e.install_mode.clone(),
        })
        .collect();
    let built = build_status(facts, &last.status, &last.nodes, reports, now);
    record(ctx, policy, built, last).await
}

/// Shows a failed reconcile on the policy: `Reconciled` False with the API server's message,
/// and a Warning Event when the failure differs from the last one reported.
async fn report_failure(policy: &TenstorrentDriverPolicy, ctx: &Context, err: &Error) {
    let uid = policy.uid().unwrap_or_default();
    let failure = crate::pure::status::ReconcileFailure::of(err);
    let before = ctx.remember_failure(&uid, Some(failure.clone()));
    if before.as_ref() != Some(&failure) {
        ctx.events
            .policy_event(policy, true, &failure.reason, failure.message.clone());
    }
    record_failure(policy, ctx, Some(failure)).await;
}

/// After a failed reconcile, a successful one turns `Reconciled` True again.
async fn clear_failure(policy: &TenstorrentDriverPolicy, ctx: &Context) {
    let uid = policy.uid().unwrap_or_default();
    if ctx.remember_failure(&uid, None).is_none() {
        return;
    }
    info!(policy = %policy.name_any(), "reconciled again after a failure");
    record_failure(policy, ctx, None).await;
}

/// Writes the status with every node entry as recorded and `Reconciled` set from `failure`
/// (False with it, True without).
async fn record_failure(
    policy: &TenstorrentDriverPolicy,
    ctx: &Context,
    failure: Option<crate::pure::status::ReconcileFailure>,
) {
    let now = Time(Timestamp::now());
    let written = match previous_of(policy, ctx).await {
        Ok(last) => {
            let facts = facts_as_recorded(policy, &last.nodes, None, failure);
            record_as_recorded(ctx, policy, &last, &facts, &now).await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = written {
        warn!(policy = %policy.name_any(), error = %error_chain(&e), "cannot write the Reconciled condition");
    }
}

/// [`apply`] without the failure report.
async fn apply_policy(
    policy: Arc<TenstorrentDriverPolicy>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    let name = policy.name_any();
    // A background action failed: fail this reconcile with it, so the policy backs off before
    // the action is tried again.
    if let Some(e) = ctx.node_tasks.take_failures(&name).into_iter().next() {
        return Err(e);
    }
    let mut now = Time(Timestamp::now());
    let settings = &ctx.settings;
    let mut last = previous_of(&policy, &ctx).await?;
    if let Err(err) = policy.spec.validate() {
        return invalid_spec(&policy, &ctx, &last, err, &now).await;
    }
    let Some(mut selection) = selection_of(&policy, settings.require_nfd) else {
        return Ok(Requeue::await_change());
    };
    let all_policies = ctx.policies.state();
    let older = OlderPolicies::of(&policy, &all_policies, settings.require_nfd);
    // Subscribed before the caches are read: no change after the read goes unrecorded.
    let watched = ctx.changes.subscribe();
    let policies_before = refresh::policy_keys(&all_policies);
    let node_metas = ctx.nodes.state();
    // In name order: the planner hands out slots in that order, and the status lists nodes so.
    let (mut matched, unmatched): (Vec<Arc<CachedNode>>, Vec<Arc<CachedNode>>) = node_metas
        .into_iter()
        .partition(|n| selection.matches(n.name(), n.labels()));
    matched.sort_unstable_by(|a, b| a.name().cmp(b.name()));
    let conflicts: BTreeMap<String, String> = matched
        .iter()
        .filter_map(|n| {
            let owner = older.owner(n.name(), n.labels())?;
            Some((n.name().to_owned(), owner.to_owned()))
        })
        .collect();
    selection.excluded = conflicts.keys().cloned().collect();
    let hash = ensure_daemonset(&ctx, &policy, &selection).await?;
    let mut by_node = refresh::agent_pods_by_node(ctx.agent_pods.state(), &name, &matched);
    let not_created = daemonset_blocker(&ctx, &name, &matched, &by_node, &conflicts).await;
    let seen = refresh::Seen {
        policy: &name,
        selection: &selection,
        older: &older,
        conflicts: &conflicts,
        policies: &policies_before,
    };

    let mut next_retry: Option<Duration> = None;
    let plan_drain_timeout = drain_timeout(&policy);
    let mut drains = ctx.drains.progress_of(&name);
    // A node's observation, and how long until its retry gate opens or its wait on the
    // device's holders reaches the drain timeout.
    let observe_node = |n: &CachedNode,
                        pods: &[Arc<CachedPod>],
                        entry: Option<&NodeStatus>,
                        drain: Option<crate::pure::transition::DrainProgress>,
                        now: &Time| {
        let node = n.name();
        let pod = observe::pick_agent_pod(pods.iter().map(|p| p.as_ref()));
        let (retry, wait) = observe::retry_gate(
            &n.metadata,
            entry,
            now,
            settings.retry_base,
            settings.retry_max,
        );
        // Who else cordoned the nodes in flight, or the Done nodes left cordoned for someone
        // else: only those look at `spec.unschedulable` (from the node cache).
        let in_flight = entry.is_some_and(|r| {
            r.state.is_in_flight()
                || r.reason.as_deref() == Some(crate::pure::transition::reasons::CORDONED_BY_OTHER)
        });
        let unschedulable =
            (in_flight || observe::cordoned_by(&n.metadata, &name)).then_some(n.unschedulable);
        let obs = observe::observe(ObserveInput {
            policy: &name,
            target_version: &policy.spec.version,
            meta: &n.metadata,
            unschedulable,
            pod,
            current_hash: &hash,
            recorded: entry,
            conflict_with: conflicts.get(node).cloned(),
            drain: drain.unwrap_or(crate::pure::transition::DrainProgress::NotStarted),
            retry,
            node_not_ready: n.not_ready.as_deref(),
            not_created: not_created.as_ref(),
            now,
        });
        let deadline = holders_deadline(entry, now, plan_drain_timeout);
        (obs, wait.into_iter().chain(deadline).min())
    };
    let soonest = |a: Option<Duration>, b: Option<Duration>| a.into_iter().chain(b).min();
    let mut observations: Vec<(String, NodeObservation)> = matched
        .iter()
        .zip(&by_node)
        .map(|(n, pods)| {
            let node = n.name();
            let (obs, wait) = observe_node(
                n,
                pods,
                last.nodes.get(node).map(Arc::as_ref),
                drains.remove(node),
                &now,
            );
            next_retry = soonest(next_retry, wait);
            (node.to_owned(), obs)
        })
        .collect();

    let spec = &policy.spec;
    let managed = matched.len().saturating_sub(conflicts.len());
    let max_unavailable = spec
        .max_unavailable(managed)
        .map_err(|source| Error::InvalidSpec {
            policy: name.clone(),
            source,
        })?;
    let plan = RolloutPlan {
        rules: RolloutRules {
            target_version: spec.version.clone(),
            drain_enabled: spec.upgrade_policy.drain.enable,
            gates_configured: !settings.deploy_gates.is_empty(),
            drain_timeout: plan_drain_timeout,
        },
        max_unavailable,
        paused: spec.paused,
    };
    let facts = PolicyFacts {
        generation: policy.metadata.generation,
        target_version: spec.version.clone(),
        paused: spec.paused,
        invalid_spec: None,
        max_unavailable,
        failure: ctx.failure(&policy.uid().unwrap_or_default()),
    };

    let mut first_error = None;
    // Actions already taken per node in its current state (a later pass does not repeat them).
    let mut performed: HashMap<String, Vec<Action>> = HashMap::new();
    // Nodes whose cordon this reconcile lifted, with the node as the cache showed it then: until
    // the cache shows the change, the observation says what the lifting did.
    let mut lifted: HashMap<String, (Arc<CachedNode>, UncordonOutcome)> = HashMap::new();
    let following = Instant::now();
    let mut planner = rollout::Planner::new(plan);
    // Each node's state and actions, in the order of `observations`, as last planned.
    let mut steps: Vec<(NodeState, Vec<Action>)> =
        vec![(NodeState::Pending, Vec::new()); matched.len()];
    // The nodes observed again since the last pass (the first pass plans every node).
    let mut dirty: Vec<usize> = Vec::new();
    let mut first_pass = true;
    let written = loop {
        // The transitions that may have changed; the rest of each goes into the status.
        let reports = planner
            .plan(&mut observations, &dirty)
            .into_iter()
            .map(|(i, mut t)| {
                steps[i] = (t.state, std::mem::take(&mut t.actions));
                let (node, obs) = &observations[i];
                NodeReport {
                    current_version: obs.loaded_version.clone(),
                    install_mode: observe::install_mode_label(&matched[i].metadata),
                    name: node.clone(),
                    transition: t,
                }
            })
            .collect();
        let mut built = if std::mem::take(&mut first_pass) {
            build_status(&facts, &last.status, &last.nodes, reports, &now)
        } else {
            update_status(&facts, &last.status, &last.nodes, reports, &now)
        };
        let changed_entries: Vec<usize> = built
            .changed
            .iter()
            .filter_map(|name| refresh::position(&matched, name))
            .collect();
        let changes = std::mem::take(&mut built.changes);
        for change in &changes {
            performed.remove(&change.node);
        }
        // Lifting a cordon does not wait for its Uncordoning to be recorded: it runs while the
        // status is written (it is harmless to repeat, and after a crash in between the node,
        // seen uncordoned with its agent Ready, goes the same way to Done).
        let mut lifting = Vec::new();
        for ((node, _), (_, actions)) in observations.iter().zip(&steps) {
            if actions.as_slice() != [Action::Release] || ctx.node_tasks.busy(&name, node) {
                continue;
            }
            let done = performed.entry(node.clone()).or_default();
            if !done.contains(&Action::Release) {
                done.push(Action::Release);
                lifting.push((node, vec![Action::Release], None, None, None));
            }
        }
        let (written, mut outcomes) = futures::join!(
            record(&ctx, &policy, built, &last),
            act_on_nodes(&ctx, &policy, lifting, &now)
        );
        let written = written?;

        // Act, each node's actions in order; one node's failure does not stop the others.
        // Cordons, agent replacements and retry clearing go to the background; the rest
        // (starting a drain) here, up to NODE_ACTIONS_AT_ONCE nodes at a time.
        let mut pending = Vec::new();
        for (((node, obs), (_, actions)), pods) in observations.iter().zip(&steps).zip(&by_node) {
            if actions.is_empty() {
                continue;
            }
            let done = performed.entry(node.clone()).or_default();
            let todo: Vec<Action> = actions
                .iter()
                .filter(|a| !done.contains(a))
                .copied()
                .collect();
            // A node whose background task still runs waits for it (which then wakes us).
            if todo.is_empty() || ctx.node_tasks.busy(&name, node) {
                continue;
            }
            done.extend(&todo);
            let pod = observe::pick_agent_pod(pods.iter().map(|p| p.as_ref()));
            let entered = written
                .nodes
                .get(node.as_str())
                .and_then(|e| e.last_transition_time.as_ref());
            let obs = Some(obs);
            if todo.iter().all(in_background) {
                let (task_ctx, task_policy, task_node) =
                    (ctx.clone(), policy.clone(), node.clone());
                let (obs, pod, entered, now) =
                    (obs.cloned(), pod.cloned(), entered.cloned(), now.clone());
                let work = move || async move {
                    let (node, results) = act_in_order(
                        &task_ctx,
                        &task_policy,
                        &task_node,
                        todo,
                        obs.as_ref(),
                        pod.as_ref(),
                        entered.as_ref(),
                        &now,
                    )
                    .await;
                    let mut first_error = None;
                    for (action, result) in results {
                        if let Err(e) = result {
                            keep_failure(node, action, e, &mut first_error);
                        }
                    }
                    first_error.map_or(Ok(()), Err)
                };
                ctx.node_tasks.spawn(&name, node, work, waker(&ctx, &name));
                continue;
            }
            pending.push((node, todo, obs, pod, entered));
        }
        outcomes.extend(act_on_nodes(&ctx, &policy, pending, &now).await);
        let mut released = 0;
        for (node, results) in outcomes {
            for (action, result) in results {
                match result {
                    Ok(Some(outcome)) => {
                        released += 1;
                        if let Some(i) = refresh::position(&matched, node) {
                            lifted.insert(node.clone(), (matched[i].clone(), outcome));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => keep_failure(node, action, e, &mut first_error),
                }
            }
        }
        report_changes(&ctx, &policy, &changes);
        let retry_due = next_retry.is_some_and(|w| following.elapsed() >= w);
        if first_error.is_some() || retry_due || following.elapsed() >= FOLLOW_FOR {
            break written;
        }
        // The next pass may write: wait for its turn, gathering what changes meanwhile.
        if let Some(due) = next_write(&written) {
            tokio::time::sleep_until(due.into()).await;
        }
        // Follow the fleet: observe again the nodes whose node, agent pods, drain or entry
        // changed since, with the cordons just lifted known.
        let mut changed =
            match refresh::changed_nodes(&ctx, &seen, &watched, &mut matched, &mut by_node) {
                Ok(changed) => changed,
                Err(restart) => {
                    tracing::debug!(
                        ?restart,
                        "the fleet changed; the next reconcile observes it whole"
                    );
                    break written;
                }
            };
        let mut drains = ctx.drains.progress_of(&name);
        for (i, (node, obs)) in observations.iter().enumerate() {
            let drain = drains.get(node);
            if drain.unwrap_or(&crate::pure::transition::DrainProgress::NotStarted) != &obs.drain {
                changed.push(i);
            }
        }
        changed.extend(changed_entries);
        if changed.is_empty() && released == 0 {
            break written;
        }
        changed.sort_unstable();
        changed.dedup();
        now = Time(Timestamp::now());
        for &i in &changed {
            let n = &matched[i];
            let node = n.name();
            let (obs, wait) = observe_node(
                n,
                &by_node[i],
                written.nodes.get(node).map(Arc::as_ref),
                drains.remove(node),
                &now,
            );
            observations[i].1 = obs;
            next_retry = soonest(next_retry, wait);
        }
        dirty = changed;
        lifted.retain(|node, (before, outcome)| {
            let Some(i) = refresh::position(&matched, node) else {
                return false;
            };
            if !Arc::ptr_eq(before, &matched[i]) {
                return false;
            }
            dirty.push(i);
            let obs = &mut observations[i].1;
            obs.cordoned_by_us = false;
            obs.gates_closed_by_us = false;
            obs.grant = crate::pure::transition::UpgradeGrant::Absent;
            obs.externally_cordoned = matches!(outcome, UncordonOutcome::External { .. });
            true
        });
        last = written;
    };
    set_node_counts(&ctx, &name, &written.nodes);
    // Kept through Upgrading: the pods a drain skipped name the device's holders there.
    let keep_drain: HashSet<&str> = observations
        .iter()
        .zip(&steps)
        .filter(|(_, (state, _))| matches!(state, NodeState::Draining | NodeState::Upgrading))
        .map(|((n, _), _)| n.as_str())
        .collect();
    ctx.drains.retain(&name, |n| keep_drain.contains(n));

    // Nodes no longer matched (skip label, selector change) keep nothing of ours.
    for n in &unmatched {
        let node = n.name();
        if holds_ours(&n.metadata, &name, || written.nodes.contains_key(node)) {
            info!(node = %node, "node left the policy's selection; releasing it");
            if let Err(e) = node_actions::release(&ctx.client, &name, node, None).await {
                first_error.get_or_insert(e);
            }
        }
    }

    if let Some(e) = first_error {
        return Err(e);
    }
    let in_flight = steps.iter().any(|(state, _)| state.is_in_flight());
    let mut requeue = if in_flight {
        IN_FLIGHT_RESYNC
    } else {
        IDLE_RESYNC
    };
    if let Some(w) = next_retry {
        requeue = requeue.min(w + Duration::from_millis(50));
    }
    // No watch says why an agent pod does not appear (the DaemonSet controller's Events are not
    // watched): look again soon.
    let waiting_for_pods = observations.iter().any(|(_, o)| {
        o.conflict_with.is_none() && matches!(o.agent, AgentPod::Missing | AgentPod::NotCreated(_))
    });
    if waiting_for_pods {
        requeue = requeue.min(MISSING_AGENT_RESYNC);
    }
    Ok(Requeue::requeue(requeue))
}

/// `upgradePolicy.drain.timeoutSeconds` when the drain is enabled.
fn drain_timeout(policy: &TenstorrentDriverPolicy) -> Option<Duration> {
    let drain = &policy.spec.upgrade_policy.drain;
    drain.enable.then(|| drain_timeout_seconds(drain))
}

/// `timeoutSeconds` of `drain` as a duration (a negative value counts as one second).
fn drain_timeout_seconds(drain: &ttdp_api::driver::v1alpha1::DrainPolicy) -> Duration {
    Duration::from_secs(u64::try_from(drain.timeout_seconds).unwrap_or(1))
}

/// How long until a node waiting in Upgrading on the device's holders reaches its deadline
/// (`timeout` after it entered Upgrading), so the reconcile looks again then.
fn holders_deadline(
    entry: Option<&NodeStatus>,
    now: &Time,
    timeout: Option<Duration>,
) -> Option<Duration> {
    let entry = entry.filter(|e| {
        e.state == NodeState::Upgrading
            && e.reason.as_deref() == Some(crate::pure::transition::reasons::DEVICE_HELD)
    })?;
    let waited = observe::in_state_for(Some(entry), now)?;
    Some(timeout?.saturating_sub(waited))
}

/// When the status write after `w` may start: [`WRITE_SPACING_PER_ENTRY`] per node entry `w`
/// listed, after `w`'s start (None: `w` was not written by this process).
fn next_write(w: &Written) -> Option<Instant> {
    let omitted = w.status.summary.as_ref().map_or(0, |s| s.nodes_omitted);
    let listed = w.nodes.len() - usize::try_from(omitted).unwrap_or(0).min(w.nodes.len());
    let entries = u32::try_from(listed).unwrap_or(u32::MAX);
    Some(w.written_at? + WRITE_SPACING_PER_ENTRY * entries)
}

/// Whether an action runs in the background ([`crate::runtime::node_tasks`]).
fn in_background(action: &Action) -> bool {
    matches!(
        action,
        Action::Cordon | Action::Grant | Action::ReplaceAgent { .. } | Action::ClearRetry
    )
}

/// Wakes the policy's reconcile.
fn waker(ctx: &Context, policy: &str) -> crate::runtime::node_tasks::Wake {
    let tx = ctx.wake.clone();
    let policy = ObjectRef::<TenstorrentDriverPolicy>::new(policy);
    Arc::new(move || {
        let _ = tx.unbounded_send(policy.clone());
    })
}

/// Logs a node action's failure and keeps it if it is the first.
fn keep_failure(node: &str, action: Action, e: Error, first: &mut Option<Error>) {
    warn!(node = %node, ?action, error = %error_chain(&e), "node action failed");
    first.get_or_insert(e);
}

/// One node's actions with what they need: the node, its actions, observation, agent pod and
/// when it entered its state.
type NodeWork<'a> = (
    &'a String,
    Vec<Action>,
    Option<&'a NodeObservation>,
    Option<&'a CachedPod>,
    Option<&'a Time>,
);

/// What each node's actions returned.
type NodeOutcome<'a> = (
    &'a String,
    Vec<(Action, Result<Option<UncordonOutcome>, Error>)>,
);

/// Runs the nodes' actions, each node's in order, up to [`NODE_ACTIONS_AT_ONCE`] nodes at a time.
/// The futures are made as slots free up: a wave of hundreds of nodes starting their drains
/// would otherwise hold hundreds of request futures of kilobytes each. (A loop, not
/// `stream::iter(..).map(..).buffer_unordered(..)`: rustc cannot show that closure's future
/// `Send` for every lifetime of the borrowed arguments.)
async fn act_on_nodes<'a>(
    ctx: &Arc<Context>,
    policy: &TenstorrentDriverPolicy,
    work: Vec<NodeWork<'a>>,
    now: &Time,
) -> Vec<NodeOutcome<'a>> {
    let mut outcomes = Vec::new();
    let mut work = work.into_iter();
    let mut running = futures::stream::FuturesUnordered::new();
    loop {
        while running.len() < NODE_ACTIONS_AT_ONCE {
            let Some((node, todo, obs, pod, entered)) = work.next() else {
                break;
            };
            running.push(act_in_order(
                ctx, policy, node, todo, obs, pod, entered, now,
            ));
        }
        match running.next().await {
            Some(outcome) => outcomes.push(outcome),
            None => break,
        }
    }
    outcomes
}

/// One node's actions, in order (a failure does not stop the next); every result is returned.
#[allow(clippy::too_many_arguments)]
async fn act_in_order<'a>(
    ctx: &Arc<Context>,
    policy: &TenstorrentDriverPolicy,
    node: &'a String,
    todo: Vec<Action>,
    obs: Option<&NodeObservation>,
    pod: Option<&CachedPod>,
    entered: Option<&Time>,
    now: &Time,
) -> (
    &'a String,
    Vec<(Action, Result<Option<UncordonOutcome>, Error>)>,
) {
    let mut results = Vec::with_capacity(todo.len());
    for action in todo {
        let result = act(ctx, policy, node, action, obs, pod, entered, now).await;
        results.push((action, result));
    }
    (node, results)
}

#[allow(clippy::too_many_arguments)]
async fn act(
    ctx: &Arc<Context>,
    policy: &TenstorrentDriverPolicy,
    node: &str,
    action: Action,
    obs: Option<&NodeObservation>,
    pod: Option<&CachedPod>,
    entered: Option<&Time>,
    now: &Time,
) -> Result<Option<UncordonOutcome>, Error> {
    let name = policy.name_any();
    match action {
        Action::Cordon => {
            node_actions::cordon_and_close_gates(
                &ctx.client,
                &name,
                node,
                &ctx.settings.deploy_gates,
            )
            .await?;
        }
        Action::Drain => {
            let drain = &policy.spec.upgrade_policy.drain;
            let elapsed = entered
                .map(|t| now.0.duration_since(t.0))
                .and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default();
            let total = drain_timeout_seconds(drain);
            let timeout = total.saturating_sub(elapsed).max(Duration::from_secs(1));
            let pod_selector = policy
                .spec
                .pod_selector()
                .map_err(|source| Error::InvalidSpec {
                    policy: name.clone(),
                    source,
                })?;
            let plan = TwoPassDrain {
                device: DevicePredicate {
                    host_path_prefixes: vec![names::DEVICE_PATH.to_owned()],
                    resource_prefixes: vec![names::DEVICE_RESOURCE_PREFIX.to_owned()],
                },
                full_node: drain.full_node,
                pod_selector,
                force: drain.force,
                delete_emptydir_data: drain.delete_empty_dir,
                options: DrainOptions {
                    timeout: Some(timeout),
                    ..DrainOptions::default()
                },
            };
            ctx.drains.ensure(
                &ctx.drain_client,
                &name,
                node,
                plan,
                ctx.metrics.clone(),
                waker(ctx, &name),
            );
        }
        Action::Grant => {
            node_actions::grant_upgrade(&ctx.client, &name, node, &policy.spec.version).await?;
        }
        Action::ReplaceAgent { even_current } => {
            let replace = match obs.map(|o| &o.agent) {
                Some(AgentPod::Stale) => true,
                Some(AgentPod::Current(
                    AgentCondition::Failed { .. } | AgentCondition::WaitingForHolders { .. },
                )) => even_current,
                _ => false,
            };
            // A pod deleted moments ago may still look alive in the cache: once is enough.
            let uid = pod
                .and_then(|p| p.metadata.uid.as_deref())
                .unwrap_or_default();
            if let (true, Some(pod)) = (replace, pod)
                && ctx.first_deletion(uid)
                && let Err(e) = node_actions::delete_agent_pod(&ctx.client, pod).await
            {
                ctx.forget_deletion(uid);
                return Err(e);
            }
        }
        Action::Release => {
            let cached = ctx
                .nodes
                .get(&ObjectRef::new(node))
                .and_then(|n| n.to_node());
            return node_actions::release(&ctx.client, &name, node, cached)
                .await
                .map(Some);
        }
        Action::ClearRetry => node_actions::clear_retry(&ctx.client, node).await?,
    }
    Ok(None)
}

/// Logs the state changes, queues their Events ([`crate::runtime::events`]) and counts them.
fn report_changes(
    ctx: &Context,
    policy: &TenstorrentDriverPolicy,
    changes: &[crate::pure::status::StateChange],
) {
    for c in changes {
        info!(node = %c.node, from = ?c.from, to = %c.to, reason = ?c.reason, message = ?c.message, "node state changed");
        ctx.events.node_changed(policy, c);
    }
    ctx.metrics.record_changes(&policy.name_any(), changes);
}

/// Sets the `ttdp_nodes` gauge from every node entry.
fn set_node_counts(ctx: &Context, name: &str, all: &Entries) {
    let mut counts: BTreeMap<(NodeState, String), i64> = BTreeMap::new();
    for n in all.values() {
        let version = n.current_version.clone().unwrap_or_else(|| "none".into());
        *counts.entry((n.state, version)).or_default() += 1;
    }
    ctx.metrics.set_nodes(name, &counts);
}

/// The spec cannot be acted on: say so in the status and touch nothing else.
async fn invalid_spec(
    policy: &TenstorrentDriverPolicy,
    ctx: &Context,
    last: &Written,
    err: ttdp_api::driver::v1alpha1::SpecError,
    now: &Time,
) -> Result<Requeue, Error> {
    let facts = facts_as_recorded(policy, &last.nodes, Some(err.to_string()), None);
    let was_invalid = last.status.conditions.iter().any(|c| {
        c.type_ == ttdp_api::driver::v1alpha1::condition::INVALID_SPEC && c.status == "True"
    });
    record_as_recorded(ctx, policy, last, &facts, now).await?;
    if !was_invalid {
        warn!(policy = %policy.name_any(), error = %err, "invalid spec");
        ctx.events.policy_event(
            policy,
            true,
            "InvalidSpec",
            format!("{err}; fix the spec, nothing is rolled out until then"),
        );
    }
    Ok(Requeue::await_change())
}

/// The policy is being deleted: stop drains, reopen gates and lift cordons we placed, delete the
/// DaemonSet. Loaded modules stay (the spec: deleting the DaemonSet does not unload).
pub async fn cleanup(
    policy: Arc<TenstorrentDriverPolicy>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    let name = policy.name_any();
    ctx.drains.retain(&name, |_| false);
    ctx.node_tasks.settle(&name).await;
    let last = previous_of(&policy, &ctx).await?;
    let recorded = &last.nodes;
    let mut released = 0;
    let mut seen = HashSet::new();
    for n in ctx.nodes.state() {
        let node = n.name_any();
        seen.insert(node.clone());
        let was_ours = recorded.contains_key(node.as_str());
        let in_flight = recorded
            .get(node.as_str())
            .is_some_and(|r| r.state.is_in_flight() || r.state == NodeState::Failed);
        if holds_ours(&n.metadata, &name, || was_ours) || in_flight {
            node_actions::release(&ctx.client, &name, &node, None).await?;
            released += 1;
        }
    }
    let ns = &ctx.settings.namespace;
    let ds_name = names::daemonset_name(&name);
    let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), ns);
    match api.delete(&ds_name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(Error::kube(format!("delete daemonset {ns}/{ds_name}"), e)),
    }
    info!(policy = %name, released, "policy deleted: nodes released, daemonset deleted, modules left loaded");
    ctx.events.policy_event(
        &policy,
        false,
        "Cleanup",
        format!("released {released} nodes and deleted daemonset {ds_name}; loaded modules are left as they are"),
    );
    ctx.remember_applied(&ds_name, None);
    ctx.forget(&policy.uid().unwrap_or_default());
    ctx.metrics.forget_policy(&name);
    Ok(Requeue::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use serde_json::json;
    use ttdp_api::driver::v1alpha1::Summary;

    fn entry(name: &str, state: NodeState) -> NodeStatus {
        NodeStatus {
            name: name.into(),
            state,
            current_version: Some("2.7.0".into()),
            target_version: None,
            install_mode: None,
            reason: None,
            message: None,
            last_transition_time: None,
            phase_start_time: None,
            attempts: None,
        }
    }

    fn status(nodes: Vec<NodeStatus>, omitted: i32) -> TenstorrentDriverPolicyStatus {
        TenstorrentDriverPolicyStatus {
            observed_generation: Some(2),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: "RollingOut".into(),
                message: String::new(),
                observed_generation: Some(2),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            }],
            summary: Some(Summary {
                matched: 3,
                nodes_omitted: omitted,
                ..Summary::default()
            }),
            nodes,
        }
    }

    fn entries(nodes: Vec<NodeStatus>) -> Entries {
        nodes
            .into_iter()
            .map(|n| (Arc::from(n.name.as_str()), Arc::new(n)))
            .collect()
    }

    fn written(nodes: Vec<NodeStatus>, omitted: i32, version: Option<&str>) -> Written {
        Written {
            status: status(Vec::new(), omitted),
            nodes: entries(nodes),
            resource_version: version.map(str::to_owned),
            written_at: None,
        }
    }

    /// `nodes` built after `last`: what changed found as update_status finds it.
    fn built(last: &Written, nodes: Vec<NodeStatus>, omitted: i32) -> BuiltStatus {
        let all_nodes = entries(nodes);
        let changed = all_nodes
            .iter()
            .filter(|(name, entry)| last.nodes.get(&***name) != Some(*entry))
            .map(|(name, _)| name.clone())
            .collect();
        BuiltStatus {
            status: status(Vec::new(), omitted),
            same_nodes: all_nodes.keys().eq(last.nodes.keys()),
            all_nodes,
            changes: Vec::new(),
            changed,
        }
    }

    fn fleet(states: [NodeState; 4]) -> Vec<NodeStatus> {
        ["a", "b", "c", "d"]
            .iter()
            .zip(states)
            .map(|(n, s)| entry(n, s))
            .collect()
    }

    #[test]
    fn a_hand_off_sends_the_changed_entries_guarded_by_the_last_written_version() {
        use NodeState::*;
        let last = written(fleet([Upgrading, Pending, Done, Pending]), 0, Some("41"));
        let mut next = built(&last, fleet([Done, Cordoning, Done, Pending]), 0);
        next.status.observed_generation = Some(3);
        let ops = status_delta(&last, &next).unwrap();
        assert_eq!(
            ops,
            vec![
                json!({"op": "test", "path": "/metadata/resourceVersion", "value": "41"}),
                json!({"op": "add", "path": "/status/observedGeneration", "value": 3}),
                json!({"op": "replace", "path": "/status/nodes/0", "value": {"name": "a", "state": "Done", "currentVersion": "2.7.0"}}),
                json!({"op": "replace", "path": "/status/nodes/1", "value": {"name": "b", "state": "Cordoning", "currentVersion": "2.7.0"}}),
            ]
        );
    }

    #[test]
    fn the_whole_status_is_written_when_a_delta_cannot_be_trusted_or_is_not_worth_it() {
        use NodeState::*;
        let now = fleet([Done, Cordoning, Done, Pending]);
        let states = [Upgrading, Pending, Done, Pending];
        let delta = |last: &Written, nodes: Vec<NodeStatus>, omitted| {
            status_delta(last, &built(last, nodes, omitted))
        };
        // Never written by this controller (or read) at a known version.
        assert!(delta(&written(fleet(states), 0, None), now.clone(), 0).is_none());
        // The last write left entries out (compaction): indexes do not match.
        assert!(delta(&written(fleet(states), 2, Some("41")), now.clone(), 0).is_none());
        // This one leaves entries out.
        assert!(delta(&written(fleet(states), 0, Some("41")), now.clone(), 2).is_none());
        // A node joined.
        let mut joined = now.clone();
        joined.push(entry("e", Pending));
        assert!(delta(&written(fleet(states), 0, Some("41")), joined, 0).is_none());
        // Another node in the same place.
        let mut renamed = now.clone();
        renamed[2].name = "z".into();
        assert!(delta(&written(fleet(states), 0, Some("41")), renamed, 0).is_none());
        // Most entries changed (a version bump queues every node).
        let done = written(fleet([Done, Done, Done, Done]), 0, Some("41"));
        assert!(delta(&done, fleet([Pending, Pending, Pending, Done]), 0).is_none());
        // Nothing changed: only the guard (record() skips the write before it gets here).
        let same = written(now.clone(), 0, Some("41"));
        assert_eq!(delta(&same, now, 0).map(|ops| ops.len()), Some(1));
    }

    #[test]
    fn writes_are_spaced_by_the_entries_listed() {
        let nodes: Vec<NodeStatus> = (0..5_000)
            .map(|i| entry(&format!("n{i:04}"), NodeState::Done))
            .collect();
        let start = Instant::now();
        let mut w = written(nodes, 0, None);
        assert_eq!(next_write(&w), None, "not written by this process: no wait");
        w.written_at = Some(start);
        assert_eq!(next_write(&w), Some(start + Duration::from_millis(50)));
        // The same fleet with all but 500 nodes left out of status.nodes.
        w.status.summary.as_mut().unwrap().nodes_omitted = 4_500;
        assert_eq!(next_write(&w), Some(start + Duration::from_millis(5)));
    }
}
