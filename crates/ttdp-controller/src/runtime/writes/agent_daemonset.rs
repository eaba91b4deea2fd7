//! The policy's agent DaemonSets: applied when the desired one ([`crate::pure::daemonset`])
//! changed or the cached one drifted from what was applied, and, when a node it should run on
//! has no agent pod, why the DaemonSet controller cannot create it (its `FailedCreate` Events).
//! Besides the default DaemonSet, one per compiler family an image serves
//! ([`crate::pure::builder_images`]); a family DaemonSet no longer wanted is deleted.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use sha2::{Digest, Sha256};
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names;
use ttdp_api::names::compiler::BUILDER_GCC_LABEL;
use ttdp_api::node_selection::NodeSelection;

use crate::error::Error;
use crate::pure::agent_blocker::{self, Blocker};
use crate::pure::builder_images;
use crate::pure::cached::{CachedNode, CachedPod};
use crate::pure::daemonset::{daemonset_template_hash, desired_daemonset};
use crate::settings::Settings;

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

/// What this controller last applied of each agent DaemonSet (by name): an unchanged one is
/// not applied again.
#[derive(Debug, Default)]
pub struct AppliedDaemonSets {
    applied: Mutex<HashMap<String, AppliedDaemonSet>>,
}

impl AppliedDaemonSets {
    /// What was last applied as DaemonSet `name`.
    pub fn get(&self, name: &str) -> Option<AppliedDaemonSet> {
        let applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        applied.get(name).cloned()
    }

    /// Remembers what was applied as DaemonSet `name` (`None`: forget it).
    pub fn remember(&self, name: &str, applied: Option<AppliedDaemonSet>) {
        let mut map = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        match applied {
            Some(a) => map.insert(name.to_owned(), a),
            None => map.remove(name),
        };
    }
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

/// A policy's agent DaemonSet as the caches show it, with what applying it needs.
pub struct AgentDaemonSet<'a> {
    /// The client it is applied with.
    pub client: &'a Client,
    /// The controller's settings (namespace, images, ...).
    pub settings: &'a Settings,
    /// What was last applied.
    pub applied: &'a AppliedDaemonSets,
    /// Its name.
    pub name: String,
    /// The DaemonSet in the cache.
    pub cached: Option<Arc<DaemonSet>>,
    /// Every agent DaemonSet in the cache (the family DaemonSets are looked up here).
    pub all_cached: &'a Store<DaemonSet>,
    /// The agent pods in the cache (every policy's).
    pub agent_pods: &'a Store<CachedPod>,
    /// The policy.
    pub policy: String,
}

impl AgentDaemonSet<'_> {
    /// Applies the DaemonSet (unless paused and it exists, or it is already as desired) and
    /// returns its template hash. Reads the DaemonSet from the cache, so an unchanged policy
    /// costs no request.
    pub async fn ensure(
        &self,
        policy: &TenstorrentDriverPolicy,
        selection: &NodeSelection,
    ) -> Result<String, Error> {
        let desired = desired_daemonset(policy, self.settings, selection)?;
        if policy.spec.paused
            && let Some(hash) = self.cached.as_deref().and_then(daemonset_template_hash)
        {
            return Ok(hash.to_owned());
        }
        let hash = daemonset_template_hash(&desired)
            .unwrap_or_default()
            .to_owned();
        // families first: a node the default DaemonSet lets go has its family's waiting
        let families = builder_images::family_images(policy, self.settings);
        let mut wanted = Vec::with_capacity(families.len());
        for (major, image) in &families {
            let family = builder_images::for_family(desired.clone(), &self.policy, *major, image);
            let name = family.metadata.name.clone().unwrap_or_default();
            let key = ObjectRef::<DaemonSet>::new(&name).within(&self.settings.namespace);
            self.apply(&name, self.all_cached.get(&key).as_deref(), &family)
                .await?;
            wanted.push(name);
        }
        let default = builder_images::leave_families(desired, &families);
        self.apply(&self.name, self.cached.as_deref(), &default)
            .await?;
        self.delete_unwanted_families(&wanted).await?;
        Ok(hash)
    }

    /// Applies `desired` as DaemonSet `ds_name` unless the cached `existing` one is what was
    /// last applied and `desired` has not changed.
    async fn apply(
        &self,
        ds_name: &str,
        existing: Option<&DaemonSet>,
        desired: &DaemonSet,
    ) -> Result<(), Error> {
        let ns = &self.settings.namespace;
        let digest = digest_of(desired)?;
        if let (Some(existing), Some(applied)) = (existing, self.applied.get(ds_name))
            && up_to_date(existing, desired, &applied, &digest)
        {
            return Ok(());
        }
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), ns);
        let result = api
            .patch(
                ds_name,
                &PatchParams::apply(names::CONTROLLER_MANAGER).force(),
                &Patch::Apply(desired),
            )
            .await
            .map_err(|source| Error::ApplyDaemonSet {
                daemonset: format!("{ns}/{ds_name}"),
                source,
            })?;
        self.applied.remember(
            ds_name,
            Some(AppliedDaemonSet {
                digest,
                uid: result.metadata.uid,
                generation: result.metadata.generation,
            }),
        );
        Ok(())
    }

    /// The policy's family DaemonSets in the cache, by name.
    pub fn cached_families(&self) -> Vec<String> {
        let policy = Some(self.policy.as_str());
        (self.all_cached.state().iter())
            .filter(|d| d.labels().get(names::labels::POLICY).map(String::as_str) == policy)
            .filter(|d| d.labels().contains_key(BUILDER_GCC_LABEL))
            .map(|d| d.name_any())
            .collect()
    }

    /// Deletes the policy's family DaemonSets not in `wanted` (an image no longer named, or
    /// `installer.image` set): their nodes go back to the default DaemonSet.
    pub async fn delete_unwanted_families(&self, wanted: &[String]) -> Result<(), Error> {
        let ns = &self.settings.namespace;
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), ns);
        for name in self.cached_families() {
            if wanted.contains(&name) {
                continue;
            }
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {
                    tracing::info!(daemonset = %name, "family daemonset no longer wanted: deleted")
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete daemonset {ns}/{name}"), e)),
            }
            self.applied.remember(&name, None);
        }
        Ok(())
    }

    /// Why the DaemonSet cannot create agent pods, when a node it manages has none and the
    /// DaemonSet controller's `FailedCreate` Events say (see [`agent_blocker::failed_create`]).
    /// Without permission to list Events the nodes just wait, as without an Event.
    pub async fn blocker(
        &self,
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
        let (ds_name, ns) = (&self.name, &self.settings.namespace);
        let uid = self.cached.as_ref().and_then(|d| d.metadata.uid.clone());
        let fields = format!(
            "involvedObject.kind=DaemonSet,involvedObject.name={ds_name},reason={}",
            agent_blocker::FAILED_CREATE
        );
        let events = match Api::<Event>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().fields(&fields))
            .await
        {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(daemonset = %ds_name, error = %e, "cannot list the DaemonSet's events");
                return None;
            }
        };
        agent_blocker::failed_create(
            &events,
            &format!("{ns}/{ds_name}"),
            uid.as_deref(),
            self.newest_pod().as_ref(),
            &Time(Timestamp::now()),
        )
    }

    /// When the policy's newest agent pod was created.
    fn newest_pod(&self) -> Option<Time> {
        let policy = Some(self.policy.as_str());
        (self.agent_pods.state().iter())
            .filter(|p| p.labels().get(names::labels::POLICY).map(String::as_str) == policy)
            .filter_map(|p| p.metadata.creation_timestamp.clone())
            .max_by_key(|t| t.0)
    }
}
