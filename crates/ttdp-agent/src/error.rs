//! [`ConfigError`] and [`AgentError`]: what can stop the agent from starting or running.

/// A configuration value is missing or malformed. Each message names the environment variable
/// (and flag) to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value needed in this mode is not set.
    #[error("{variable} is not set; set it (or pass {flag}) {why}")]
    Missing {
        /// The environment variable.
        variable: &'static str,
        /// The equivalent flag.
        flag: &'static str,
        /// Why it is needed.
        why: &'static str,
    },
    /// A value does not parse.
    #[error("{variable}={value:?} is invalid: {problem}")]
    Invalid {
        /// The environment variable.
        variable: &'static str,
        /// The rejected value.
        value: String,
        /// What is wrong and what is expected.
        problem: String,
    },
}

/// The agent could not start or stopped on an error it cannot retry.
///
/// Everything that can get better by itself (a build failure, holders, an API error) is retried
/// by the agent and reported instead of being returned.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The module installer could not be set up (usually: the host's `/proc` is not mounted).
    #[error("cannot set up the module installer on host root {host}: {source}")]
    Installer {
        /// The host root.
        host: String,
        /// The underlying error.
        #[source]
        source: Box<ttdp_kmod::KmodError>,
    },
    /// The reporting backend could not be set up.
    #[error("cannot set up reporting: {0}")]
    Reporting(#[from] crate::reporting::ReportError),
    /// A background task of the agent panicked or was cancelled.
    #[error("agent task {task} failed: {source}; this is a bug, please report it")]
    Task {
        /// Which task.
        task: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}
