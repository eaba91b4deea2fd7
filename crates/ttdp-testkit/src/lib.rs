//! In-process Kubernetes API server, DaemonSet stand-in and simulated Tenstorrent nodes for tests and demos.
//!
//! Not yet implemented: this crate is a placeholder until its issue lands.
#![deny(missing_docs)]
