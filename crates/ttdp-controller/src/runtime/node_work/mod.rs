//! The writes to nodes and pods: each node's background task, its upgrade record first and then
//! its actions ([`act`], [`node_tasks`]), the guarded node patches themselves ([`node_actions`])
//! and the drains ([`drain_tracker`]).

pub(crate) mod act;
pub(crate) mod drain_tracker;
pub mod node_actions;
pub(crate) mod node_tasks;
