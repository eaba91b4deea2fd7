//! What can go wrong, worded the way kubectl words it: what failed, on which object, and what to
//! do next.

use std::error::Error as _;
use std::path::PathBuf;

/// An error of any plugin command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig named by `--kubeconfig` could not be used.
    #[error(
        "cannot load kubeconfig {path}: {source}; check the file or pass another with --kubeconfig"
    )]
    KubeconfigFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// `KUBECONFIG` / `~/.kube/config` could not be used with the requested context.
    #[error("cannot load the kubeconfig: {source}; check KUBECONFIG, --kubeconfig and --context")]
    Kubeconfig {
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig and not running in a cluster.
    #[error(
        "no configuration has been provided: no kubeconfig found (KUBECONFIG, ~/.kube/config) and not running inside a cluster ({source}); pass --kubeconfig or set KUBECONFIG"
    )]
    NoConfiguration {
        /// Why the in-cluster configuration failed.
        #[source]
        source: kube::config::InClusterError,
    },
    /// Building the HTTP client failed (bad TLS material in the kubeconfig, for example).
    #[error(
        "cannot build a client for the server {server}: {source}; check the kubeconfig's certificates"
    )]
    Client {
        /// The API server URL.
        server: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The API server could not be reached.
    #[error(
        "the connection to the server {server} failed: {cause} - did you specify the right host or port? check --kubeconfig and --context"
    )]
    Unreachable {
        /// The API server URL.
        server: String,
        /// The innermost cause, e.g. "Connection refused (os error 111)".
        cause: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The CRD is missing.
    #[error("the TenstorrentDriverPolicy CRD is not installed; install the chart")]
    CrdNotInstalled,
    /// The named policy does not exist.
    #[error(
        "tenstorrentdriverpolicies.driver.tenstorrent.com \"{name}\" not found; list policies with: kubectl get ttdp"
    )]
    PolicyNotFound {
        /// The policy's name.
        name: String,
    },
    /// The named node does not exist.
    #[error("nodes \"{name}\" not found; list nodes with: kubectl get nodes")]
    NodeNotFound {
        /// The node's name.
        name: String,
    },
    /// The node is not in the policy's status.
    #[error(
        "node {node} is not listed in the status of policy {policy} (it is Done or not selected); only a Failed node can be retried; see: kubectl tt driver nodes {policy}"
    )]
    NodeNotInPolicy {
        /// The policy.
        policy: String,
        /// The node.
        node: String,
    },
    /// Retry was asked for a node that has not failed.
    #[error(
        "node {node} is {state} in policy {policy}, not Failed; only a Failed node, or the canary node that halted the rollout, can be retried"
    )]
    NotFailed {
        /// The policy.
        policy: String,
        /// The node.
        node: String,
        /// Its state.
        state: String,
    },
    /// No agent pod runs on the node (of the policy, when one was named).
    #[error("{}", no_agent_pod_text(node, policy.as_deref(), daemonset.as_deref()))]
    NoAgentPod {
        /// The node.
        node: String,
        /// The policy asked for.
        policy: Option<String>,
        /// Its DaemonSet's name.
        daemonset: Option<String>,
    },
    /// Agents of several policies run on the node and none was named.
    #[error(
        "node {node} runs agent pods of several policies ({policies}); choose one with --policy"
    )]
    SeveralAgentPods {
        /// The node.
        node: String,
        /// The policies, comma-separated.
        policies: String,
    },
    /// The server could not give a pod's log (no kubelet reachable, container not started, ...).
    #[error("cannot read the log of agent pod {pod}: {cause}")]
    LogUnavailable {
        /// `namespace/name`.
        pod: String,
        /// Why, as the server or the connection said.
        cause: String,
    },
    /// RBAC denied a request.
    #[error("{message}; ask your cluster administrator for permission to {verb} {resource}")]
    Forbidden {
        /// The verb, e.g. `list`.
        verb: String,
        /// The resource, e.g. `tenstorrentdriverpolicies.driver.tenstorrent.com`.
        resource: String,
        /// The server's message.
        message: String,
    },
    /// The server rejected the credentials.
    #[error(
        "you must be logged in to the server (Unauthorized); check the credentials of your kubeconfig context"
    )]
    Unauthorized,
    /// Any other error answer from the server.
    #[error("the server could not {verb} {resource} ({reason}): {message}")]
    Server {
        /// The verb.
        verb: String,
        /// The resource.
        resource: String,
        /// The server's reason, e.g. `InternalError`.
        reason: String,
        /// The server's message.
        message: String,
    },
    /// The server's answer could not be understood.
    #[error("cannot {verb} {resource}: unexpected answer from the server: {source}")]
    Protocol {
        /// The verb.
        verb: String,
        /// The resource.
        resource: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Writing to stdout failed.
    #[error("cannot write the output: {0}")]
    Write(#[source] std::io::Error),
    /// Encoding `-o json|yaml` failed.
    #[error("cannot encode the output as {format}: {message}")]
    Encode {
        /// `json` or `yaml`.
        format: &'static str,
        /// Why.
        message: String,
    },
}

/// Why a node has no agent pod and where to look: the DaemonSet schedules one on every node
/// the policy selects, so its absence points at the selection, the node or the DaemonSet.
fn no_agent_pod_text(node: &str, policy: Option<&str>, daemonset: Option<&str>) -> String {
    match (policy, daemonset) {
        (Some(policy), Some(ds)) => format!(
            "no agent pod of policy {policy} on node {node}: the DaemonSet {ds} runs none there; check that the policy selects the node (kubectl tt driver nodes {policy}) and the DaemonSet (kubectl get ds -A | grep {ds}; kubectl describe ds -n <namespace> {ds})"
        ),
        _ => format!(
            "no agent pod on node {node}: no policy's DaemonSet (ttdrv-<policy>) runs one there; check which policy selects the node (kubectl tt driver nodes) and its DaemonSet (kubectl get ds -A | grep ttdrv-)"
        ),
    }
}

/// The innermost cause of an error chain, which usually names the real problem.
pub fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current = err;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

impl Error {
    /// Classifies a kube error from `verb` on `resource` against `server`.
    pub fn from_kube(err: kube::Error, verb: &str, resource: &str, server: &str) -> Error {
        match err {
            kube::Error::Api(status) => match status.code {
                401 => Error::Unauthorized,
                403 => Error::Forbidden {
                    verb: verb.to_owned(),
                    resource: resource.to_owned(),
                    message: status.message.clone(),
                },
                _ => Error::Server {
                    verb: verb.to_owned(),
                    resource: resource.to_owned(),
                    reason: if status.reason.is_empty() {
                        status.code.to_string()
                    } else {
                        status.reason.clone()
                    },
                    message: status.message.clone(),
                },
            },
            e @ (kube::Error::SerdeError(_) | kube::Error::FromUtf8(_)) => Error::Protocol {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                source: e,
            },
            e => Error::Unreachable {
                server: server.to_owned(),
                cause: e.source().map_or_else(|| e.to_string(), root_cause),
                source: e,
            },
        }
    }
}

/// Whether a kube error is a 404 answer.
pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404)
}

/// Whether a kube error is a 403 answer.
pub fn is_forbidden(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 403)
}
