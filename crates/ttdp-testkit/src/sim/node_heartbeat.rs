//! A simulated node's presence in the API: the Node object it registers (labels, taints,
//! capacity, addresses, system info) and the heartbeat that keeps its `Ready` condition and its
//! Lease in `kube-node-lease` fresh, so a real node lifecycle controller never taints it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference, Time};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use ttdp_kmod::SimKernel;

use super::error::{SimError, allow_status, is_conflict, is_not_found};

/// The namespace holding node leases.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// How long a node lease lasts without renewal (the kubelet's default).
const LEASE_DURATION_SECONDS: i32 = 40;

/// A node the simulated kubelet registers and serves.
#[derive(Debug, Clone)]
pub struct SimNodeSpec {
    /// Node name (unique in the cluster).
    pub name: String,
    /// Labels besides the well-known `kubernetes.io/{hostname,os,arch}`.
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// Extended resources (e.g. `tenstorrent.com/n300: 4`) besides cpu, memory and pods.
    pub extra_capacity: BTreeMap<String, Quantity>,
    /// Environment forced into every mapped container on this node, over the pod's own: the
    /// simulated host's view of itself (e.g. `TTDP_HOST_ROOT`, `TTDP_KERNEL`).
    pub env: Vec<(String, String)>,
    /// The node's simulated kernel, if workloads may hold its device.
    pub kernel: Option<SimKernel>,
}

impl SimNodeSpec {
    /// A node named `name` with no extra labels, taints, resources or kernel.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            extra_capacity: BTreeMap::new(),
            env: Vec::new(),
            kernel: None,
        }
    }
}

fn node_status(spec: &SimNodeSpec, host_ip: &str, now: Timestamp) -> NodeStatus {
    let mut capacity = BTreeMap::from([
        ("cpu".to_owned(), Quantity("8".to_owned())),
        ("memory".to_owned(), Quantity("32Gi".to_owned())),
        ("pods".to_owned(), Quantity("110".to_owned())),
        ("ephemeral-storage".to_owned(), Quantity("100Gi".to_owned())),
    ]);
    capacity.extend(spec.extra_capacity.clone());
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: None,
    };
    NodeStatus {
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".to_owned(),
                address: host_ip.to_owned(),
            },
            NodeAddress {
                type_: "Hostname".to_owned(),
                address: spec.name.clone(),
            },
        ]),
        allocatable: Some(capacity.clone()),
        capacity: Some(capacity),
        conditions: Some(vec![
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            condition(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
            ),
            condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            condition(
                "Ready",
                "True",
                "KubeletReady",
                "simulated kubelet is posting ready status",
            ),
        ]),
        node_info: Some(NodeSystemInfo {
            architecture: "amd64".to_owned(),
            boot_id: format!("sim-boot-{}", spec.name),
            container_runtime_version: "sim://0.1.0".to_owned(),
            kernel_version: "6.8.0-sim".to_owned(),
            kube_proxy_version: String::new(),
            kubelet_version: "v1.33.0-ttdp-sim".to_owned(),
            machine_id: format!("sim-machine-{}", spec.name),
            operating_system: "linux".to_owned(),
            os_image: "ttdp simulated node".to_owned(),
            swap: None,
            system_uuid: format!("sim-{}", spec.name),
        }),
        ..NodeStatus::default()
    }
}

/// Registers the node: creates it, or, if it already exists, takes it over (labels and taints
/// are set as the spec says). The first heartbeat, right after, writes its status.
pub async fn register_node(
    client: &Client,
    spec: &SimNodeSpec,
    host_ip: &str,
) -> Result<(), SimError> {
    let api: Api<Node> = Api::all(client.clone());
    let mut labels = spec.labels.clone();
    labels.insert("kubernetes.io/hostname".to_owned(), spec.name.clone());
    labels.insert("kubernetes.io/os".to_owned(), "linux".to_owned());
    labels.insert("kubernetes.io/arch".to_owned(), "amd64".to_owned());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!spec.taints.is_empty()).then(|| spec.taints.clone()),
            ..NodeSpec::default()
        }),
        status: None,
    };
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(err) if is_conflict(&err) => {
            let patch = serde_json::json!({
                "metadata": { "labels": labels },
                "spec": { "taints": spec.taints, "unschedulable": null },
            });
            api.patch(&spec.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| SimError::api(format!("take over existing node {}", spec.name), e))?;
        }
        Err(err) => return Err(SimError::api(format!("register node {}", spec.name), err)),
    }
    heartbeat(client, spec, host_ip).await
}

/// One heartbeat: the node's status (`Ready`, with a fresh `lastHeartbeatTime`) and its Lease.
pub async fn heartbeat(client: &Client, spec: &SimNodeSpec, host_ip: &str) -> Result<(), SimError> {
    let now = Timestamp::now();
    let nodes: Api<Node> = Api::all(client.clone());
    let status = node_status(spec, host_ip, now);
    let patch = serde_json::json!({ "status": status });
    let node = nodes
        .patch_status(&spec.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| SimError::api(format!("write the status of node {}", spec.name), e))?;
    renew_lease(client, &node, now).await
}

async fn renew_lease(client: &Client, node: &Node, now: Timestamp) -> Result<(), SimError> {
    let name = node.name_any();
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let patch =
        serde_json::json!({ "spec": { "renewTime": MicroTime(now), "holderIdentity": name } });
    match leases
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => return Ok(()),
        Err(err) if is_not_found(&err) => {}
        Err(err) => {
            return Err(SimError::api(
                format!("renew the lease of node {name}"),
                err,
            ));
        }
    }
    ensure_lease_namespace(client).await?;
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(NODE_LEASE_NAMESPACE.to_owned()),
            owner_references: node.uid().map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".to_owned(),
                    kind: "Node".to_owned(),
                    name: name.clone(),
                    uid,
                    controller: None,
                    block_owner_deletion: None,
                }]
            }),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.clone()),
            lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    };
    let created = leases.create(&PostParams::default(), &lease).await;
    allow_status(created, 409, || format!("create the lease of node {name}"))
}

async fn ensure_lease_namespace(client: &Client) -> Result<(), SimError> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NODE_LEASE_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let created = namespaces.create(&PostParams::default(), &ns).await;
    allow_status(created, 409, || {
        format!("create namespace {NODE_LEASE_NAMESPACE}")
    })
}
