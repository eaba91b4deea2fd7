//! ttdp-programs: the demo and benchmark programs of ttdp, `ttdp-demo` (`cargo xtask demo`) and
//! `ttdp-bench` (`cargo xtask bench`), and what both share: they run the real `ttdp-controller`
//! binary as a child process and follow one policy's rollout through a watch.
//!
//! - [`controller_process`]: the controller as a child process (flags, log file, memory from
//!   `/proc`, stop), never outliving the program that started it.
//! - [`rollout_watch`]: a watch on one `TenstorrentDriverPolicy` that keeps every per-node state
//!   change with the time it was seen, the latest policy and the largest status seen; and when a
//!   rollout counts as finished.
//!
//! The programs start their real control plane (`ttdp_testkit::launcher::ControlPlane`) and their
//! controller from the main thread, the one `Runtime::block_on` runs on: both die with the thread
//! that started them (`setpriv --pdeathsig`), and the threads of `spawn_blocking` end when idle.
//!
//! The simulated nodes, the control-plane launcher and the imitation API server they run on are
//! in `ttdp-testkit`. Like it, this crate is never used by production code.
#![deny(missing_docs)]

pub mod controller_process;
pub mod rollout_watch;

pub use controller_process::{ControllerProcess, Memory, log_dir};
pub use rollout_watch::{RolloutWatch, Transition};
