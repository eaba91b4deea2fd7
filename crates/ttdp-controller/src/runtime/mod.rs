//! The runtime around the pure core ([`crate::pure`]), in four parts, each owning its state:
//!
//! - [`process`]: the controller process: watches and caches ([`process::run`],
//!   [`process::context`]), leader election, the admin server and metrics;
//! - [`reconcile`]: one reconcile of a policy, a [`reconcile::pass::Pass`] that follows the
//!   fleet round after round;
//! - [`writes`]: what the controller writes besides nodes: the policy's status (one writer per
//!   policy), the agent DaemonSet and Events, each keeping its own memory;
//! - [`node_work`]: the writes to nodes and pods: each node's task (its record, then its
//!   actions), the node patches themselves and the drains.

pub mod node_work;
pub mod process;
pub(crate) mod reconcile;
pub(crate) mod writes;
