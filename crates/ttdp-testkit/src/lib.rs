//! ttdp-testkit: test and demo infrastructure for ttdp, never used by production code.
//!
//! - [`apiserver`]: an in-process Kubernetes API server on 127.0.0.1 that speaks the subset of the
//!   API ttdp uses, with the real server's semantics (watch, optimistic concurrency, patches,
//!   server-side apply, finalizers, garbage collection, eviction with PodDisruptionBudgets, CRD
//!   admission with defaults and CEL), usable from kube-rs and from the real `kubectl`.
//! - [`sim`]: the cluster around it: a DaemonSet controller and scheduler stand-in, and simulated
//!   Tenstorrent nodes whose "kubelet" runs pods' entrypoints against a simulated host.
#![deny(missing_docs)]

pub mod apiserver;
pub mod sim;
