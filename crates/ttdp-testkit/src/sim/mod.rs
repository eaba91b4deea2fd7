//! Simulated nodes for a real control plane: their "kubelet" runs pods' containers as child
//! processes against a simulated host; and, for the in-process imitation API server only, a
//! DaemonSet controller stand-in that also binds its pods.
//!
//! Everything here is a kube-rs client. By default it joins the real control plane of
//! [`crate::launcher::test_kubeconfig`] (or another existing cluster), where the stand-ins stay
//! off and the kubelet manages only the nodes it created; the in-process imitation is the
//! explicit opt-in of the demo's fallback
//! ([`SimClusterOptions::in_process`]). It must never be used by production code.
//!
//! - [`SimCluster`] is the entry point: nodes with simulated hosts ([`TenstorrentNode`]),
//!   workloads ([`Workload`]), PodDisruptionBudgets, cleanup.
//! - [`DaemonSetStandIn`] keeps one bound pod per eligible node of each DaemonSet, for the demo's
//!   fallback on the imitation ([`daemonset`]).
//! - [`SimKubelet`] registers nodes, keeps them alive ([`node_heartbeat`]) and runs their pods:
//!   images in the [`ImageMap`] as child processes ([`container_spec`]), all others as
//!   process-less workloads that may hold the device in the node's simulated kernel.
//!
//! Where the stand-ins are simpler than Kubernetes (each is a deliberate scope limit):
//! - DaemonSet controller: it polls instead of watching, binds pods itself (`spec.nodeName`)
//!   instead of leaving that to a scheduler, updates only as `OnDelete` does, ignores taints (the
//!   agent tolerates them all), and has no ControllerRevisions, `minReadySeconds` or back-off.
//! - Kubelet: no init containers, no liveness or startup probes, `httpGet`/`tcpSocket` readiness
//!   probes always pass and one success makes a container ready, volumes and resource limits are
//!   not enforced, env from config maps and secrets and downward-API fields other than
//!   `metadata.{name,namespace,labels[...]}` and `spec.nodeName` are left out (with a warning),
//!   and there is no taint manager (a `NoExecute` taint does not evict non-daemon pods).
//!   Container output goes to `<log dir>/<namespace>_<pod>_<container>.log`, not to the API's
//!   `log` subresource.

pub mod cluster;
mod container_runtime;
pub mod container_spec;
pub mod daemonset;
pub mod error;
pub mod eventually;
pub mod image_map;
pub mod kubelet;
pub mod node_heartbeat;
mod pod_status;
mod pod_worker;
pub mod time_scale;
pub mod workload;

pub use cluster::{
    DEFAULT_KERNEL_RELEASE, SCENARIO_LABEL, SimCluster, SimClusterOptions, SimNode, TenstorrentNode,
};
pub use daemonset::DaemonSetStandIn;
pub use error::SimError;
pub use eventually::eventually;
pub use image_map::ImageMap;
pub use kubelet::{KubeletConfig, SimKubelet};
pub use node_heartbeat::SimNodeSpec;
pub use pod_status::pod_is_ready;
pub use time_scale::TimeScale;
pub use workload::{DeviceUse, DisruptionLimit, Workload, WorkloadOwner};
