//! What the DaemonSet controller should do next for one DaemonSet, as a pure function of what it
//! sees: which nodes need a pod, which pods must go, and the status to report.
//!
//! Mirrors `pkg/controller/daemon` (`podsShouldBeOnNode`, `updateDaemonSetStatus`), with
//! `minReadySeconds` taken as 0 and without creation back-off. Every DaemonSet is updated as
//! `OnDelete` asks, the strategy of ttdp's agent DaemonSet, the only one the demo runs: a pod of an
//! older template stays until something deletes it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use super::daemonset_pod::{REVISION_HASH_LABEL, daemon_pod_spec, template_hash};
use super::error::SimError;
use super::node_fit::pod_fits_node;

/// Everything the controller knows about one DaemonSet.
#[derive(Debug, Clone, Copy)]
pub struct DaemonSetView<'a> {
    /// The DaemonSet.
    pub ds: &'a DaemonSet,
    /// All nodes of the cluster.
    pub nodes: &'a [Arc<Node>],
    /// The pods this DaemonSet controls (owner reference with `controller: true` to its uid).
    pub pods: &'a [Arc<Pod>],
    /// Nodes where a pod creation was sent but is not yet seen.
    pub creating_on: &'a HashSet<String>,
    /// Uids of pods whose deletion was sent but is not yet seen.
    pub deleting: &'a HashSet<String>,
}

/// A pod to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodToDelete {
    /// Pod name.
    pub name: String,
    /// Pod uid (a deletion precondition).
    pub uid: String,
    /// Why, for logs.
    pub reason: &'static str,
}

/// The next actions and the status for one DaemonSet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DaemonSetPlan {
    /// The current template's revision hash.
    pub revision_hash: String,
    /// Nodes that need a new pod.
    pub create_on: Vec<String>,
    /// Pods to delete.
    pub delete: Vec<PodToDelete>,
    /// The status as observed now.
    pub status: DaemonSetStatus,
}

/// Computes the plan for one DaemonSet.
pub fn plan_daemonset(view: DaemonSetView<'_>) -> Result<DaemonSetPlan, SimError> {
    let ds = view.ds;
    let spec = ds.spec.as_ref().ok_or_else(|| SimError::Malformed {
        object: format!("DaemonSet {}", ds.name_any()),
        message: "it has no spec".to_owned(),
    })?;
    let hash = template_hash(&spec.template);
    let pod_spec = daemon_pod_spec(ds)?;

    let mut by_node: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for pod in view.pods {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        by_node.entry(node).or_default().push(pod);
    }
    let node_names: HashSet<&str> = view
        .nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();

    let mut plan = DaemonSetPlan {
        revision_hash: hash.clone(),
        ..DaemonSetPlan::default()
    };
    let mut status = DaemonSetStatus {
        observed_generation: ds.metadata.generation,
        ..DaemonSetStatus::default()
    };
    // The single pod kept on each node that should run one.
    let mut kept: Vec<&Pod> = Vec::new();

    for node in view.nodes {
        let name = node.name_any();
        let fit = pod_fits_node(&pod_spec, node);
        let mut live: Vec<&Pod> = by_node
            .get(name.as_str())
            .map(|pods| {
                pods.iter()
                    .copied()
                    .filter(|p| !is_terminating(p, view.deleting))
                    .collect()
            })
            .unwrap_or_default();
        live.sort_by_key(|p| (p.creation_timestamp().map(|t| t.0), p.name_any()));

        if fit.can_schedule {
            status.desired_number_scheduled += 1;
            let (finished, running): (Vec<&Pod>, Vec<&Pod>) =
                live.into_iter().partition(|p| is_finished(p));
            for pod in finished {
                plan.delete
                    .push(to_delete(pod, "its container exited and will not restart"));
            }
            match running.split_first() {
                None if view.creating_on.contains(&name) => {}
                None => plan.create_on.push(name),
                Some((first, extra)) => {
                    status.current_number_scheduled += 1;
                    kept.push(first);
                    for pod in extra {
                        plan.delete.push(to_delete(
                            pod,
                            "another daemon pod already runs on its node",
                        ));
                    }
                }
            }
        } else if fit.can_keep_running {
            if !live.is_empty() {
                status.number_misscheduled += 1;
            }
        } else {
            for pod in live {
                plan.delete
                    .push(to_delete(pod, "its node no longer matches the daemonset"));
            }
        }
    }
    for (node, pods) in &by_node {
        if !node_names.contains(node) {
            for pod in pods.iter().filter(|p| !is_terminating(p, view.deleting)) {
                plan.delete.push(to_delete(pod, "its node does not exist"));
            }
        }
    }

    let updated = |p: &Pod| p.labels().get(REVISION_HASH_LABEL) == Some(&hash);
    let ready = kept.iter().filter(|p| is_ready(p)).count();
    status.number_ready = count(ready);
    status.number_available = Some(count(ready));
    status.number_unavailable = Some(status.desired_number_scheduled - count(ready));
    status.updated_number_scheduled = Some(count(kept.iter().filter(|p| updated(p)).count()));

    plan.status = status;
    Ok(plan)
}

/// True when the pod's `Ready` condition is `True`.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    )
}

fn is_terminating(pod: &Pod, deleting: &HashSet<String>) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod.uid().is_some_and(|uid| deleting.contains(&uid))
}

fn to_delete(pod: &Pod, reason: &'static str) -> PodToDelete {
    PodToDelete {
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        reason,
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::daemonset_pod::render_daemon_pod;
    use k8s_openapi::api::apps::v1::{DaemonSetSpec, DaemonSetUpdateStrategy};
    use k8s_openapi::api::core::v1::{
        Container, NodeSpec, PodCondition, PodSpec, PodStatus, PodTemplateSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kube::api::ObjectMeta;

    fn ds(image: &str) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some("agent".to_owned()),
                namespace: Some("ns".to_owned()),
                uid: Some("ds-uid".to_owned()),
                generation: Some(1),
                ..ObjectMeta::default()
            },
            spec: Some(DaemonSetSpec {
                selector: LabelSelector::default(),
                template: PodTemplateSpec {
                    metadata: None,
                    spec: Some(PodSpec {
                        node_selector: Some(BTreeMap::from([("tt".to_owned(), "true".to_owned())])),
                        containers: vec![Container {
                            name: "c".to_owned(),
                            image: Some(image.to_owned()),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                update_strategy: Some(DaemonSetUpdateStrategy {
                    type_: Some("OnDelete".to_owned()),
                    rolling_update: None,
                }),
                ..DaemonSetSpec::default()
            }),
            status: None,
        }
    }

    fn node(name: &str, tt: bool) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.to_owned());
        if tt {
            n.metadata.labels = Some(BTreeMap::from([("tt".to_owned(), "true".to_owned())]));
        }
        n.spec = Some(NodeSpec::default());
        Arc::new(n)
    }

    fn pod_from(ds: &DaemonSet, node: &str, ready: bool) -> Arc<Pod> {
        let hash = template_hash(&ds.spec.as_ref().unwrap().template);
        let mut pod = render_daemon_pod(ds, node, &hash).unwrap();
        pod.metadata.name = Some(format!("agent-{node}"));
        pod.metadata.uid = Some(format!("uid-{node}"));
        pod.status = Some(PodStatus {
            phase: Some("Running".to_owned()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".to_owned(),
                status: if ready { "True" } else { "False" }.to_owned(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        Arc::new(pod)
    }

    fn plan(ds: &DaemonSet, nodes: &[Arc<Node>], pods: &[Arc<Pod>]) -> DaemonSetPlan {
        let none = HashSet::new();
        plan_daemonset(DaemonSetView {
            ds,
            nodes,
            pods,
            creating_on: &none,
            deleting: &none,
        })
        .unwrap()
    }

    #[test]
    fn creates_one_pod_per_eligible_node() {
        let d = ds("v1");
        let nodes = [node("a", true), node("b", false), node("c", true)];
        let p = plan(&d, &nodes, &[pod_from(&d, "a", true)]);
        assert_eq!(p.create_on, vec!["c".to_owned()]);
        assert!(p.delete.is_empty());
        assert_eq!(p.status.desired_number_scheduled, 2);
        assert_eq!(p.status.current_number_scheduled, 1);
        assert_eq!(p.status.number_ready, 1);
        assert_eq!(p.status.updated_number_scheduled, Some(1));
        assert_eq!(p.status.number_unavailable, Some(1));
    }

    #[test]
    fn pending_creations_are_not_repeated() {
        let d = ds("v1");
        let nodes = [node("a", true)];
        let creating = HashSet::from(["a".to_owned()]);
        let none = HashSet::new();
        let p = plan_daemonset(DaemonSetView {
            ds: &d,
            nodes: &nodes,
            pods: &[],
            creating_on: &creating,
            deleting: &none,
        })
        .unwrap();
        assert!(p.create_on.is_empty());
    }

    #[test]
    fn a_node_that_stops_matching_loses_its_pod() {
        let d = ds("v1");
        let nodes = [node("a", false)];
        let p = plan(&d, &nodes, &[pod_from(&d, "a", true)]);
        assert_eq!(p.delete.len(), 1);
        assert_eq!(p.status.desired_number_scheduled, 0);
    }

    #[test]
    fn on_delete_never_replaces_old_pods() {
        let old = ds("v1");
        let new = ds("v2");
        let nodes = [node("a", true), node("b", true)];
        let pods = [pod_from(&old, "a", true), pod_from(&old, "b", true)];
        let p = plan(&new, &nodes, &pods);
        assert!(p.delete.is_empty() && p.create_on.is_empty());
        assert_eq!(p.status.updated_number_scheduled, Some(0));
    }

    #[test]
    fn a_terminating_pod_is_replaced_at_once() {
        let d = ds("v1");
        let nodes = [node("a", true)];
        let pods = [pod_from(&d, "a", true)];
        let deleting = HashSet::from(["uid-a".to_owned()]);
        let none = HashSet::new();
        let p = plan_daemonset(DaemonSetView {
            ds: &d,
            nodes: &nodes,
            pods: &pods,
            creating_on: &none,
            deleting: &deleting,
        })
        .unwrap();
        assert_eq!(p.create_on, vec!["a".to_owned()]);
    }

    #[test]
    fn finished_and_duplicate_pods_are_removed() {
        let d = ds("v1");
        let nodes = [node("a", true)];
        let mut failed = (*pod_from(&d, "a", false)).clone();
        failed.metadata.uid = Some("failed".to_owned());
        failed.metadata.name = Some("agent-failed".to_owned());
        failed.status.as_mut().unwrap().phase = Some("Failed".to_owned());
        let mut dup = (*pod_from(&d, "a", true)).clone();
        dup.metadata.name = Some("agent-z".to_owned());
        let p = plan(
            &d,
            &nodes,
            &[Arc::new(failed), pod_from(&d, "a", true), Arc::new(dup)],
        );
        let names: Vec<_> = p.delete.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, vec!["agent-failed", "agent-z"]);
        assert!(p.create_on.is_empty());
    }
}
