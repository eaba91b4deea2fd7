//! The ttdp node agent: installs, upgrades and reports tt-kmd on one node.
//!
//! What it is for: the Rust replacement of the spec's pod entrypoint (steps 3 to 6 of "What
//! happens", "Mixed mode", "Node labels the operator sets"), running long in each `ttdrv-<cr>`
//! pod. [`NodeAgent`] is the node flow: host-install detection, `.ko` cache or build, swap with
//! rollback, post-load validation ([`validation`]: devices bound, an optional command), holders (wait, or force unload), tt-smi, labels, the [`AgentReport`] on its pod and
//! node Events. It is generic over the kernel ([`NodeKernel`]: real or simulated) and over where
//! it reports ([`Reporter`]: [`KubeReporter`], [`FileReporter`], [`NoReporter`]), so every flow
//! runs in tests on a temporary host root. [`probe::readiness`] is the exec readiness probe.
//! Once Ready, [`next_kernels`] prepares the target's module for every other installed kernel in
//! the background, so a boot into one of them loads it from the cache at once.
//!
//! What it must not do: cordon or drain (the controller does), touch any node but its own, change
//! anything on a host-managed (DKMS) node, unload a working module before the replacement is
//! built, leave a swap half-done on shutdown, or unload the module when it exits.
//!
//! [`AgentReport`]: ttdp_api::agent_report::AgentReport
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ttdp_agent::{AgentConfig, FileReporter, HostRoot, KmdVersion};
//! let version: KmdVersion = "2.8.0".parse()?;
//! let config = AgentConfig::new(version, "node-1", HostRoot::new("/host"));
//! let reporter = FileReporter::new("/tmp/agent-report.json", "node-1");
//! let shutdown = ttdp_agent::signals::shutdown_on_signals()?;
//! ttdp_agent::run(config, reporter, shutdown).await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod backoff;
pub mod builder_compiler;
pub mod config;
pub mod convergence;
pub mod device_check;
mod error;
pub mod grant;
pub mod labels;
pub mod next_kernels;
mod node_flow;
mod node_kernel;
pub mod prebuilt_fetch;
pub mod probe;
pub mod proxy;
pub mod reasons;
pub mod reporting;
pub mod signals;
pub mod tt_smi;
pub mod validation;

pub use config::{
    AgentConfig, KernelKind, ReportTarget, RetryPolicy, TtSmiSource, ValidationConfig,
};
pub use error::{AgentError, ConfigError};
pub use node_flow::NodeAgent;
pub use node_kernel::NodeKernel;
pub use reporting::{FileReporter, KubeReporter, NoReporter, PodRef, Reporter};
pub use ttdp_hostprobe::HostRoot;
pub use ttdp_kmod::KmdVersion;

use tokio_util::sync::CancellationToken;

/// Runs the agent for `config` with the kernel it names, publishing through `reporter`, until
/// `shutdown` is cancelled (and any swap in flight has finished).
pub async fn run<R: Reporter>(
    config: AgentConfig,
    reporter: R,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let kernel = NodeKernel::new(config.kernel, &config.host);
    NodeAgent::new(config, kernel, reporter)?
        .run(shutdown)
        .await
}
