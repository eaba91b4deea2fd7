//! The reconciler: waits for the caches, adds the finalizer, dispatches to [`apply`] (one
//! [`Pass`]) and [`cleanup`], and shows a failed reconcile on the policy. A pass follows the
//! fleet ([`follow`]) between its rounds; [`backoff`] spaces a policy's failed reconciles.

pub(crate) mod backoff;
pub(crate) mod follow;
pub(crate) mod pass;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use tracing::{info, instrument, warn};
use ttdp_api::driver::v1alpha1::{TenstorrentDriverPolicySpec, condition};
use ttdp_api::names;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};
use ttdp_kmd_types::KmdVersion;

use crate::error::{Error, error_chain};
use crate::pure::canary;
use crate::pure::pause::{self, AppliedTarget};
use crate::pure::status::{NodeEntries, PolicyFacts, ReconcileFailure};
use crate::pure::{node_record, observe};
use crate::runtime::node_work::node_actions;
use crate::runtime::process::context::Context;
use crate::runtime::reconcile::pass::Pass;
use crate::runtime::writes::status_writer::{self, RecordedStatus};

/// How long a reconcile waits for the watches' first lists.
const INITIAL_LIST_WAIT: Duration = Duration::from_secs(30);

/// Reconciles one policy.
#[instrument(skip_all, fields(policy = %policy.name_any()))]
pub async fn reconcile(
    policy: Arc<TenstorrentDriverPolicy>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    let started = Instant::now();
    let name = policy.name_any();
    if !ctx.caches.initial_lists.wait(INITIAL_LIST_WAIT).await {
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

/// Observe, plan, record, act; then, while something changed, again with only the changed nodes
/// observed anew: nodes released in a pass (their upgrade finished) are recorded Done and their
/// slots handed to the next nodes in the next pass, and an agent's Ready, a finished cordon or
/// drain is acted on in the pass after it arrives, instead of in a new reconcile that observes
/// the whole fleet; between rounds it waits for the next change. It stops after [`FOLLOW_FOR`],
/// when a retry gate opens, when an action fails, or when a policy, the selection or the set of nodes
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
    recorded: &NodeEntries,
    invalid_spec: Option<String>,
    failure: Option<ReconcileFailure>,
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
        canary_halt: None,
    }
}

/// Shows a failed reconcile on the policy: `Reconciled` False with the API server's message,
/// and a Warning Event when the failure differs from the last one reported.
async fn report_failure(policy: &TenstorrentDriverPolicy, ctx: &Context, err: &Error) {
    let uid = policy.uid().unwrap_or_default();
    let failure = ReconcileFailure::of(err);
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
    failure: Option<ReconcileFailure>,
) {
    let written = match last_recorded(policy, ctx).await {
        Ok(last) => {
            let facts = facts_as_recorded(policy, &last.nodes, None, failure);
            status_writer::record_nodes_as_they_are(
                (&ctx.status_views, &ctx.client),
                policy,
                &last,
                &facts,
            )
            .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = written {
        warn!(policy = %policy.name_any(), error = %error_chain(&e), "cannot write the Reconciled condition");
    }
}

/// [`apply`] without the failure report: observe, then plan, record and act round after round
/// while the fleet changes (see [`Pass`]).
async fn apply_policy(
    policy: Arc<TenstorrentDriverPolicy>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    // A background action failed: fail this reconcile with it, so the policy backs off before
    // the action is tried again.
    if let Some(e) = ctx
        .node_tasks
        .take_failures(&policy.name_any())
        .into_iter()
        .next()
    {
        return Err(e);
    }
    let recorded = last_recorded(&policy, &ctx).await?;
    let target = match validated_target(&policy.spec) {
        Ok(target) => target,
        Err(problem) => return invalid_spec(&policy, &ctx, &recorded, problem).await,
    };
    let (as_read, ctx_kept) = (policy.clone(), ctx.clone());
    let (policy, target, rollout_target) = held_while_paused(policy, &ctx, &recorded, target);
    let (policy, target) = rolled_back(policy, &recorded, target);
    let Some(mut pass) = Pass::observe(policy, ctx, recorded, target, &rollout_target).await?
    else {
        return Ok(Requeue::await_change());
    };
    let mut going_on = pass.round().await?;
    if pass.went_through() {
        // A pass may follow the fleet for minutes: a failure shown before is over now.
        pass.forget_failure();
        clear_failure(&as_read, &ctx_kept).await;
    }
    while going_on {
        going_on = pass.round().await?;
    }
    pass.finish().await
}

/// A paused policy as the controller acts on it ([`pause::acted_on`]): with the version and
/// parameters its DaemonSet was last applied with, so that a change staged while paused moves
/// no node. Returns the policy, its target and the version whose rollout the canary follows.
fn held_while_paused(
    policy: Arc<TenstorrentDriverPolicy>,
    ctx: &Context,
    recorded: &RecordedStatus,
    target: KmdVersion,
) -> (Arc<TenstorrentDriverPolicy>, KmdVersion, String) {
    let ds_name = names::daemonset_name(&policy.name_any());
    let applied = ctx
        .caches
        .daemonsets
        .get(&ObjectRef::<DaemonSet>::new(&ds_name).within(&ctx.settings.namespace))
        .and_then(|ds| AppliedTarget::of(&ds));
    let (spec, rollout_target) =
        pause::acted_on(&policy.spec, applied, recorded.status.rollout.as_ref());
    if spec == policy.spec {
        return (policy, target, rollout_target);
    }
    let Ok(held_target) = spec.version.parse::<KmdVersion>() else {
        return (policy, target, rollout_target);
    };
    let mut held = (*policy).clone();
    held.spec = spec;
    (Arc::new(held), held_target, rollout_target)
}

/// While the canary rolls back (`status.rollout` RollingBack or RolledBack for this
/// `spec.version`), the policy as if it asked for the version the nodes ran before: the
/// DaemonSet, the rules and the status then take the canary nodes back through the same safe
/// path, and the nodes that never started already run it.
fn rolled_back(
    policy: Arc<TenstorrentDriverPolicy>,
    recorded: &RecordedStatus,
    target: KmdVersion,
) -> (Arc<TenstorrentDriverPolicy>, KmdVersion) {
    let from = canary::rolling_back_to(recorded.status.rollout.as_ref(), &policy.spec);
    let Some((from, version)) = from.and_then(|f| Some((f, f.parse::<KmdVersion>().ok()?))) else {
        return (policy, target);
    };
    let mut back = (*policy).clone();
    back.spec.version = from.to_owned();
    (Arc::new(back), version)
}

/// The spec's target version, parsed once here, when the controller can act on the spec;
/// else what is wrong with it.
fn validated_target(spec: &TenstorrentDriverPolicySpec) -> Result<KmdVersion, String> {
    spec.validate().map_err(|e| e.to_string())?;
    spec.version
        .parse()
        .map_err(|e: ttdp_kmd_types::InvalidVersion| format!("spec.version: {e}"))
}

/// The spec cannot be acted on: say so in the status and touch nothing else.
async fn invalid_spec(
    policy: &TenstorrentDriverPolicy,
    ctx: &Context,
    last: &RecordedStatus,
    err: String,
) -> Result<Requeue, Error> {
    let facts = facts_as_recorded(policy, &last.nodes, Some(err.clone()), None);
    let was_invalid = last
        .status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::INVALID_SPEC && c.status == "True");
    status_writer::record_nodes_as_they_are((&ctx.status_views, &ctx.client), policy, last, &facts)
        .await?;
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
    let last = last_recorded(&policy, &ctx).await?;
    let recorded = &last.nodes;
    let mut released = 0;
    for n in ctx.caches.nodes.state() {
        let node = n.name_any();
        let was_ours = recorded.contains_key(node.as_str());
        let in_flight = recorded
            .get(node.as_str())
            .is_some_and(|r| r.state.is_in_flight() || r.state == NodeState::Failed);
        let recorded_on_node = node_record::current(&n.metadata, &name).is_some();
        if observe::holds_ours(&n.metadata, &name, || was_ours) || in_flight || recorded_on_node {
            let removed = node_actions::RecordOnRelease::Remove;
            node_actions::release(&ctx.client, &name, &node, None, removed).await?;
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
    ctx.daemonsets.remember(&ds_name, None);
    ctx.agent_daemonset(&name)
        .delete_unwanted_families(&[])
        .await?;
    ctx.forget(&policy.uid().unwrap_or_default());
    ctx.metrics.forget_policy(&name);
    Ok(Requeue::await_change())
}

/// The previous status and node entries: what this controller last wrote, else the API's copy
/// (read once: the cached policy carries no node entries, see [`crate::pure::cached::WatchedPolicy`]),
/// with the upgrade records on the nodes laid over it.
/// Shared, not copied: with thousands of nodes a copy costs megabytes.
async fn last_recorded(
    policy: &TenstorrentDriverPolicy,
    ctx: &Context,
) -> Result<Arc<RecordedStatus>, Error> {
    let uid = policy.uid().unwrap_or_default();
    if let Some(written) = ctx.status_views.decided(&uid) {
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
    let mut nodes = std::mem::take(&mut status.nodes)
        .into_iter()
        .map(|n| (Arc::from(n.name.as_str()), Arc::new(n)))
        .collect();
    // The status may have lost nodes (wiped, or left out past its size bound); their records
    // on the nodes say where they were.
    let cached = ctx.caches.nodes.state();
    let on_nodes = cached.iter().map(|n| (n.name(), &n.metadata));
    node_record::overlay(&mut nodes, on_nodes, &name);
    Ok(Arc::new(RecordedStatus {
        status,
        nodes,
        resource_version,
        written_at: None,
    }))
}
