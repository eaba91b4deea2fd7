//! Linux kernel-module status, build, cache, load, unload and holder discovery, without Kubernetes.
//!
//! Not yet implemented: this crate is a placeholder until its issue lands.
#![deny(missing_docs)]
