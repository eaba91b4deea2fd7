//! The simulated cluster around the test API server: a DaemonSet controller and scheduler
//! stand-in, and simulated nodes whose "kubelet" runs pods' containers as child processes against a
//! simulated host.
//!
//! Everything here is a kube-rs client: the same code runs against the in-process test API server
//! and, when `TTDP_TEST_KUBECONFIG` names one, against a real cluster (where the DaemonSet stand-in
//! stays off and the kubelet manages only the nodes it created). It must never be used by
//! production code.

pub mod cluster;
mod container_runtime;
pub mod container_spec;
pub mod daemonset;
pub mod daemonset_plan;
pub mod daemonset_pod;
pub mod error;
pub mod eventually;
pub mod image_map;
pub mod kubelet;
pub mod node_fit;
pub mod node_heartbeat;
pub mod node_kernel;
mod pod_status;
mod pod_worker;
pub mod time_scale;
pub mod workload;

pub use cluster::{SCENARIO_LABEL, SimCluster, SimClusterOptions, SimNode, TenstorrentNode};
pub use daemonset::DaemonSetController;
pub use error::SimError;
pub use eventually::eventually;
pub use image_map::ImageMap;
pub use kubelet::{KubeletConfig, SimKubelet};
pub use node_heartbeat::SimNodeSpec;
pub use node_kernel::NodeKernel;
pub use time_scale::TimeScale;
pub use workload::{DeviceUse, DisruptionLimit, Workload, WorkloadOwner};
