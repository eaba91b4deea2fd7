//! Workload pods for scenarios: pods bound to a node that may use the Tenstorrent device, owned by
//! nothing or by a ReplicaSet, and PodDisruptionBudgets over them.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, EmptyDirVolumeSource, HostPathVolumeSource, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, PodTemplateSpec, ResourceRequirements,
    Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;
use ttdp_api::names::DEVICE_PATH;

/// The image of workload containers; the kubelet maps no binary to it, so it runs no process.
pub const WORKLOAD_IMAGE: &str = "sim.invalid/tenstorrent-workload:1";
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
    /// `terminationGracePeriodSeconds`.
    pub grace_seconds: Option<i64>,
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
            grace_seconds: None,
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

    /// Sets `terminationGracePeriodSeconds`.
    pub fn grace_seconds(mut self, seconds: i64) -> Self {
        self.grace_seconds = Some(seconds);
        self
    }

    /// The pod's labels.
    pub fn pod_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.labels.clone();
        labels.insert(WORKLOAD_LABEL.to_owned(), self.name.clone());
        labels
    }

    /// The pod template: pinned to the node by a required node affinity on `metadata.name`.
    pub fn template(&self) -> PodTemplateSpec {
        let mut volumes = Vec::new();
        let mut mounts = Vec::new();
        if self.device == DeviceUse::HostPath {
            volumes.push(Volume {
                name: "tenstorrent".to_owned(),
                host_path: Some(HostPathVolumeSource {
                    path: DEVICE_PATH.to_owned(),
                    type_: None,
                }),
                ..Volume::default()
            });
            mounts.push(VolumeMount {
                name: "tenstorrent".to_owned(),
                mount_path: DEVICE_PATH.to_owned(),
                ..VolumeMount::default()
            });
        }
        if self.empty_dir {
            volumes.push(Volume {
                name: "scratch".to_owned(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
            mounts.push(VolumeMount {
                name: "scratch".to_owned(),
                mount_path: "/scratch".to_owned(),
                ..VolumeMount::default()
            });
        }
        let resources = (self.device == DeviceUse::Resource).then(|| {
            let one = BTreeMap::from([(DEVICE_RESOURCE.to_owned(), Quantity("1".to_owned()))]);
            ResourceRequirements {
                requests: Some(one.clone()),
                limits: Some(one),
                ..ResourceRequirements::default()
            }
        });
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(self.pod_labels()),
                ..ObjectMeta::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "work".to_owned(),
                    image: Some(WORKLOAD_IMAGE.to_owned()),
                    volume_mounts: (!mounts.is_empty()).then_some(mounts),
                    resources,
                    ..Container::default()
                }],
                volumes: (!volumes.is_empty()).then_some(volumes),
                termination_grace_period_seconds: self.grace_seconds,
                affinity: Some(Affinity {
                    node_affinity: Some(NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                            node_selector_terms: vec![NodeSelectorTerm {
                                match_expressions: None,
                                match_fields: Some(vec![NodeSelectorRequirement {
                                    key: "metadata.name".to_owned(),
                                    operator: "In".to_owned(),
                                    values: Some(vec![self.node.clone()]),
                                }]),
                            }],
                        }),
                        ..NodeAffinity::default()
                    }),
                    ..Affinity::default()
                }),
                ..PodSpec::default()
            }),
        }
    }

    /// The ReplicaSet owning the workload (one replica, selecting the workload label).
    pub fn replica_set(&self, namespace: &str) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(namespace.to_owned()),
                labels: Some(self.pod_labels()),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(1),
                selector: LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        WORKLOAD_LABEL.to_owned(),
                        self.name.clone(),
                    )])),
                    match_expressions: None,
                },
                template: Some(self.template()),
                min_ready_seconds: None,
            }),
            status: None,
        }
    }

    /// The pod, bound to its node (as the scheduler would), owned by `owner` if given.
    pub fn pod(&self, namespace: &str, owner: Option<OwnerReference>) -> Pod {
        let template = self.template();
        let mut spec = template.spec.unwrap_or_default();
        spec.node_name = Some(self.node.clone());
        let meta = template.metadata.unwrap_or_default();
        Pod {
            metadata: ObjectMeta {
                name: Some(if owner.is_some() {
                    format!("{}-sim0", self.name)
                } else {
                    self.name.clone()
                }),
                namespace: Some(namespace.to_owned()),
                labels: meta.labels,
                owner_references: owner.map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: None,
        }
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

/// A PodDisruptionBudget over the pods with `match_labels`.
pub fn disruption_budget(
    name: &str,
    namespace: &str,
    match_labels: BTreeMap<String, String>,
    limit: DisruptionLimit,
) -> PodDisruptionBudget {
    let (min_available, max_unavailable) = match limit {
        DisruptionLimit::MinAvailable(v) => (Some(v), None),
        DisruptionLimit::MaxUnavailable(v) => (None, Some(v)),
    };
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available,
            max_unavailable,
            selector: Some(LabelSelector {
                match_labels: Some(match_labels),
                match_expressions: None,
            }),
            unhealthy_pod_eviction_policy: None,
        }),
        status: None,
    }
}
