//! [`KubeReporter`]: labels on the agent's own Node (JSON merge patch), the report as an
//! annotation on its own Pod (JSON merge patch) and Events about the Node (`events.k8s.io/v1`).
//!
//! It also reads labels an admin set on its node ([`Reporter::node_label`]) and the controller's
//! upgrade grant on it ([`Reporter::upgrade_grant`]; the policy from its own pod's label).
//!
//! RBAC it needs: `nodes` get + patch, `pods` get + patch (its own pod), `events.k8s.io` `events`
//! create + patch.

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter as EventReporter};
use tokio::sync::OnceCell;
use ttdp_api::agent_report::AgentReport;
use ttdp_api::names::{AGENT_MANAGER, annotations, labels};

use super::{EventKind, NodeEvent, ReportError, Reporter};
use crate::grant::GrantView;
use crate::labels::NodeLabels;

/// Longest Event note the API accepts.
const MAX_NOTE_BYTES: usize = 1024;

/// The agent's own pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Its namespace (`POD_NAMESPACE`).
    pub namespace: String,
    /// Its name (`POD_NAME`).
    pub name: String,
}

/// Publishes to the Kubernetes API, only about the agent's own node and pod.
#[derive(Clone)]
pub struct KubeReporter {
    nodes: Api<Node>,
    pods: Api<Pod>,
    node_name: String,
    pod: PodRef,
    recorder: Recorder,
    node_ref: OnceCell<ObjectReference>,
    policy: OnceCell<Option<String>>,
}

impl std::fmt::Debug for KubeReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeReporter")
            .field("node_name", &self.node_name)
            .field("pod", &self.pod)
            .finish_non_exhaustive()
    }
}

impl KubeReporter {
    /// A reporter for node `node_name` and the agent pod `pod`. Makes no API call yet.
    pub fn new(client: kube::Client, node_name: &str, pod: PodRef) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            EventReporter {
                controller: AGENT_MANAGER.to_string(),
                instance: Some(pod.name.clone()),
            },
        );
        Self {
            nodes: Api::all(client.clone()),
            pods: Api::namespaced(client, &pod.namespace),
            node_name: node_name.to_string(),
            pod,
            recorder,
            node_ref: OnceCell::new(),
            policy: OnceCell::new(),
        }
    }

    fn patch_params() -> PatchParams {
        PatchParams {
            field_manager: Some(AGENT_MANAGER.to_string()),
            ..PatchParams::default()
        }
    }

    /// The Node's object reference, with its uid once the Node could be read (until then the
    /// name stands in for the uid, as the kubelet does for node Events).
    async fn node_reference(&self) -> ObjectReference {
        if let Some(reference) = self.node_ref.get() {
            return reference.clone();
        }
        match self.nodes.get(&self.node_name).await {
            Ok(node) => {
                let reference = kube::Resource::object_ref(&node, &());
                self.node_ref
                    .get_or_init(|| async { reference })
                    .await
                    .clone()
            }
            Err(e) => {
                tracing::warn!(node = %self.node_name, error = %e, "cannot read the node for its uid; the event refers to it by name");
                ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(self.node_name.clone()),
                    uid: Some(self.node_name.clone()),
                    ..ObjectReference::default()
                }
            }
        }
    }
}

impl KubeReporter {
    /// The policy whose DaemonSet made the agent's pod (its `driver.tenstorrent.com/policy`
    /// label), read once.
    async fn policy(&self) -> Result<Option<String>, ReportError> {
        self.policy
            .get_or_try_init(|| async {
                let pod =
                    self.pods
                        .get(&self.pod.name)
                        .await
                        .map_err(|source| ReportError::Kube {
                            action: "read labels of",
                            object: format!("pod {}/{}", self.pod.namespace, self.pod.name),
                            source,
                        })?;
                Ok(pod
                    .metadata
                    .labels
                    .and_then(|mut l| l.remove(labels::POLICY)))
            })
            .await
            .cloned()
    }
}

impl Reporter for KubeReporter {
    async fn patch_labels(&self, labels: &NodeLabels) -> Result<(), ReportError> {
        self.nodes
            .patch(
                &self.node_name,
                &Self::patch_params(),
                &Patch::Merge(labels.merge_patch()),
            )
            .await
            .map(drop)
            .map_err(|source| ReportError::Kube {
                action: "patch labels of",
                object: format!("node {}", self.node_name),
                source,
            })
    }

    async fn publish_report(&self, report: &AgentReport) -> Result<(), ReportError> {
        let json = serde_json::to_string(report)?;
        let patch = serde_json::json!({
            "metadata": { "annotations": { annotations::AGENT_REPORT: json } }
        });
        self.pods
            .patch(&self.pod.name, &Self::patch_params(), &Patch::Merge(patch))
            .await
            .map(drop)
            .map_err(|source| ReportError::Kube {
                action: "annotate",
                object: format!("pod {}/{}", self.pod.namespace, self.pod.name),
                source,
            })
    }

    async fn record_event(&self, event: &NodeEvent) -> Result<(), ReportError> {
        let reference = self.node_reference().await;
        let event = Event {
            type_: match event.kind {
                EventKind::Normal => EventType::Normal,
                EventKind::Warning => EventType::Warning,
            },
            reason: event.reason.clone(),
            note: Some(truncate(&event.note, MAX_NOTE_BYTES)),
            action: event.action.clone(),
            secondary: None,
        };
        self.recorder
            .publish(&event, &reference)
            .await
            .map_err(|source| ReportError::Kube {
                action: "record an event about",
                object: format!("node {}", self.node_name),
                source,
            })
    }

    async fn node_label(&self, key: &str) -> Result<Option<String>, ReportError> {
        let node = self
            .nodes
            .get(&self.node_name)
            .await
            .map_err(|source| ReportError::Kube {
                action: "read labels of",
                object: format!("node {}", self.node_name),
                source,
            })?;
        Ok(node.metadata.labels.and_then(|mut l| l.remove(key)))
    }

    async fn upgrade_grant(&self) -> Result<GrantView, ReportError> {
        let policy = self.policy().await?;
        let node = self
            .nodes
            .get(&self.node_name)
            .await
            .map_err(|source| ReportError::Kube {
                action: "read the upgrade grant of",
                object: format!("node {}", self.node_name),
                source,
            })?;
        let grant = node
            .metadata
            .annotations
            .and_then(|mut a| a.remove(annotations::UPGRADE_GRANT));
        Ok(GrantView::Node { grant, policy })
    }
}

/// `text` cut to at most `max` bytes on a character boundary, marked with `…` when cut.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("short", 10), "short");
        let cut = truncate(&"é".repeat(600), MAX_NOTE_BYTES);
        assert!(
            cut.len() <= MAX_NOTE_BYTES && cut.ends_with('…'),
            "{}",
            cut.len()
        );
    }
}
