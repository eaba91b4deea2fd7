//! The controller process: the watches and their caches, what they changed for the reconciles
//! following the fleet, the shared context, leader election, the admin server and metrics.

pub(crate) mod context;
pub(crate) mod initial_lists;
pub mod leader;
pub mod metrics;
pub mod run;
pub mod server;
pub(crate) mod watch_changes;
