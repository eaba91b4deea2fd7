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
    /// The API server refused (or could not be asked) to apply a policy's DaemonSet.
    #[error("apply daemonset {daemonset} failed; the controller retries with back-off")]
    ApplyDaemonSet {
        /// `namespace/name` of the DaemonSet.
        daemonset: String,
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
    /// The policy's status, which had to be written before acting, was not.
    #[error(
        "cannot write the status of policy {policy}: {message}; the controller retries with back-off"
    )]
    StatusNotWritten {
        /// The policy.
        policy: String,
        /// Why the write failed.
        message: String,
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
            Error::ApplyDaemonSet { .. } => "DaemonSetApplyFailed",
            Error::NodeAction { .. } => "NodeActionFailed",
            Error::StatusNotWritten { .. } => "StatusWriteFailed",
            Error::InvalidSpec { .. } => "InvalidSpec",
            Error::NotSynced { .. } => "NotSynced",
            Error::Finalizer { .. } => "FinalizerFailed",
            Error::Leader { .. } => "LeaderElectionFailed",
            Error::Serve { .. } => "ServeFailed",
        }
    }

    /// What failed, for a condition or an Event: what was being done and, for an API error,
    /// the API server's own message (HTTP code and reason), then what happens next.
    pub fn user_message(&self) -> String {
        let (action, source) = match self {
            Error::Kube { action, source } => (action.clone(), source),
            Error::ApplyDaemonSet { daemonset, source } => {
                (format!("apply daemonset {daemonset}"), source)
            }
            other => return error_chain(other),
        };
        format!(
            "{action} failed: {}; the controller retries with back-off",
            kube_message(source)
        )
    }

    /// Wraps a client error with what was being done.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }
}

/// A client error as the API server put it: its message, HTTP code and reason.
pub fn kube_message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => {
            format!(
                "{} (HTTP {} {})",
                status.message, status.code, status.reason
            )
        }
        other => error_chain(other),
    }
}

/// The error and its sources, skipping sources whose text is already included.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            message: message.to_owned(),
            reason: "Invalid".to_owned(),
            code: 422,
            ..kube::core::Status::default()
        }))
    }

    #[test]
    fn an_api_refusal_reaches_the_user_in_the_servers_words() {
        let err = Error::ApplyDaemonSet {
            daemonset: "ttdp-system/ttdrv-fleet".into(),
            source: refused(
                "DaemonSet.apps \"ttdrv-fleet\" is invalid: spec.template.spec.containers[0].image: Invalid value",
            ),
        };
        assert_eq!(err.reason(), "DaemonSetApplyFailed");
        assert_eq!(
            err.user_message(),
            "apply daemonset ttdp-system/ttdrv-fleet failed: DaemonSet.apps \"ttdrv-fleet\" is invalid: spec.template.spec.containers[0].image: Invalid value (HTTP 422 Invalid); the controller retries with back-off"
        );
        let other = Error::kube("get policy fleet", refused("boom"));
        assert!(
            other
                .user_message()
                .starts_with("get policy fleet failed: boom (HTTP 422")
        );
        let uid = Error::MissingUid {
            policy: "fleet".into(),
        };
        assert_eq!(uid.user_message(), uid.to_string());
    }
}
