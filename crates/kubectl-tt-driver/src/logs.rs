//! `logs NODE`: the agent's log on a node. Finds the agent pod the policy's DaemonSet runs on
//! the node (pods carry the label `driver.tenstorrent.com/policy=<policy>`) and prints its log
//! through the API server (the pod's `log` subresource), like `kubectl logs`.
//!
//! Choosing the pod is pure ([`choose_pod`]); reading is in [`Connection::agent_pods_on`] and
//! [`stream`].

use std::io::Write;

use futures::AsyncReadExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams};
use ttdp_api::names::{AGENT_CONTAINER, daemonset_name, labels};

use crate::cli::LogsArgs;
use crate::connection::Connection;
use crate::error::{Error, is_not_found, root_cause};

/// An agent pod found on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentPod {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The policy of its DaemonSet (its `driver.tenstorrent.com/policy` label).
    pub policy: String,
    /// Whether it has a container named like the agent's (else the server picks the only one).
    pub has_agent_container: bool,
    /// Being deleted.
    pub terminating: bool,
    /// When it was created (RFC 3339, sorts by time).
    pub created: Option<String>,
}

impl From<&Pod> for AgentPod {
    fn from(pod: &Pod) -> Self {
        let policy = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::POLICY))
            .cloned()
            .unwrap_or_default();
        AgentPod {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            policy,
            has_agent_container: pod
                .spec
                .as_ref()
                .is_some_and(|s| s.containers.iter().any(|c| c.name == AGENT_CONTAINER)),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            created: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string()),
        }
    }
}

/// The pod whose log to print among the agent pods on `node`: the one of `policy` when given.
/// A node runs one agent pod per policy; while the DaemonSet replaces it, the new pod (not
/// being deleted, newest) is the one that matters.
pub fn choose_pod(pods: &[AgentPod], node: &str, policy: Option<&str>) -> Result<AgentPod, Error> {
    let mut candidates: Vec<&AgentPod> = pods
        .iter()
        .filter(|p| policy.is_none_or(|want| p.policy == want))
        .collect();
    let mut policies: Vec<&str> = candidates.iter().map(|p| p.policy.as_str()).collect();
    policies.sort_unstable();
    policies.dedup();
    if policies.len() > 1 {
        return Err(Error::SeveralAgentPods {
            node: node.to_owned(),
            policies: policies.join(", "),
        });
    }
    candidates.sort_by_key(|p| (!p.terminating, p.created.clone()));
    candidates
        .last()
        .map(|p| (*p).clone())
        .ok_or_else(|| Error::NoAgentPod {
            node: node.to_owned(),
            policy: policy.map(str::to_owned),
            daemonset: policy.map(daemonset_name),
        })
}

/// The log request of `args`: the agent container (when the pod has one), follow, tail,
/// previous.
pub fn log_params(args: &LogsArgs, pod: &AgentPod) -> LogParams {
    LogParams {
        container: pod.has_agent_container.then(|| AGENT_CONTAINER.to_owned()),
        follow: args.follow,
        tail_lines: args.tail,
        previous: args.previous,
        ..LogParams::default()
    }
}

impl Connection {
    /// The agent pods (any policy's, or `policy`'s) scheduled on `node`, in `-n` or every
    /// namespace.
    pub async fn agent_pods_on(
        &self,
        node: &str,
        policy: Option<&str>,
    ) -> Result<Vec<AgentPod>, Error> {
        let api: Api<Pod> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let selector = match policy {
            Some(p) => format!("{}={p}", labels::POLICY),
            None => labels::POLICY.to_owned(),
        };
        let params = ListParams::default()
            .labels(&selector)
            .fields(&format!("spec.nodeName={node}"));
        let pods = api
            .list(&params)
            .await
            .map_err(|e| Error::from_kube(e, "list", "pods", &self.server))?;
        Ok(pods.items.iter().map(AgentPod::from).collect())
    }

    /// Fails with "not found" when `node` is not a Node of the cluster (so a typo is not
    /// reported as a missing agent). Other errors (RBAC) are left to the caller's message.
    async fn node_exists(&self, node: &str) -> Result<(), Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        match api.get_metadata(node).await {
            Err(e) if is_not_found(&e) => Err(Error::NodeNotFound {
                name: node.to_owned(),
            }),
            _ => Ok(()),
        }
    }
}

/// `logs NODE`: finds the agent pod and copies its log to `out` as it arrives.
pub async fn run(conn: &Connection, args: &LogsArgs, out: &mut impl Write) -> Result<(), Error> {
    if let Some(policy) = &args.policy {
        conn.policy(policy).await?;
    }
    let pods = conn
        .agent_pods_on(&args.node, args.policy.as_deref())
        .await?;
    let pod = match choose_pod(&pods, &args.node, args.policy.as_deref()) {
        Err(Error::NoAgentPod { .. }) if pods.is_empty() => {
            conn.node_exists(&args.node).await?;
            choose_pod(&pods, &args.node, args.policy.as_deref())?
        }
        chosen => chosen?,
    };
    stream(conn, &pod, &log_params(args, &pod), out).await
}

/// Copies the log of `pod` to `out`, flushing each chunk so `--follow` is live. A reader that
/// went away (`| head`) ends it quietly.
pub async fn stream(
    conn: &Connection,
    pod: &AgentPod,
    params: &LogParams,
    out: &mut impl Write,
) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(conn.client.clone(), &pod.namespace);
    let unreadable = |e: kube::Error| match &e {
        kube::Error::Api(s) if matches!(s.code, 401 | 403) => {
            Error::from_kube(e, "get", "pods/log", &conn.server)
        }
        kube::Error::Api(s) => Error::LogUnavailable {
            pod: format!("{}/{}", pod.namespace, pod.name),
            cause: s.message.clone(),
        },
        other => Error::LogUnavailable {
            pod: format!("{}/{}", pod.namespace, pod.name),
            cause: root_cause(other),
        },
    };
    let mut log = api
        .log_stream(&pod.name, params)
        .await
        .map_err(unreadable)?;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = log
            .read(&mut chunk)
            .await
            .map_err(|e| Error::LogUnavailable {
                pod: format!("{}/{}", pod.namespace, pod.name),
                cause: e.to_string(),
            })?;
        if n == 0 {
            return Ok(());
        }
        let written = out.write_all(&chunk[..n]).and_then(|()| out.flush());
        match written {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(Error::Write(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, policy: &str, created: &str, terminating: bool) -> AgentPod {
        AgentPod {
            namespace: "ops".into(),
            name: name.into(),
            policy: policy.into(),
            has_agent_container: true,
            terminating,
            created: Some(created.into()),
        }
    }

    #[test]
    fn the_new_pod_of_the_policy_is_chosen_over_one_being_replaced() {
        let pods = [
            pod("ttdrv-fleet-new", "fleet", "2026-12-07T10:00:00Z", false),
            pod("ttdrv-fleet-old", "fleet", "2026-12-07T09:00:00Z", true),
        ];
        let chosen = choose_pod(&pods, "n1", None).unwrap();
        assert_eq!(chosen.name, "ttdrv-fleet-new");
        let chosen = choose_pod(&pods, "n1", Some("fleet")).unwrap();
        assert_eq!(chosen.name, "ttdrv-fleet-new");
    }

    #[test]
    fn several_policies_on_a_node_need_a_choice_and_none_is_explained() {
        let pods = [
            pod("ttdrv-a-1", "a", "2026-12-07T10:00:00Z", false),
            pod("ttdrv-b-1", "b", "2026-12-07T10:00:00Z", false),
        ];
        let err = choose_pod(&pods, "n1", None).unwrap_err().to_string();
        assert!(err.contains("a, b") && err.contains("--policy"), "{err}");
        assert_eq!(
            choose_pod(&pods, "n1", Some("b")).unwrap().name,
            "ttdrv-b-1"
        );
        let err = choose_pod(&pods, "n1", Some("c")).unwrap_err().to_string();
        assert!(
            err.starts_with("no agent pod of policy c on node n1")
                && err.contains("DaemonSet ttdrv-c"),
            "{err}"
        );
        let err = choose_pod(&[], "n1", None).unwrap_err().to_string();
        assert!(err.starts_with("no agent pod on node n1"), "{err}");
    }

    #[test]
    fn the_request_asks_for_the_agent_container_tail_follow_and_previous() {
        let args = LogsArgs {
            node: "n1".into(),
            policy: None,
            follow: true,
            tail: Some(20),
            previous: true,
        };
        let lp = log_params(&args, &pod("p", "a", "t", false));
        assert_eq!(lp.container.as_deref(), Some(AGENT_CONTAINER));
        assert!(lp.follow && lp.previous);
        assert_eq!(lp.tail_lines, Some(20));
        let other = AgentPod {
            has_agent_container: false,
            ..pod("p", "a", "t", false)
        };
        assert_eq!(log_params(&args, &other).container, None);
    }
}
