//! The runtime around the pure core ([`crate::pure`]): watches and caches ([`run`],
//! [`context`]), one reconcile as a [`pass::Pass`], node actions and the background tasks that
//! run them, drains, the status writer, Events, metrics, the admin server and leader election.

pub(crate) mod act;
pub(crate) mod agent_daemonset;
pub(crate) mod backoff;
pub(crate) mod context;
pub(crate) mod drain_tracker;
pub(crate) mod events;
pub(crate) mod follow;
pub(crate) mod initial_lists;
pub mod leader;
pub mod metrics;
pub mod node_actions;
pub(crate) mod node_tasks;
pub(crate) mod pass;
pub(crate) mod reconcile;
pub mod run;
pub mod server;
pub(crate) mod status_view;
pub(crate) mod status_writer;
pub(crate) mod watch_changes;
