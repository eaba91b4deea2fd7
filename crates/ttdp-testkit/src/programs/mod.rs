//! Pieces shared by the testkit's programs, `ttdp-demo` and `ttdp-bench`: both run the real
//! `ttdp-controller` binary as a child process and follow one policy's rollout through a watch.
//!
//! - [`controller_process`]: the controller as a child process (flags, log file, memory from
//!   `/proc`, stop), never outliving the program that started it.
//! - [`rollout_watch`]: a watch on one `TenstorrentDriverPolicy` that keeps every per-node state
//!   change with the time it was seen, the latest policy and the largest status seen; and when a
//!   rollout counts as finished.
//! - [`cluster_setup`]: the CRD, the operator namespace and the policy.
//!
//! The programs start their real control plane ([`crate::launcher::ControlPlane`]) and their
//! controller from the main thread, the one `Runtime::block_on` runs on: both die with the thread
//! that started them (`setpriv --pdeathsig`), and the threads of `spawn_blocking` end when idle.
//!
//! Like the rest of the testkit, this is for tests, the demo and the benchmarks only.

pub mod cluster_setup;
pub mod controller_process;
pub mod rollout_watch;

pub use controller_process::{ControllerProcess, Memory};
pub use rollout_watch::{RolloutWatch, Transition};
