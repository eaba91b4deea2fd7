//! Whether a pod may be placed on (and may keep running on) a node: the scheduler's node-selector,
//! required node-affinity and taint/toleration predicates, as the DaemonSet controller uses them.
//!
//! Mirrors `k8s.io/component-helpers/scheduling/corev1` (`nodeaffinity`, `ToleratesTaint`) and the
//! DaemonSet controller's `NodeShouldRunDaemonPod`. A cordoned node (`spec.unschedulable: true`)
//! counts as carrying the `node.kubernetes.io/unschedulable:NoSchedule` taint even when no node
//! lifecycle controller has added it yet.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Node, PodSpec, Taint, Toleration};
use ttdp_api::node_selection::affinity_matches;

/// The taint key the node lifecycle controller puts on cordoned nodes.
pub const UNSCHEDULABLE_TAINT_KEY: &str = "node.kubernetes.io/unschedulable";
/// Taint effect: new pods are not scheduled.
pub const NO_SCHEDULE: &str = "NoSchedule";
/// Taint effect: running pods that do not tolerate it are evicted too.
pub const NO_EXECUTE: &str = "NoExecute";

/// The outcome of checking a pod against a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFit {
    /// A new pod may be placed on the node.
    pub can_schedule: bool,
    /// A pod already there may stay (only `NoExecute` taints and node selection evict).
    pub can_keep_running: bool,
}

/// Checks a pod spec against a node: `nodeSelector`, required node affinity and taints.
pub fn pod_fits_node(spec: &PodSpec, node: &Node) -> NodeFit {
    let selected = matches_node_selector(spec.node_selector.as_ref(), node)
        && matches_required_affinity(spec.affinity.as_ref(), node);
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let taints = effective_taints(node);
    let untolerated = |effect: &str| {
        taints
            .iter()
            .filter(|t| t.effect == effect)
            .any(|t| !tolerations.iter().any(|tol| tolerates_taint(tol, t)))
    };
    let no_execute_blocks = untolerated(NO_EXECUTE);
    NodeFit {
        can_schedule: selected && !no_execute_blocks && !untolerated(NO_SCHEDULE),
        can_keep_running: selected && !no_execute_blocks,
    }
}

/// The node's taints, plus `node.kubernetes.io/unschedulable:NoSchedule` when it is cordoned.
pub fn effective_taints(node: &Node) -> Vec<Taint> {
    let spec = node.spec.as_ref();
    let mut taints = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    if cordoned
        && !taints
            .iter()
            .any(|t| t.key == UNSCHEDULABLE_TAINT_KEY && t.effect == NO_SCHEDULE)
    {
        taints.push(Taint {
            key: UNSCHEDULABLE_TAINT_KEY.to_owned(),
            effect: NO_SCHEDULE.to_owned(),
            ..Taint::default()
        });
    }
    taints
}

/// `ToleratesTaint`: effect (empty tolerates all), key (empty with `Exists` tolerates all keys),
/// and operator `Exists` or `Equal` (the default) on the value.
pub fn tolerates_taint(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            // An empty key is only valid with Exists.
            !key.is_empty()
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// `spec.nodeSelector`: every pair must be a label of the node.
pub fn matches_node_selector(selector: Option<&BTreeMap<String, String>>, node: &Node) -> bool {
    let labels = node_labels(node);
    selector
        .map(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)))
        .unwrap_or(true)
}

/// Required node affinity, with the scheduler's semantics
/// ([`ttdp_api::node_selection::affinity_matches`]).
pub fn matches_required_affinity(affinity: Option<&Affinity>, node: &Node) -> bool {
    affinity
        .and_then(|a| a.node_affinity.as_ref())
        .is_none_or(|na| {
            affinity_matches(
                na,
                node.metadata.name.as_deref().unwrap_or_default(),
                node_labels(node),
            )
        })
}

fn node_labels(node: &Node) -> &BTreeMap<String, String> {
    static NONE: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.labels.as_ref().unwrap_or(&NONE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, NodeSpec,
    };
    use kube::api::ObjectMeta;

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.to_owned(),
            operator: op.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn affinity(terms: Vec<Vec<NodeSelectorRequirement>>) -> Affinity {
        Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms
                        .into_iter()
                        .map(|e| NodeSelectorTerm {
                            match_expressions: Some(e),
                            match_fields: None,
                        })
                        .collect(),
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        node("n", pairs).metadata.labels.unwrap_or_default()
    }

    #[test]
    fn terms_are_ored_and_expressions_anded() {
        let n = node("n1", &[("a", "1"), ("b", "2")]);
        let both = affinity(vec![vec![req("a", "In", &["1"]), req("b", "In", &["3"])]]);
        assert!(!matches_required_affinity(Some(&both), &n));
        let either = affinity(vec![
            vec![req("b", "In", &["3"])],
            vec![req("a", "Exists", &[])],
        ]);
        assert!(matches_required_affinity(Some(&either), &n));
        assert!(
            !matches_required_affinity(Some(&affinity(vec![])), &n),
            "no terms matches nothing"
        );
        assert!(
            !matches_required_affinity(Some(&affinity(vec![vec![]])), &n),
            "an empty term matches nothing"
        );
        assert!(matches_required_affinity(None, &n));
    }

    #[test]
    fn node_selector_needs_every_pair() {
        let n = node("n", &[("a", "1"), ("b", "2")]);
        let sel = |pairs: &[(&str, &str)]| labels(pairs);
        assert!(matches_node_selector(Some(&sel(&[("a", "1")])), &n));
        assert!(!matches_node_selector(
            Some(&sel(&[("a", "1"), ("c", "3")])),
            &n
        ));
        assert!(matches_node_selector(None, &n));
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
            time_added: None,
        }
    }

    fn tol(
        key: Option<&str>,
        op: Option<&str>,
        value: Option<&str>,
        effect: Option<&str>,
    ) -> Toleration {
        Toleration {
            key: key.map(str::to_owned),
            operator: op.map(str::to_owned),
            value: value.map(str::to_owned),
            effect: effect.map(str::to_owned),
            toleration_seconds: None,
        }
    }

    #[test]
    fn tolerations_match_key_value_and_effect() {
        let t = taint("dedicated", Some("tt"), NO_SCHEDULE);
        assert!(tolerates_taint(
            &tol(Some("dedicated"), None, Some("tt"), None),
            &t
        ));
        assert!(tolerates_taint(
            &tol(
                Some("dedicated"),
                Some("Equal"),
                Some("tt"),
                Some(NO_SCHEDULE)
            ),
            &t
        ));
        assert!(!tolerates_taint(
            &tol(Some("dedicated"), None, Some("other"), None),
            &t
        ));
        assert!(!tolerates_taint(
            &tol(Some("dedicated"), None, Some("tt"), Some(NO_EXECUTE)),
            &t
        ));
        assert!(tolerates_taint(
            &tol(Some("dedicated"), Some("Exists"), None, None),
            &t
        ));
        assert!(
            tolerates_taint(&tol(None, Some("Exists"), None, None), &t),
            "empty key + Exists tolerates everything"
        );
        assert!(
            !tolerates_taint(&tol(None, None, Some("tt"), None), &t),
            "empty key needs Exists"
        );
        assert!(!tolerates_taint(
            &tol(Some("other"), Some("Exists"), None, None),
            &t
        ));
    }

    fn pod_spec(tolerations: Vec<Toleration>) -> PodSpec {
        PodSpec {
            tolerations: Some(tolerations),
            ..PodSpec::default()
        }
    }

    #[test]
    fn taints_block_scheduling_and_no_execute_also_running() {
        let mut n = node("n", &[]);
        n.spec = Some(NodeSpec {
            taints: Some(vec![taint("gpu", None, NO_SCHEDULE)]),
            ..NodeSpec::default()
        });
        let fit = pod_fits_node(&pod_spec(vec![]), &n);
        assert_eq!(
            fit,
            NodeFit {
                can_schedule: false,
                can_keep_running: true
            }
        );
        let fit = pod_fits_node(
            &pod_spec(vec![tol(Some("gpu"), Some("Exists"), None, None)]),
            &n,
        );
        assert_eq!(
            fit,
            NodeFit {
                can_schedule: true,
                can_keep_running: true
            }
        );

        n.spec = Some(NodeSpec {
            taints: Some(vec![
                taint("broken", Some("yes"), NO_EXECUTE),
                taint("soft", None, "PreferNoSchedule"),
            ]),
            ..NodeSpec::default()
        });
        let fit = pod_fits_node(&pod_spec(vec![]), &n);
        assert_eq!(
            fit,
            NodeFit {
                can_schedule: false,
                can_keep_running: false
            }
        );
        let fit = pod_fits_node(
            &pod_spec(vec![tol(
                Some("broken"),
                None,
                Some("yes"),
                Some(NO_EXECUTE),
            )]),
            &n,
        );
        assert_eq!(
            fit,
            NodeFit {
                can_schedule: true,
                can_keep_running: true
            },
            "PreferNoSchedule never blocks"
        );
    }

    #[test]
    fn a_cordoned_node_behaves_as_tainted_unschedulable() {
        let mut n = node("n", &[]);
        n.spec = Some(NodeSpec {
            unschedulable: Some(true),
            ..NodeSpec::default()
        });
        assert_eq!(effective_taints(&n).len(), 1);
        let fit = pod_fits_node(&pod_spec(vec![]), &n);
        assert_eq!(
            fit,
            NodeFit {
                can_schedule: false,
                can_keep_running: true
            }
        );
        let daemon = tol(
            Some(UNSCHEDULABLE_TAINT_KEY),
            Some("Exists"),
            None,
            Some(NO_SCHEDULE),
        );
        assert!(pod_fits_node(&pod_spec(vec![daemon]), &n).can_schedule);
        // The lifecycle controller's taint is not duplicated.
        n.spec = Some(NodeSpec {
            unschedulable: Some(true),
            taints: Some(vec![taint(UNSCHEDULABLE_TAINT_KEY, None, NO_SCHEDULE)]),
            ..NodeSpec::default()
        });
        assert_eq!(effective_taints(&n).len(), 1);
    }

    #[test]
    fn node_selection_failure_evicts_running_pods() {
        let n = node("n", &[("driver.tenstorrent.com/skip", "true")]);
        let spec = PodSpec {
            affinity: Some(affinity(vec![vec![req(
                "driver.tenstorrent.com/skip",
                "DoesNotExist",
                &[],
            )]])),
            ..PodSpec::default()
        };
        assert_eq!(
            pod_fits_node(&spec, &n),
            NodeFit {
                can_schedule: false,
                can_keep_running: false
            }
        );
    }
}
