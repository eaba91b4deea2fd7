//! `kubectl tt driver`: the kubectl plugin that shows TenstorrentDriverPolicy rollouts in one
//! view (policies × nodes, coloured by state), explains stuck nodes, and pauses, resumes and
//! retries.
//!
//! What it is for: reading policies (`status.nodes`, conditions, summary), Nodes, DaemonSets, agent
//! pods and Events, and rendering them for people ([`render`]) and scripts ([`report`]). The layers are
//! kept apart: [`cli`] parses, [`connection`] picks the cluster like kubectl, [`fetch`] and
//! [`watch`] read, [`logs`] streams an agent's log, [`fleet`] is the plain data in between,
//! [`render`] and [`report`] are pure, [`mod@run`] wires them together.
//!
//! What it must not do: change anything in the cluster except through the explicit `pause`,
//! `resume`, `retry` and `skip` subcommands ([`mutate`]), each a minimal patch.
#![deny(missing_docs)]

pub mod age;
pub mod cli;
pub mod completion;
pub mod connection;
pub mod error;
pub mod fetch;
pub mod fleet;
pub mod logs;
pub mod mutate;
pub mod palette;
pub mod render;
pub mod report;
pub mod run;
pub mod text_table;
pub mod view;
pub mod watch;

pub use cli::Cli;
pub use error::Error;
pub use run::run;
