//! ttdp-controller: the operator that turns `TenstorrentDriverPolicy` objects into per-node tt-kmd
//! rollouts.
//!
//! What it is for: one DaemonSet `ttdrv-<policy>` per policy ([`daemonset`]), the per-node upgrade
//! state machine ([`transition`], [`rollout`]), the status ([`status`]), and the thin layer that
//! observes the cluster ([`observe`]) and writes those decisions back ([`reconcile`],
//! [`node_actions`]), with Events, metrics, an admin server and leader election.
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

pub mod agent_blocker;
pub mod args;
pub mod backoff;
pub mod cached;
pub mod context;
pub mod daemonset;
pub mod drain_tracker;
pub mod error;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod node_actions;
pub mod node_tasks;
pub mod observe;
pub mod overlap;
pub mod reconcile;
pub mod refresh;
pub mod rollout;
pub mod run;
pub mod server;
pub mod settings;
pub mod status;
pub mod transition;

pub use args::ControllerArgs;
pub use error::Error;
pub use run::{RunOptions, run};
pub use settings::Settings;
