//! ttdp-testkit: test infrastructure for ttdp (and the demo's), never used by production code.
//!
//! - [`launcher`]: a real control plane (etcd, kube-apiserver, kube-controller-manager,
//!   kube-scheduler) started on loopback from static binaries; every end-to-end suite runs on it,
//!   or on the cluster `TTDP_TEST_KUBECONFIG` names.
//! - [`sim`]: simulated Tenstorrent nodes on that control plane: a kubelet that keeps them Ready
//!   and runs their pods' entrypoints against a simulated host (kernel, devices, holders).
//! - [`scratch`]: one test's prefixed corner of a shared cluster, deleted when the test ends.
//! - [`cluster_setup`]: what the chart and a user create before the controller runs: the CRD,
//!   the operator namespace with the agents' ServiceAccount, and the policy.
//! - [`fault_proxy`]: a recording, fault-injecting HTTP proxy in front of a real API server, for
//!   the faults a real server cannot produce on demand; [`faults`] are its rules.
//! - [`recorder`]: the fault proxy's request log.
//! - [`node_view`]: a node's state in a rollout as an observer sees it, from its upgrade record
//!   and the policy's status.
//! - [`apiserver`]: a small in-process imitation of a Kubernetes API server, kept only for the
//!   demo (crate `ttdp-programs`) when no control-plane assets are at hand. It serves what the
//!   demo uses, in JSON only, without validation, field ownership or garbage collection; it
//!   injects no faults and is not a reference for Kubernetes behaviour: the real control plane
//!   is.
#![deny(missing_docs)]

pub mod apiserver;
pub mod cluster_setup;
pub mod fault_proxy;
pub mod faults;
pub mod launcher;
pub mod node_view;
pub mod procs;
pub mod recorder;
pub mod scratch;
pub mod sim;
