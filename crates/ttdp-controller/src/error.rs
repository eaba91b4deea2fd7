//! The controller's error type. [`Error::reason`] names the failure for metric labels, Events
//! and condition reasons.

/// What went wrong while reconciling a policy.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The policy has no uid yet, so nothing can be owned by it.
    #[error(
        "policy {policy} has no metadata.uid; it will be retried once the api server assigns one"
    )]
    MissingUid {
        /// The policy.
        policy: String,
    },
    /// Serializing an object failed (a bug).
    #[error("cannot serialize an object to json")]
    Serialize(#[source] serde_json::Error),
    /// A Kubernetes API call failed.
    #[error(
        "{action} failed; the controller retries with back-off, check api server health and rbac"
    )]
    Kube {
        /// What was being done, naming the object (e.g. `apply daemonset ns/ttdrv-fleet`).
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Cordoning or uncordoning a node failed.
    #[error("cannot {action}; the controller retries with back-off")]
    NodeAction {
        /// What was being done, naming the node.
        action: String,
        /// The drain library's error.
        #[source]
        source: Box<ttdp_drain::DrainError>,
    },
    /// The spec cannot be acted on.
    #[error("policy {policy} has an invalid spec: {source}")]
    InvalidSpec {
        /// The policy.
        policy: String,
        /// What is wrong.
        #[source]
        source: ttdp_api::driver::v1alpha1::SpecError,
    },
    /// The node or agent-pod watch has not delivered its initial list yet.
    #[error(
        "policy {policy} waits for the initial node and agent pod lists; check that the controller may list and watch nodes and pods"
    )]
    NotSynced {
        /// The policy.
        policy: String,
    },
    /// The finalizer helper failed (adding/removing the finalizer, or the apply/cleanup inside).
    #[error("finalizer handling of policy {policy} failed")]
    Finalizer {
        /// The policy.
        policy: String,
        /// The underlying error.
        #[source]
        source: Box<kube::runtime::finalizer::Error<Error>>,
    },
    /// Leader election failed.
    #[error(
        "leader election through lease {lease} failed; check rbac for coordination.k8s.io leases"
    )]
    Leader {
        /// The lease.
        lease: String,
        /// The underlying error.
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    /// The metrics/health server could not start.
    #[error("cannot serve metrics and health on {address}; choose another --metrics-address")]
    Serve {
        /// The address.
        address: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A short UpperCamelCase name of the failure (metric label, Event reason).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::MissingUid { .. } => "MissingUid",
            Error::Serialize(_) => "SerializeFailed",
            Error::Kube { .. } => "KubeApiError",
            Error::NodeAction { .. } => "NodeActionFailed",
            Error::InvalidSpec { .. } => "InvalidSpec",
            Error::NotSynced { .. } => "NotSynced",
            Error::Finalizer { .. } => "FinalizerFailed",
            Error::Leader { .. } => "LeaderElectionFailed",
            Error::Serve { .. } => "ServeFailed",
        }
    }

    /// Wraps a client error with what was being done.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }
}
