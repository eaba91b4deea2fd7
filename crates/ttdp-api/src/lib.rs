//! The TenstorrentDriverPolicy API (`driver.tenstorrent.com/v1alpha1`).
//!
//! What it is for: the CRD types with their defaults and CEL validation rules
//! ([`driver::v1alpha1`]), every label, annotation, env var and name ttdp uses ([`names`]), the
//! agent-to-controller report ([`agent_report`]), the label-selector grammar ([`selector`]), the effective node selection of a policy
//! ([`node_selection`]) and the condition helper ([`condition`]).
//!
//! What it must not do: talk to a cluster. Everything here is types and pure functions.
#![deny(missing_docs)]

pub mod agent_report;
pub mod condition;
pub mod driver;
pub mod duration;
pub mod names;
pub mod node_record;
pub mod node_selection;
pub mod size;
/// The label-selector grammar, shared with `ttdp-drain` from the `ttdp-selector` crate.
pub use ttdp_selector as selector;

pub use driver::v1alpha1::{
    NodeState, NodeStatus, TenstorrentDriverPolicy, TenstorrentDriverPolicySpec,
    TenstorrentDriverPolicyStatus,
};

/// The CRD as served, for `cargo xtask crd` and for tests and test servers that install it.
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    TenstorrentDriverPolicy::crd()
}
