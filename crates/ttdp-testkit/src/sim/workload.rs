//! Workload pods for scenarios: pods bound to a node that may use the Tenstorrent device, owned by
//! nothing or by a ReplicaSet, and PodDisruptionBudgets over them.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};
use ttdp_api::names::DEVICE_PATH;

use super::error::SimError;

/// The image of workload containers; the kubelet maps no binary to it, so it runs no process.
const WORKLOAD_IMAGE: &str = "sim.invalid/tenstorrent-workload:1";
/// Label every scenario workload carries, valued with its name.
pub const WORKLOAD_LABEL: &str = "sim.ttdp.tenstorrent.com/workload";
/// The extended resource simulated Tenstorrent nodes offer (4 each).
pub const DEVICE_RESOURCE: &str = "tenstorrent.com/n300";

/// Who owns a workload pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadOwner {
    /// No owner: `kubectl drain` refuses it without `--force`.
    Bare,
    /// A ReplicaSet (created too). On a real cluster the ReplicaSet controller creates the pod
    /// and replaces it after an eviction; in the simulation nothing replaces it.
    ReplicaSet,
}

/// How the workload uses the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceUse {
    /// Not at all.
    None,
    /// A `hostPath` volume of `/dev/tenstorrent`.
    HostPath,
    /// A `tenstorrent.com/n300: 1` resource request (no explicit mount).
    Resource,
}

/// A workload pod to place on a node.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Pod (and ReplicaSet) name.
    pub name: String,
    /// The node it runs on.
    pub node: String,
    /// Device use.
    pub device: DeviceUse,
    /// Owner.
    pub owner: WorkloadOwner,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Mount an `emptyDir` volume (kubectl drain needs `--delete-emptydir-data`).
    pub empty_dir: bool,
}

impl Workload {
    /// A bare workload named `name` on `node` that does not use the device.
    pub fn new(name: impl Into<String>, node: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            node: node.into(),
            device: DeviceUse::None,
            owner: WorkloadOwner::Bare,
            labels: BTreeMap::new(),
            empty_dir: false,
        }
    }

    /// Sets how it uses the device.
    pub fn device(mut self, device: DeviceUse) -> Self {
        self.device = device;
        self
    }

    /// Sets its owner.
    pub fn owner(mut self, owner: WorkloadOwner) -> Self {
        self.owner = owner;
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Mounts an `emptyDir` volume.
    pub fn with_empty_dir(mut self) -> Self {
        self.empty_dir = true;
        self
    }

    /// The pod template: pinned to the node by a required node affinity on `metadata.name`.
    fn template(&self) -> Value {
        let mut labels = self.labels.clone();
        labels.insert(WORKLOAD_LABEL.to_owned(), self.name.clone());
        let mut volumes = Vec::new();
        let mut mounts = Vec::new();
        if self.device == DeviceUse::HostPath {
            volumes.push(json!({"name": "tenstorrent", "hostPath": {"path": DEVICE_PATH}}));
            mounts.push(json!({"name": "tenstorrent", "mountPath": DEVICE_PATH}));
        }
        if self.empty_dir {
            volumes.push(json!({"name": "scratch", "emptyDir": {}}));
            mounts.push(json!({"name": "scratch", "mountPath": "/scratch"}));
        }
        let one = json!({ DEVICE_RESOURCE: "1" });
        let resources = (self.device == DeviceUse::Resource)
            .then(|| json!({"requests": one.clone(), "limits": one}));
        let node_selector = json!({"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [self.node]},
        ]}]});
        json!({
            "metadata": {"labels": labels},
            "spec": {
                "containers": [{
                    "name": "work",
                    "image": WORKLOAD_IMAGE,
                    "volumeMounts": (!mounts.is_empty()).then_some(mounts),
                    "resources": resources,
                }],
                "volumes": (!volumes.is_empty()).then_some(volumes),
                "affinity": {"nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": node_selector,
                }},
            },
        })
    }

    /// The ReplicaSet owning the workload (one replica, selecting the workload label).
    pub fn replica_set(&self, namespace: &str) -> Result<ReplicaSet, SimError> {
        let template = self.template();
        typed(
            "replicaset",
            json!({
                "metadata": {"name": self.name, "namespace": namespace,
                    "labels": template["metadata"]["labels"]},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {WORKLOAD_LABEL: self.name}},
                    "template": template,
                },
            }),
        )
    }

    /// The pod, bound to its node (as the scheduler would), owned by `owner` if given.
    pub fn pod(&self, namespace: &str, owner: Option<OwnerReference>) -> Result<Pod, SimError> {
        let mut pod = self.template();
        let name = match owner {
            Some(_) => format!("{}-sim0", self.name),
            None => self.name.clone(),
        };
        pod["metadata"]["name"] = json!(name);
        pod["metadata"]["namespace"] = json!(namespace);
        pod["metadata"]["ownerReferences"] = json!(owner.map(|o| vec![o]));
        pod["spec"]["nodeName"] = json!(self.node);
        typed("pod", pod)
    }
}

/// The disruption a PodDisruptionBudget allows.
#[derive(Debug, Clone, PartialEq)]
pub enum DisruptionLimit {
    /// `minAvailable` (a number or a percentage like `"50%"`).
    MinAvailable(IntOrString),
    /// `maxUnavailable` (a number or a percentage).
    MaxUnavailable(IntOrString),
}

/// `object` as the typed `kind`.
pub(crate) fn typed<K: serde::de::DeserializeOwned>(
    kind: &str,
    object: Value,
) -> Result<K, SimError> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    serde_json::from_value(object).map_err(|e| SimError::Malformed {
        object: format!("{kind} {name}"),
        message: e.to_string(),
    })
}
