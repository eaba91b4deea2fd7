//! kubectl-drain semantics (cordon with ownership, pod classification, eviction with PDB back-off) for kube-rs operators.
//!
//! Not yet implemented: this crate is a placeholder until its issue lands.
#![deny(missing_docs)]
