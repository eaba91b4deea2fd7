//! Which nodes a policy manages: the user's selector AND the Node Feature Discovery label of
//! Tenstorrent devices AND no skip label, as one DaemonSet node affinity and one matcher with
//! exactly the same meaning.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use crate::names::labels;
use crate::selector::{Operator, Requirement, Selector, SelectorError};

/// The effective node selection of one policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSelection {
    /// The user's selector (`spec.nodeAffinity`), already validated.
    pub user: Selector,
    /// Whether the NFD label `feature.node.kubernetes.io/pci-1200_1e52.present=true` is required
    /// (the controller's `--require-nfd`, on by default).
    pub require_nfd: bool,
    /// Nodes left out by name (nodes another, older policy owns).
    pub excluded: BTreeSet<String>,
}

impl NodeSelection {
    /// The selection for a user selector, requiring the NFD label.
    pub fn new(user: &metav1::LabelSelector) -> Result<Self, SelectorError> {
        Ok(Self {
            user: Selector::from_label_selector(user)?,
            require_nfd: true,
            excluded: BTreeSet::new(),
        })
    }

    /// Every label requirement: the user's, then NFD present (if required), then no skip label.
    pub fn requirements(&self) -> Vec<Requirement> {
        let mut reqs = self.user.requirements.clone();
        if self.require_nfd {
            reqs.push(Requirement {
                key: labels::NFD_TENSTORRENT.to_owned(),
                operator: Operator::In,
                values: vec![labels::NFD_PRESENT.to_owned()],
            });
        }
        reqs.push(Requirement {
            key: labels::SKIP.to_owned(),
            operator: Operator::DoesNotExist,
            values: vec![],
        });
        reqs
    }

    /// Whether a node with this name and these labels is selected.
    /// The same test as [`Self::requirements`], without building them (it runs for every node
    /// at every reconcile).
    pub fn matches(&self, node_name: &str, node_labels: &BTreeMap<String, String>) -> bool {
        let label = |key: &str| node_labels.get(key).map(String::as_str);
        !self.excluded.contains(node_name)
            && self.user.matches(node_labels)
            && (!self.require_nfd || label(labels::NFD_TENSTORRENT) == Some(labels::NFD_PRESENT))
            && label(labels::SKIP).is_none()
    }

    /// The DaemonSet pod template's required node affinity: one term holding every
    /// requirement (terms are ORed, expressions within a term ANDed), plus one `metadata.name
    /// NotIn` field requirement per excluded node.
    pub fn node_affinity(&self) -> NodeAffinity {
        let match_expressions = self
            .requirements()
            .into_iter()
            .map(|r| NodeSelectorRequirement {
                key: r.key,
                operator: match r.operator {
                    Operator::In => "In",
                    Operator::NotIn => "NotIn",
                    Operator::Exists => "Exists",
                    Operator::DoesNotExist => "DoesNotExist",
                    Operator::Gt => "Gt",
                    Operator::Lt => "Lt",
                }
                .to_owned(),
                values: (!r.values.is_empty()).then_some(r.values),
            })
            .collect();
        // One requirement per excluded node: the API server accepts exactly one value in a
        // `metadata.name` field requirement, and requirements within a term are ANDed.
        let match_fields = (!self.excluded.is_empty()).then(|| {
            self.excluded
                .iter()
                .map(|node| NodeSelectorRequirement {
                    key: "metadata.name".to_owned(),
                    operator: "NotIn".to_owned(),
                    values: Some(vec![node.clone()]),
                })
                .collect()
        });
        NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(match_expressions),
                    match_fields,
                }],
            }),
            ..Default::default()
        }
    }
}

/// Evaluates a required node affinity against a node the way the scheduler does
/// (`k8s.io/component-helpers/scheduling/corev1/nodeaffinity`): no required affinity matches
/// every node, the terms are ORed, and an empty term matches nothing. Used by tests and the
/// testkit's DaemonSet stand-in to check [`NodeSelection::node_affinity`] against
/// [`NodeSelection::matches`].
pub fn affinity_matches(
    affinity: &NodeAffinity,
    node_name: &str,
    node_labels: &BTreeMap<String, String>,
) -> bool {
    let Some(required) = &affinity.required_during_scheduling_ignored_during_execution else {
        return true;
    };
    required
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, node_name, node_labels))
}

/// One node selector term: its expressions (on labels) and fields (only `metadata.name`, with
/// `In` or `NotIn`) are ANDed; an empty term matches nothing.
pub fn term_matches(
    term: &NodeSelectorTerm,
    node_name: &str,
    node_labels: &BTreeMap<String, String>,
) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, node_labels))
        && fields.iter().all(|r| {
            r.key == "metadata.name"
                && matches!(r.operator.as_str(), "In" | "NotIn")
                && operator_of(r).is_some_and(|op| op.holds(Some(node_name), values_of(r)))
        })
}

/// One node selector requirement against a label map, with [`Requirement::matches`]'s
/// semantics; an unknown operator matches nothing.
pub fn requirement_matches(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    operator_of(r).is_some_and(|op| op.holds(labels.get(&r.key).map(String::as_str), values_of(r)))
}

fn operator_of(r: &NodeSelectorRequirement) -> Option<Operator> {
    Some(match r.operator.as_str() {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Gt" => Operator::Gt,
        "Lt" => Operator::Lt,
        _ => return None,
    })
}

fn values_of(r: &NodeSelectorRequirement) -> &[String] {
    r.values.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    /// A small deterministic generator (xorshift), so the property test needs no extra crate.
    struct Gen(u64);
    impl Gen {
        fn next(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    const KEYS: [&str; 4] = ["pool", "zone", labels::NFD_TENSTORRENT, labels::SKIP];
    const VALUES: [&str; 3] = ["a", "b", "true"];

    fn random_labels(g: &mut Gen) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for k in KEYS {
            if g.next(2) == 0 {
                out.insert(k.to_string(), VALUES[g.next(3)].to_string());
            }
        }
        out
    }

    fn random_selector(g: &mut Gen) -> metav1::LabelSelector {
        let match_labels = (g.next(2) == 0).then(|| {
            (0..g.next(2) + 1)
                .map(|_| (KEYS[g.next(2)].to_string(), VALUES[g.next(2)].to_string()))
                .collect()
        });
        let ops = ["In", "NotIn", "Exists", "DoesNotExist"];
        let match_expressions = (g.next(2) == 0).then(|| {
            (0..g.next(3) + 1)
                .map(|_| {
                    let op = ops[g.next(4)];
                    let values = matches!(op, "In" | "NotIn").then(|| {
                        (0..g.next(2) + 1)
                            .map(|_| VALUES[g.next(3)].to_string())
                            .collect()
                    });
                    LabelSelectorRequirement {
                        key: KEYS[g.next(2)].to_string(),
                        operator: op.to_string(),
                        values,
                    }
                })
                .collect()
        });
        metav1::LabelSelector {
            match_labels,
            match_expressions,
        }
    }

    #[test]
    fn affinity_and_matcher_agree() {
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        let mut selected = 0;
        for _ in 0..300 {
            let mut sel = NodeSelection::new(&random_selector(&mut g)).unwrap();
            sel.require_nfd = g.next(4) != 0;
            if g.next(3) == 0 {
                sel.excluded.insert("n1".into());
            }
            let affinity = sel.node_affinity();
            for _ in 0..30 {
                let node_labels = random_labels(&mut g);
                let name = ["n1", "n2"][g.next(2)];
                let want = sel.matches(name, &node_labels);
                assert_eq!(
                    affinity_matches(&affinity, name, &node_labels),
                    want,
                    "{sel:?} on {name} {node_labels:?}"
                );
                selected += usize::from(want);
            }
        }
        // The generator must exercise both outcomes.
        assert!(selected > 100 && selected < 8000, "{selected}");
    }

    #[test]
    fn empty_selector_selects_only_tenstorrent_nodes_without_skip() {
        let sel = NodeSelection::new(&metav1::LabelSelector::default()).unwrap();
        let tt = BTreeMap::from([(labels::NFD_TENSTORRENT.to_string(), "true".to_string())]);
        assert!(sel.matches("n", &tt));
        assert!(!sel.matches("n", &BTreeMap::new()));
        let mut skipped = tt.clone();
        skipped.insert(labels::SKIP.into(), "true".into());
        assert!(!sel.matches("n", &skipped));
        let terms = sel
            .node_affinity()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        let exprs = terms[0].match_expressions.as_ref().unwrap();
        assert_eq!(exprs[0].key, labels::NFD_TENSTORRENT);
        assert_eq!(exprs[0].values.as_deref(), Some(&["true".to_string()][..]));
        assert_eq!(exprs[1].key, labels::SKIP);
        assert_eq!(exprs[1].operator, "DoesNotExist");
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.to_owned(),
            operator: op.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    #[test]
    fn each_operator_follows_kubernetes_semantics() {
        let l = BTreeMap::from([
            ("pool".to_owned(), "prod".to_owned()),
            ("cores".to_owned(), "8".to_owned()),
        ]);
        let m =
            |key: &str, op: &str, values: &[&str]| requirement_matches(&req(key, op, values), &l);
        assert!(m("pool", "In", &["prod", "dev"]));
        assert!(!m("pool", "In", &["dev"]));
        assert!(!m("zone", "In", &["a"]));
        assert!(m("pool", "NotIn", &["dev"]));
        assert!(!m("pool", "NotIn", &["prod"]));
        assert!(m("zone", "NotIn", &["a"]), "NotIn matches a missing label");
        assert!(m("pool", "Exists", &[]));
        assert!(!m("zone", "Exists", &[]));
        assert!(m("zone", "DoesNotExist", &[]));
        assert!(!m("pool", "DoesNotExist", &[]));
        assert!(m("cores", "Gt", &["4"]));
        assert!(!m("cores", "Gt", &["8"]));
        assert!(m("cores", "Lt", &["9"]));
        assert!(!m("cores", "Lt", &["8"]));
        assert!(
            !m("pool", "Gt", &["1"]),
            "Gt on a non-integer label never matches"
        );
        assert!(!m("cores", "Gt", &["1", "2"]), "Gt needs exactly one value");
        assert!(
            !m("zone", "Lt", &["100"]),
            "Lt on a missing label never matches"
        );
        assert!(!m("pool", "Bogus", &["prod"]));
    }

    #[test]
    fn terms_are_ored_empty_terms_match_nothing_and_fields_only_name_the_node() {
        let l = BTreeMap::from([("a".to_owned(), "1".to_owned())]);
        let term = |expressions: Vec<NodeSelectorRequirement>,
                    fields: Vec<NodeSelectorRequirement>| {
            NodeSelectorTerm {
                match_expressions: Some(expressions),
                match_fields: Some(fields),
            }
        };
        let affinity = |terms: Vec<NodeSelectorTerm>| NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            ..Default::default()
        };
        assert!(affinity_matches(&NodeAffinity::default(), "n1", &l));
        assert!(!affinity_matches(&affinity(vec![]), "n1", &l), "no terms");
        assert!(
            !affinity_matches(&affinity(vec![term(vec![], vec![])]), "n1", &l),
            "empty term"
        );
        let either = affinity(vec![
            term(vec![req("a", "In", &["2"])], vec![]),
            term(vec![], vec![req("metadata.name", "In", &["n1"])]),
        ]);
        assert!(affinity_matches(&either, "n1", &l));
        assert!(!affinity_matches(&either, "n2", &l));
        let by_uid = term(vec![], vec![req("metadata.uid", "In", &["n1"])]);
        assert!(
            !term_matches(&by_uid, "n1", &l),
            "only metadata.name is a node field"
        );
        let exists = term(vec![], vec![req("metadata.name", "Exists", &[])]);
        assert!(
            !term_matches(&exists, "n1", &l),
            "fields take only In and NotIn"
        );
    }
}
