//! ttdp-testkit: test and demo infrastructure for ttdp, never used by production code.
//!
//! - [`apiserver`]: an in-process Kubernetes API server on 127.0.0.1 that speaks the subset of the
//!   API ttdp uses, with the real server's semantics (watch, optimistic concurrency, patches,
//!   server-side apply, finalizers, garbage collection, eviction with PodDisruptionBudgets, CRD
//!   admission with defaults and CEL), usable from kube-rs and from the real `kubectl`.
//! - [`fault_proxy`]: a recording, fault-injecting HTTP proxy in front of a real API server, for
//!   the faults a real server cannot produce on demand.
//! - [`launcher`]: a real control plane (etcd, kube-apiserver, kube-controller-manager,
//!   kube-scheduler) started on loopback from static binaries; every end-to-end suite runs on it.
//! - [`scratch`]: one test's prefixed corner of a shared real cluster, deleted when the test ends.
//! - [`sim`]: the cluster around it: a DaemonSet controller and scheduler stand-in, and simulated
//!   Tenstorrent nodes whose "kubelet" runs pods' entrypoints against a simulated host.
#![deny(missing_docs)]

pub mod apiserver;
pub mod fault_proxy;
pub mod launcher;
pub mod scratch;
pub mod sim;
