//! What the controller writes besides nodes and pods, each writer with its own memory: the
//! policy's status ([`status_writer`] builds the write, [`status_view`] keeps one writer per
//! policy), the agent DaemonSet ([`agent_daemonset`]) and Events ([`events`], counted rather
//! than told one by one at fleet scale: [`event_tally`]).

pub(crate) mod agent_daemonset;
pub(crate) mod event_tally;
pub(crate) mod events;
pub(crate) mod status_view;
pub(crate) mod status_writer;
