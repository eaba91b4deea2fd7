//! Carrying out a node's [`Action`]s: each node's in order (a failure does not stop the next),
//! several nodes at once. A node's work runs in the background
//! ([`crate::runtime::node_work::node_tasks`]): its upgrade record first, when no action carries it, then
//! its actions, so that no node waits for another node's writes. A reconcile waits only for the
//! lifts of its cordons, and hands each freed slot on as soon as its lift lands.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use serde_json::Value;
use tracing::{info, warn};
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_drain::UncordonOutcome;
use ttdp_kmd_types::KmdVersion;

use crate::error::{Error, error_chain};
use crate::pure::cached::{CachedNode, CachedPod};
use crate::pure::transition::Action;
use crate::pure::{drain_plan, node_record, observe};
use crate::runtime::node_work::node_actions::{self, RecordOnRelease};
use crate::runtime::node_work::node_tasks::{Lane, Wake};
use crate::runtime::process::context::Context;
use crate::runtime::writes::status_writer::RecordedStatus;
use ttdp_api::node_record::NodeRecord;

/// One node's actions with what they need.
#[derive(Clone, Debug)]
pub struct NodeWork {
    /// The node.
    pub node: String,
    /// Its actions, in order.
    pub actions: Vec<Action>,
    /// The agent pod a `ReplaceAgent` deletes (None: there is none to replace).
    pub stale_agent: Option<CachedPod>,
    /// The version a `Grant` grants (the policy's target).
    pub grant: Option<KmdVersion>,
    /// When the node entered its state (a drain's timeout counts from there).
    pub entered: Option<Time>,
    /// The node's upgrade record, written with a `Cordon` or a `Grant` in the same patch.
    pub record: Option<NodeRecord>,
    /// The merge patch that writes the node's upgrade record before its actions, when none of
    /// them carries it.
    pub record_patch: Option<Value>,
    /// What a `Release` does with the node's upgrade record.
    pub on_release: RecordOnRelease,
}

impl NodeWork {
    /// Lifting the cordon of `node`, whose upgrade reached its target, and reopening its
    /// gates, with its Uncordoning `record` in the same write.
    pub fn lift(node: &str, record: Option<NodeRecord>) -> Self {
        Self {
            node: node.to_owned(),
            actions: vec![Action::Release],
            stale_agent: None,
            grant: None,
            entered: None,
            record: None,
            record_patch: None,
            on_release: record.map_or(RecordOnRelease::Keep, RecordOnRelease::Set),
        }
    }
}

/// What one node's actions returned; a lifted cordon says how it was lifted.
pub type NodeOutcome = (
    String,
    Vec<(Action, Result<Option<UncordonOutcome>, Error>)>,
);

/// Runs `work` in the background: the node's record, then its actions, none if the record could
/// not be written. Its first failure fails the policy's next reconcile.
pub fn spawn_in_background(
    ctx: &Arc<Context>,
    policy: &Arc<TenstorrentDriverPolicy>,
    mut work: NodeWork,
    now: &Time,
) {
    let (task_ctx, task_policy, now) = (ctx.clone(), policy.clone(), now.clone());
    let name = policy.name_any();
    let node = work.node.clone();
    let lane = if work.actions.contains(&Action::Cordon) {
        Lane::HandOff
    } else {
        Lane::Other
    };
    let task = move || async move {
        if let Some(patch) = work.record_patch.take() {
            let what = "record the upgrade";
            node_actions::merge_patch_node(&task_ctx.client, &work.node, patch, what)
                .await
                .inspect_err(|e| {
                    warn!(node = %work.node, error = %error_chain(e), "upgrade record not written; the node waits");
                })?;
        }
        let (node, results) = on_node(&task_ctx, &task_policy, work, &now).await;
        let mut first_error = None;
        for (action, result) in results {
            if let Err(e) = result {
                keep_failure(&node, action, e, &mut first_error);
            }
        }
        first_error.map_or(Ok(()), Err)
    };
    ctx.node_tasks
        .spawn(lane, &name, &node, task, waker(ctx, &name));
}

/// Lifts on their way, each yielding its outcome as it lands.
pub type LiftsInFlight = FuturesUnordered<BoxFuture<'static, NodeOutcome>>;

/// Sends `work`'s lifts on their way beside those already in `lifts`.
pub fn send_lifts(
    lifts: &mut LiftsInFlight,
    ctx: &Arc<Context>,
    policy: &Arc<TenstorrentDriverPolicy>,
    work: Vec<NodeWork>,
    now: &Time,
) {
    for w in work {
        let (ctx, policy, now) = (ctx.clone(), policy.clone(), now.clone());
        lifts.push(Box::pin(
            async move { on_node(&ctx, &policy, w, &now).await },
        ));
    }
}

/// The next lift to land, with every other one landed by then; empty when none is on its way.
pub async fn landed(lifts: &mut LiftsInFlight) -> Vec<NodeOutcome> {
    let Some(first) = lifts.next().await else {
        return Vec::new();
    };
    let mut landed = vec![first];
    while let Some(Some(more)) = lifts.next().now_or_never() {
        landed.push(more);
    }
    landed
}

/// One node's actions, in order (a failure does not stop the next); every result is returned.
async fn on_node(
    ctx: &Arc<Context>,
    policy: &TenstorrentDriverPolicy,
    work: NodeWork,
    now: &Time,
) -> NodeOutcome {
    let mut results = Vec::with_capacity(work.actions.len());
    for &action in &work.actions {
        results.push((action, act(ctx, policy, &work, action, now).await));
    }
    (work.node, results)
}

/// One action on one node.
async fn act(
    ctx: &Arc<Context>,
    policy: &TenstorrentDriverPolicy,
    work: &NodeWork,
    action: Action,
    now: &Time,
) -> Result<Option<UncordonOutcome>, Error> {
    let name = policy.name_any();
    let node = work.node.as_str();
    match action {
        Action::Cordon => {
            node_actions::cordon_and_close_gates(
                &ctx.client,
                &name,
                node,
                &ctx.settings.deploy_gates,
                work.record.as_ref(),
                cached_node(ctx, node),
            )
            .await?;
        }
        Action::Drain => start_drain(ctx, policy, work, now)?,
        Action::Grant => {
            if let Some(version) = &work.grant {
                let record = work.record.as_ref();
                node_actions::grant_upgrade(&ctx.client, &name, node, version.as_str(), record)
                    .await?;
            }
        }
        Action::ReplaceAgent { .. } => {
            if let Some(pod) = &work.stale_agent {
                replace_agent(ctx, pod).await?;
            }
        }
        Action::Release => {
            let cached = cached_node(ctx, node);
            let released =
                node_actions::release(&ctx.client, &name, node, cached, work.on_release.clone())
                    .await?;
            // Pods may land on it from now on: a drain before this says nothing any more.
            ctx.drains.retain(&name, |n| n != node);
            return Ok(Some(released));
        }
        Action::ClearRetry => node_actions::clear_retry(&ctx.client, node).await?,
    }
    Ok(None)
}

/// The controller's copy of `node`, for a write that can start from it.
fn cached_node(ctx: &Context, node: &str) -> Option<k8s_openapi::api::core::v1::Node> {
    ctx.caches
        .nodes
        .get(&ObjectRef::new(node))
        .and_then(|n| n.to_node())
}

/// Starts the node's drain in the background (once; a drain already running goes on).
fn start_drain(
    ctx: &Arc<Context>,
    policy: &TenstorrentDriverPolicy,
    work: &NodeWork,
    now: &Time,
) -> Result<(), Error> {
    let name = policy.name_any();
    let elapsed = drain_plan::elapsed_since(work.entered.as_ref(), now);
    let drain =
        drain_plan::node_drain(&policy.spec, elapsed).map_err(|source| Error::InvalidSpec {
            policy: name.clone(),
            source,
        })?;
    ctx.drains.ensure(
        &ctx.drain_client,
        &name,
        &work.node,
        drain,
        ctx.metrics.clone(),
        waker(ctx, &name),
    );
    Ok(())
}

/// Deletes the agent pod, once: a pod deleted moments ago may still look alive in the cache.
async fn replace_agent(ctx: &Context, pod: &CachedPod) -> Result<(), Error> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if !ctx.first_deletion(uid) {
        return Ok(());
    }
    node_actions::delete_agent_pod(&ctx.client, pod)
        .await
        .inspect_err(|_| ctx.forget_deletion(uid))
}

/// Releases the nodes that left the policy's selection (skip label, selector change) and still
/// hold something of ours, or had an action of ours under way: that action (a grant, a cordon)
/// is waited for first and the node read afresh, so nothing of ours lands after the release.
/// The first failure is returned after trying them all.
pub async fn release_unmatched(
    ctx: &Context,
    policy: &str,
    unmatched: &[Arc<CachedNode>],
    recorded: &RecordedStatus,
) -> Result<(), Error> {
    let mut first_error = None;
    for n in unmatched {
        let node = n.name();
        let was_ours = || recorded.nodes.contains_key(node);
        let acted = ctx.node_tasks.settle_node(policy, node).await;
        let recorded_on_node = node_record::current(&n.metadata, policy).is_some();
        if acted || recorded_on_node || observe::holds_ours(&n.metadata, policy, was_ours) {
            info!(node = %node, "node left the policy's selection; releasing it");
            let removed = RecordOnRelease::Remove;
            if let Err(e) = node_actions::release(&ctx.client, policy, node, None, removed).await {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Wakes the policy's reconcile, or the pass following its fleet.
pub fn waker(ctx: &Context, policy: &str) -> Wake {
    let tx = ctx.wake.clone();
    let changes = ctx.caches.changes.clone();
    let policy = ObjectRef::<TenstorrentDriverPolicy>::new(policy);
    Arc::new(move || {
        // A pass following the fleet looks again; else a reconcile starts.
        changes.poke();
        let _ = tx.unbounded_send(policy.clone());
    })
}

/// Logs a node action's failure and keeps it if it is the first.
pub fn keep_failure(node: &str, action: Action, e: Error, first: &mut Option<Error>) {
    warn!(node = %node, ?action, error = %error_chain(&e), "node action failed");
    first.get_or_insert(e);
}
