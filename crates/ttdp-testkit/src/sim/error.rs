//! The error type of the simulated cluster.

use std::path::PathBuf;

/// Everything that can fail while running the simulated cluster.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A call to the Kubernetes API failed.
    #[error("kubernetes api call failed while trying to {action}: {source}")]
    Api {
        /// What the simulation was doing, naming the object.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Building a Kubernetes client from a kubeconfig failed.
    #[error("cannot build a kubernetes client from kubeconfig {path}: {message}; check the file")]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// An object could not be turned into the shape the simulation needs.
    #[error("object {object} is malformed: {message}")]
    Malformed {
        /// The object, as `kind namespace/name`.
        object: String,
        /// What is wrong with it.
        message: String,
    },
    /// A file of a simulated host could not be read or written.
    #[error("simulated host file {path} could not be accessed: {source}")]
    HostIo {
        /// The file.
        path: PathBuf,
        /// The operating-system error.
        #[source]
        source: std::io::Error,
    },
    /// The simulated kernel refused an operation.
    #[error("simulated kernel of node {node} failed to {action}: {message}")]
    Kernel {
        /// The node whose kernel failed.
        node: String,
        /// What was attempted.
        action: String,
        /// The kernel's message.
        message: String,
    },
    /// Waiting for a condition ran out of time.
    #[error("timed out after {seconds:.1}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long it waited.
        seconds: f64,
    },
    /// A background setup task (creating hosts, building modules) died.
    #[error("simulated cluster setup task failed: {message}")]
    Setup {
        /// What went wrong.
        message: String,
    },
    /// The test API server could not be started.
    #[error("cannot start the test api server: {message}")]
    ApiServer {
        /// What went wrong.
        message: String,
    },
}

impl SimError {
    /// Wraps a client error with what the simulation was doing.
    pub fn api(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Api {
            action: action.into(),
            source,
        }
    }
}

/// Returns true when `err` is the API's "not found" (404).
pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

/// Ok when the call succeeded or failed only with the API status `code` (404: the object is gone
/// already, 409: it exists already).
pub fn allow_status<T>(
    result: kube::Result<T>,
    code: u16,
    action: impl FnOnce() -> String,
) -> Result<(), SimError> {
    match result {
        Err(kube::Error::Api(status)) if status.code == code => Ok(()),
        Err(err) => Err(SimError::api(action(), err)),
        Ok(_) => Ok(()),
    }
}
