//! The pure core: functions from data to data. No client, no clock read here (the time is an
//! argument), no I/O: what a node is observed to be ([`observe`]), where it goes next
//! ([`transition`]), which nodes may start ([`rollout`]), the status that says so ([`status`]),
//! the DaemonSet that should exist ([`daemonset`]), which policy owns a shared node
//! ([`overlap`]), how a node is drained ([`drain_plan`]) and why agent pods are missing
//! ([`agent_blocker`]). [`crate::runtime`] feeds it from the caches and carries its decisions out.

pub(crate) mod agent_blocker;
pub mod agent_pod;
pub(crate) mod builder_images;
pub(crate) mod cached;
pub(crate) mod canary;
pub(crate) mod daemonset;
pub(crate) mod drain_plan;
#[cfg(test)]
mod model;
pub(crate) mod next_kernels;
pub(crate) mod node_record;
pub(crate) mod observe;
pub(crate) mod overlap;
pub(crate) mod pause;
pub(crate) mod rollout;
pub(crate) mod start_guard;
pub(crate) mod status;
pub(crate) mod transition;
