//! A simulated node's presence in the API: the Node object it registers (labels, taints,
//! capacity, addresses, system info) and the heartbeat that keeps its `Ready` condition and its
//! Lease in `kube-node-lease` fresh, so a real node lifecycle controller never taints it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use ttdp_kmod::SimKernel;

use super::error::{SimError, allow_status, is_not_found};
use super::workload::typed;

/// The namespace holding node leases.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// How long a node lease lasts without renewal (the kubelet's default).
const LEASE_DURATION_SECONDS: i32 = 40;

/// A node the simulated kubelet registers and serves.
#[derive(Debug, Clone, Default)]
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
            ..Self::default()
        }
    }
}

fn node_status(spec: &SimNodeSpec, host_ip: &str, now: Timestamp) -> Value {
    let mut capacity =
        json!({"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    for (resource, quantity) in &spec.extra_capacity {
        capacity[resource] = json!(quantity);
    }
    let conditions = [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
        ("Ready", "KubeletReady"),
    ]
    .map(|(type_, reason)| {
        let status = if type_ == "Ready" { "True" } else { "False" };
        json!({"type": type_, "status": status, "reason": reason, "message": "simulated kubelet",
            "lastHeartbeatTime": Time(now)})
    });
    let name = &spec.name;
    json!({
        "addresses": [
            {"type": "InternalIP", "address": host_ip},
            {"type": "Hostname", "address": name},
        ],
        "allocatable": capacity,
        "capacity": capacity,
        "conditions": conditions,
        "nodeInfo": {
            "architecture": "amd64",
            "bootID": format!("sim-boot-{name}"),
            "containerRuntimeVersion": "sim://0.1.0",
            "kernelVersion": "6.8.0-sim",
            "kubeProxyVersion": "",
            "kubeletVersion": "v1.33.0-ttdp-sim",
            "machineID": format!("sim-machine-{name}"),
            "operatingSystem": "linux",
            "osImage": "ttdp simulated node",
            "systemUUID": format!("sim-{name}"),
        },
    })
}

/// Creates namespace `name` unless it exists.
pub(crate) async fn ensure_namespace(client: &Client, name: &str) -> Result<(), SimError> {
    let namespace = typed("namespace", json!({"metadata": {"name": name}}))?;
    let created = (Api::<Namespace>::all(client.clone()))
        .create(&PostParams::default(), &namespace)
        .await;
    allow_status(created, 409, || format!("create namespace {name}"))
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
    let taints = (!spec.taints.is_empty()).then_some(&spec.taints);
    let node =
        json!({"metadata": {"name": spec.name, "labels": labels}, "spec": {"taints": taints}});
    match api
        .create(&PostParams::default(), &typed("node", node)?)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let patch = json!({
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
    let patch = json!({ "status": node_status(spec, host_ip, now) });
    let node = nodes
        .patch_status(&spec.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| SimError::api(format!("write the status of node {}", spec.name), e))?;
    renew_lease(client, &node, now).await
}

async fn renew_lease(client: &Client, node: &Node, now: Timestamp) -> Result<(), SimError> {
    let name = node.name_any();
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let patch = json!({ "spec": { "renewTime": MicroTime(now), "holderIdentity": name } });
    let renewed = leases
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    if !matches!(&renewed, Err(err) if is_not_found(err)) {
        let action = || format!("renew the lease of node {name}");
        return renewed.map(drop).map_err(|e| SimError::api(action(), e));
    }
    ensure_namespace(client, NODE_LEASE_NAMESPACE).await?;
    let owner = node
        .uid()
        .map(|uid| json!([{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]));
    let lease = json!({
        "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE, "ownerReferences": owner},
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": MicroTime(now),
        },
    });
    let created = leases
        .create(&PostParams::default(), &typed("lease", lease)?)
        .await;
    allow_status(created, 409, || format!("create the lease of node {name}"))
}
