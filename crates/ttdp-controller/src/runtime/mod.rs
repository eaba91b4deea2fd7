//! The runtime around the pure core ([`crate::pure`]): watches and caches ([`run`]), the
//! reconcile pass ([`reconcile`]), node actions and the background tasks that run them, drains,
//! the status writer, Events, metrics, the admin server and leader election.

pub(crate) mod backoff;
pub(crate) mod context;
pub(crate) mod drain_tracker;
pub(crate) mod events;
pub mod leader;
pub mod metrics;
pub mod node_actions;
pub(crate) mod node_tasks;
pub(crate) mod reconcile;
pub(crate) mod refresh;
pub mod run;
pub mod server;
