//! The policy's agent DaemonSet: applied when the desired one ([`crate::pure::daemonset`])
//! changed or the cached one drifted from what was applied, and, when a node it should run on
//! has no agent pod, why the DaemonSet controller cannot create it (its `FailedCreate` Events).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use sha2::{Digest, Sha256};
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names;
use ttdp_api::node_selection::NodeSelection;

use crate::error::Error;
use crate::pure::agent_blocker::{self, Blocker};
use crate::pure::cached::{CachedNode, CachedPod};
use crate::pure::daemonset::{daemonset_template_hash, desired_daemonset};
use crate::runtime::context::Context;

/// A DaemonSet as the controller last applied it: skipping an apply is safe while the cached
/// DaemonSet is still this object at this generation and the desired one has not changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedDaemonSet {
    /// sha256 of the desired DaemonSet's JSON.
    pub digest: String,
    /// The DaemonSet's uid after the apply.
    pub uid: Option<String>,
    /// Its `metadata.generation` after the apply.
    pub generation: Option<i64>,
}

/// sha256 (hex) of an object's JSON.
fn digest_of(value: &impl serde::Serialize) -> Result<String, Error> {
    let json = serde_json::to_vec(value).map_err(Error::Serialize)?;
    Ok(hex::encode(Sha256::digest(&json)))
}

/// Whether the cached DaemonSet is still what the controller applied (same object, same
/// generation, our labels and owner) and the desired one is unchanged: then applying again would
/// change nothing.
fn up_to_date(
    existing: &DaemonSet,
    desired: &DaemonSet,
    applied: &AppliedDaemonSet,
    digest: &str,
) -> bool {
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
pub async fn ensure(
    ctx: &Context,
    policy: &TenstorrentDriverPolicy,
    selection: &NodeSelection,
) -> Result<String, Error> {
    let desired = desired_daemonset(policy, &ctx.settings, selection)?;
    let ds_name = names::daemonset_name(&policy.name_any());
    let ns = &ctx.settings.namespace;
    let existing = ctx
        .caches
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
        Some(AppliedDaemonSet {
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
pub async fn blocker(
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
        .caches
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
        .caches
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
