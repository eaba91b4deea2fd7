//! ttdp-controller: the operator that turns `TenstorrentDriverPolicy` objects into per-node tt-kmd
//! rollouts.
//!
//! What it is for: one DaemonSet `ttdrv-<policy>` per policy ([`daemonset`]), the per-node upgrade
//! state machine ([`transition`]), the status ([`status`]), and the thin layer that observes the
//! cluster and writes those decisions back.
//!
//! What it must not do: host work. Building, loading and unloading the module is the agent's job;
//! the controller only cordons, drains, replaces agent pods and reports.
#![deny(missing_docs)]

pub mod daemonset;
pub mod error;
pub mod observe;
pub mod rollout;
pub mod settings;
pub mod status;
pub mod transition;

pub use error::Error;
pub use settings::Settings;
