//! Pieces shared by the testkit's programs, `ttdp-demo` and `ttdp-bench`: both run the real
//! `ttdp-controller` binary as a child process and follow one policy's rollout through a watch.
//!
//! - [`control_plane_thread`]: a real control plane started for the program and held by a thread
//!   of its own until the program stops it.
//! - [`controller_process`]: the controller as a child process (flags, log file, memory from
//!   `/proc`, stop), never outliving the program that started it.
//! - [`rollout_watch`]: a watch on one `TenstorrentDriverPolicy` that keeps every per-node state
//!   change with the time it was seen, the latest policy and the largest status seen; and when a
//!   rollout counts as finished.
//!
//! Like the rest of the testkit, this is for tests, the demo and the benchmarks only.

pub mod control_plane_thread;
pub mod controller_process;
pub mod rollout_watch;

pub use control_plane_thread::ControlPlaneThread;
pub use controller_process::{ControllerConfig, ControllerProcess, Memory};
pub use rollout_watch::{RolloutWatch, Transition};

use std::path::PathBuf;

/// Why a program's child process could not be started or read.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// The log file could not be created.
    #[error("cannot create the log {path}: {source}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The binary could not be started.
    #[error("cannot start {binary}: {source}; build it first (cargo build -p ttdp-controller)")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The process has exited.
    #[error("the controller exited ({status}); see {log}")]
    Exited {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its log file.
        log: PathBuf,
    },
    /// `/proc/<pid>/status` could not be read.
    #[error("cannot read {path}: {source}")]
    ProcStatus {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A signal handler could not be installed.
    #[error("cannot install a signal handler: {0}")]
    Signal(#[source] std::io::Error),
}
