//! What the reflector caches keep of each watched object: only the fields the controller reads,
//! so its memory grows with the fleet by a few hundred bytes per node instead of a full Node
//! (images, conditions, managed fields) and a full agent Pod.
//!
//! Applied with `WatchStreamExt::modify` before objects reach a store. Anything the reconciler,
//! [`observe`](crate::observe) or [`node_actions`](crate::node_actions) reads from a cached object
//! must be kept here; the unit tests below pin each kept field.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Node, NodeSpec, Pod, PodSpec};
use kube::core::ObjectMeta;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::{self, labels};

/// Annotation keys of ttdp's own (`driver.tenstorrent.com/...`): the only annotations read.
fn is_ours(key: &str) -> bool {
    key.strip_prefix(names::GROUP)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Keeps a node's name, resourceVersion, labels, ttdp's annotations and `spec.unschedulable`.
/// With `require_nfd`, a node without the NFD Tenstorrent label can match no policy, so its
/// labels are dropped too (its annotations still say whether it holds a cordon of ours).
pub fn node(node: &mut Node, require_nfd: bool) {
    let meta = std::mem::take(&mut node.metadata);
    let selectable = !require_nfd
        || meta.labels.as_ref().is_some_and(|l| {
            l.get(labels::NFD_TENSTORRENT).map(String::as_str) == Some(labels::NFD_PRESENT)
        });
    node.metadata = ObjectMeta {
        name: meta.name,
        resource_version: meta.resource_version,
        labels: if selectable { meta.labels } else { None },
        annotations: meta
            .annotations
            .map(|a| a.into_iter().filter(|(k, _)| is_ours(k)).collect())
            .filter(|a: &std::collections::BTreeMap<String, String>| !a.is_empty()),
        ..ObjectMeta::default()
    };
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable);
    node.spec = unschedulable.map(|u| NodeSpec {
        unschedulable: Some(u),
        ..NodeSpec::default()
    });
    node.status = None;
}

/// Keeps what [`observe`](crate::observe) reads of an agent pod: identity, labels, ttdp's
/// annotations (template hash, agent report), deletion, node, the agent container's image, the
/// Ready condition and the agent container's status.
pub fn agent_pod(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    pod.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        labels: meta.labels,
        annotations: meta
            .annotations
            .map(|a| a.into_iter().filter(|(k, _)| is_ours(k)).collect()),
        deletion_timestamp: meta.deletion_timestamp,
        ..ObjectMeta::default()
    };
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        containers: spec
            .containers
            .into_iter()
            .take(1)
            .map(|c| Container {
                name: c.name,
                image: c.image,
                ..Container::default()
            })
            .collect(),
        ..PodSpec::default()
    });
    if let Some(status) = pod.status.as_mut() {
        let conditions = status
            .conditions
            .take()
            .map(|cs| cs.into_iter().filter(|c| c.type_ == "Ready").collect());
        let agent: Option<Vec<ContainerStatus>> = status.container_statuses.take().map(|cs| {
            cs.into_iter()
                .filter(|c| c.name == names::AGENT_CONTAINER)
                .collect()
        });
        *status = k8s_openapi::api::core::v1::PodStatus {
            conditions,
            container_statuses: agent,
            ..Default::default()
        };
    }
}

/// Drops a policy's managed fields (server-side apply records one entry per status node).
pub fn policy(policy: &mut TenstorrentDriverPolicy) {
    policy.metadata.managed_fields = None;
}

/// Drops a DaemonSet's managed fields and status (the controller compares only its identity,
/// labels, owner, generation and template hash).
pub fn daemonset(ds: &mut DaemonSet) {
    ds.metadata.managed_fields = None;
    ds.status = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, NodeStatus, PodCondition, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use serde_json::json;
    use ttdp_api::names::annotations;

    fn full_node(nfd: bool) -> Node {
        let mut labels = json!({"kubernetes.io/hostname": "n1", labels::KMD_VERSION: "2.0.0"});
        if nfd {
            labels[labels::NFD_TENSTORRENT] = json!(labels::NFD_PRESENT);
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": "n1", "uid": "u1", "resourceVersion": "7", "labels": labels,
                "annotations": {
                    annotations::CORDONED_BY: "ttdp/fleet",
                    annotations::DEPLOY_GATES: "g",
                    "node.alpha.kubernetes.io/ttl": "0",
                    "driver.tenstorrent.com.evil/x": "y",
                },
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24", "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "images": [{"names": ["a"], "sizeBytes": 1}]},
        }))
        .unwrap()
    }

    #[test]
    fn nodes_keep_labels_our_annotations_and_the_cordon() {
        let mut n = full_node(true);
        node(&mut n, true);
        assert_eq!(n.metadata.name.as_deref(), Some("n1"));
        assert_eq!(n.metadata.resource_version.as_deref(), Some("7"));
        let l = n.metadata.labels.as_ref().unwrap();
        assert_eq!(
            l.get(labels::KMD_VERSION).map(String::as_str),
            Some("2.0.0")
        );
        assert_eq!(l.len(), 3);
        let a = n.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            a.keys().map(String::as_str).collect::<Vec<_>>(),
            [annotations::CORDONED_BY, annotations::DEPLOY_GATES]
        );
        assert!(n.metadata.managed_fields.is_none() && n.metadata.uid.is_none());
        assert_eq!(
            n.spec,
            Some(NodeSpec {
                unschedulable: Some(true),
                ..Default::default()
            })
        );
        assert_eq!(n.status, None::<NodeStatus>);
    }

    #[test]
    fn nodes_no_policy_can_select_keep_only_our_annotations() {
        let mut n = full_node(false);
        node(&mut n, true);
        assert!(n.metadata.labels.is_none());
        assert_eq!(n.metadata.annotations.as_ref().unwrap().len(), 2);
        let mut n = full_node(false);
        node(&mut n, false);
        assert_eq!(
            n.metadata.labels.as_ref().unwrap().len(),
            2,
            "every node is selectable"
        );
        let mut plain: Node = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        node(&mut plain, true);
        assert_eq!((plain.metadata.annotations, plain.spec), (None, None));
    }

    #[test]
    fn agent_pods_keep_what_observation_reads() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "ttdrv-fleet-x", "namespace": "ns", "uid": "u", "resourceVersion": "3",
                "labels": {labels::POLICY: "fleet"},
                "annotations": {annotations::TEMPLATE_HASH: "h", annotations::AGENT_REPORT: "{}", "other": "x"},
                "deletionTimestamp": "2026-11-29T18:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d"}],
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "agent", "image": "img", "env": [{"name": "A", "value": "b"}]}],
                     "volumes": [{"name": "v", "hostPath": {"path": "/sys"}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                       "containerStatuses": [{"name": "agent", "image": "img", "imageID": "", "ready": false, "restartCount": 4,
                           "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "m"}}}]},
        }))
        .unwrap();
        agent_pod(&mut pod);
        let m = &pod.metadata;
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref(), m.uid.as_deref()),
            (Some("ttdrv-fleet-x"), Some("ns"), Some("u"))
        );
        assert!(m.deletion_timestamp.is_some() && m.owner_references.is_none());
        assert_eq!(m.labels.as_ref().unwrap()[labels::POLICY], "fleet");
        assert_eq!(m.annotations.as_ref().unwrap().len(), 2);
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.containers[0].image.as_deref(), Some("img"));
        assert!(spec.containers[0].env.is_none() && spec.volumes.is_none());
        let status = pod.status.as_ref().unwrap();
        assert_eq!(
            status.conditions,
            Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }])
        );
        let agent = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(agent.restart_count, 4);
        assert_eq!(
            agent.state,
            Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("CrashLoopBackOff".into()),
                    message: Some("m".into())
                }),
                ..Default::default()
            })
        );
        assert_eq!(status.phase, None::<String>);
        let _ = PodStatus::default();
    }

    #[test]
    fn policies_and_daemonsets_lose_managed_fields() {
        let mut p: TenstorrentDriverPolicy = serde_json::from_value(json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1", "kind": "TenstorrentDriverPolicy",
            "metadata": {"name": "fleet", "finalizers": [names::FINALIZER]},
            "spec": {"version": "2.0.0", "nodeAffinity": {}},
        }))
        .unwrap();
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        policy(&mut p);
        assert!(p.metadata.managed_fields.is_none());
        assert_eq!(p.metadata.finalizers.as_ref().unwrap().len(), 1);
        let mut ds = DaemonSet::default();
        ds.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        ds.status = Some(Default::default());
        daemonset(&mut ds);
        assert!(ds.metadata.managed_fields.is_none() && ds.status.is_none());
    }
}
