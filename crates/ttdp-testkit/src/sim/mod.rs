//! The simulated cluster around the test API server: a DaemonSet controller and scheduler
//! stand-in, and simulated nodes whose "kubelet" runs pods' containers as child processes against a
//! simulated host.
//!
//! Everything here is a kube-rs client: the same code runs against the in-process test API server
//! and, when `TTDP_TEST_KUBECONFIG` names one, against a real cluster (where the DaemonSet stand-in
//! stays off and the kubelet manages only the nodes it created). It must never be used by
//! production code.

pub mod daemonset_plan;
pub mod daemonset_pod;
pub mod error;
pub mod node_fit;
pub mod time_scale;

pub use error::SimError;
pub use time_scale::TimeScale;
