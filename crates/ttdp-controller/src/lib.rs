//! ttdp-controller: the operator that turns `TenstorrentDriverPolicy` objects into per-node tt-kmd
//! rollouts.
//!
//! Two floors. The pure core (`src/pure/`) decides, from data to data: one DaemonSet
//! `ttdrv-<policy>` per policy, the per-node upgrade state machine, the rollout plan, the status
//! and the drain plan. The runtime (`src/runtime/`) feeds it from watches and caches and carries
//! its decisions out: the reconcile pass, node actions, drains, the status writer, Events,
//! metrics, the admin server and leader election.
//!
//! What it must not do: host work. Building, loading and unloading the module is the agent's job;
//! the controller only cordons, drains, replaces agent pods and reports.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio_util::sync::CancellationToken;
//! let client = kube::Client::try_default().await?;
//! let shutdown = CancellationToken::new();
//! ttdp_controller::run(client, ttdp_controller::Settings::default(), Default::default(), shutdown).await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod args;
pub mod error;
mod pure;
mod runtime;
pub mod settings;

pub use args::ControllerArgs;
pub use error::Error;
pub use runtime::node_work::node_actions;
pub use runtime::process::run::{RunOptions, run};
pub use runtime::process::{leader, metrics, server};
pub use settings::Settings;

/// The status builder on its own, for the benchmarks: the size of the status a fleet of any
/// size gets, computed without a cluster. Not a stable interface.
#[doc(hidden)]
pub mod status_builder {
    pub use crate::pure::status::{NodeEntries, NodeReport, PolicyFacts, build_status};
    pub use crate::pure::transition::NodeTransition;
}
