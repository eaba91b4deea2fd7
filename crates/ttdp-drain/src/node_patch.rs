//! [`NodePatchExtras`]: labels and annotations a caller writes in the same patch as a cordon or
//! an uncordon, and [`ExtrasFor`], which decides them from the node as read.
//!
//! A controller that cordons a node often changes something else with it: labels that keep its
//! own workloads off the node, an annotation that hands the node to an agent. Written in the same
//! JSON merge patch as the cordon, under the same `resourceVersion` precondition, they change
//! together with it or not at all, and a crash between two writes cannot leave one without the
//! other.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use serde_json::{Map, Value, json};

/// Labels and annotations to set (`Some(value)`) or remove (`None`) on a node, in the same write
/// as a cordon ([`cordon_with`](crate::cordon_with)) or an uncordon
/// ([`uncordon_with`](crate::uncordon_with)).
///
/// ```
/// use ttdp_drain::NodePatchExtras;
///
/// let extras = NodePatchExtras::new()
///     .set_label("example.com/workloads", "false")
///     .remove_annotation("example.com/handed-over");
/// assert_eq!(extras.labels["example.com/workloads"].as_deref(), Some("false"));
/// assert_eq!(extras.annotations["example.com/handed-over"], None);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePatchExtras {
    /// Labels to set (`Some`) or remove (`None`), by key.
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotations to set (`Some`) or remove (`None`), by key. The cordon's own owner and time
    /// annotations ([`CordonOwner`](crate::CordonOwner)) are not extras: where a key is both,
    /// the cordon's value is written.
    pub annotations: BTreeMap<String, Option<String>>,
}

impl NodePatchExtras {
    /// No extras: the write changes only the cordon.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also set label `key` to `value`.
    pub fn set_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), Some(value.into()));
        self
    }

    /// Also remove label `key`.
    pub fn remove_label(mut self, key: impl Into<String>) -> Self {
        self.labels.insert(key.into(), None);
        self
    }

    /// Also set annotation `key` to `value`.
    pub fn set_annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), Some(value.into()));
        self
    }

    /// Also remove annotation `key`.
    pub fn remove_annotation(mut self, key: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), None);
        self
    }

    /// Whether there is nothing to change.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }

    /// Whether `node` already carries every change: each label and annotation to set has that
    /// value, each one to remove is absent. Then writing the extras would change nothing.
    pub fn applied_to(&self, node: &Node) -> bool {
        fn matches(
            have: Option<&BTreeMap<String, String>>,
            want: &BTreeMap<String, Option<String>>,
        ) -> bool {
            want.iter()
                .all(|(k, v)| have.and_then(|h| h.get(k)) == v.as_ref())
        }
        matches(node.metadata.labels.as_ref(), &self.labels)
            && matches(node.metadata.annotations.as_ref(), &self.annotations)
    }
}

/// Where [`cordon_with`](crate::cordon_with) and [`uncordon_with`](crate::uncordon_with) get
/// their extras: fixed [`NodePatchExtras`], or a function of the node as just read (asked again
/// after every write conflict), for extras that depend on what is on the node, such as "remove
/// the labels this annotation lists".
pub trait ExtrasFor {
    /// The extras to write on `node`, as just read.
    fn extras_for(&self, node: &Node) -> NodePatchExtras;
}

impl ExtrasFor for NodePatchExtras {
    fn extras_for(&self, _node: &Node) -> NodePatchExtras {
        self.clone()
    }
}

impl<F> ExtrasFor for F
where
    F: Fn(&Node) -> NodePatchExtras,
{
    fn extras_for(&self, node: &Node) -> NodePatchExtras {
        self(node)
    }
}

/// The JSON merge patch of one cordon or uncordon: the `resourceVersion` precondition, the
/// extras, the cordon's own annotations (`None` removes) written over them, and
/// `spec.unschedulable` when `unschedulable` is given (`Value::Null` removes it).
pub(crate) fn merge_patch(
    resource_version: Option<&str>,
    extras: &NodePatchExtras,
    cordon_annotations: &[(&str, Option<&str>)],
    unschedulable: Option<Value>,
) -> Value {
    fn entries<'a>(items: impl Iterator<Item = (&'a str, Option<&'a str>)>) -> Map<String, Value> {
        items
            .map(|(k, v)| (k.to_owned(), v.map_or(Value::Null, |v| json!(v))))
            .collect()
    }
    let labels = entries(
        extras
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref())),
    );
    let annotations = entries(
        extras
            .annotations
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .chain(cordon_annotations.iter().copied()),
    );
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".to_owned(), json!(resource_version));
    if !labels.is_empty() {
        metadata.insert("labels".to_owned(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        metadata.insert("annotations".to_owned(), Value::Object(annotations));
    }
    let mut patch = json!({ "metadata": metadata });
    if let Some(unschedulable) = unschedulable {
        patch["spec"] = json!({ "unschedulable": unschedulable });
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Node {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        Node {
            metadata: ObjectMeta {
                labels: map(labels),
                annotations: map(annotations),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn extras_are_applied_when_set_values_match_and_removed_keys_are_absent() {
        let extras = NodePatchExtras::new()
            .set_label("gate", "false")
            .remove_annotation("grant");
        assert!(extras.applied_to(&node(&[("gate", "false"), ("other", "x")], &[])));
        assert!(!extras.applied_to(&node(&[("gate", "true")], &[])));
        assert!(!extras.applied_to(&node(&[], &[])));
        assert!(!extras.applied_to(&node(&[("gate", "false")], &[("grant", "p/1")])));
        assert!(NodePatchExtras::new().applied_to(&node(&[], &[])));
    }

    #[test]
    fn the_patch_carries_extras_cordon_annotations_and_the_precondition_together() {
        let extras = NodePatchExtras::new()
            .set_label("gate", "false")
            .remove_label("old")
            .set_annotation("gates", "gate")
            .set_annotation("by", "not the owner");
        let patch = merge_patch(
            Some("42"),
            &extras,
            &[("by", Some("me")), ("at", None)],
            Some(json!(true)),
        );
        assert_eq!(
            patch,
            json!({
                "metadata": {
                    "resourceVersion": "42",
                    "labels": {"gate": "false", "old": null},
                    "annotations": {"gates": "gate", "by": "me", "at": null},
                },
                "spec": {"unschedulable": true},
            })
        );
    }

    #[test]
    fn without_extras_or_a_cordon_change_the_patch_names_only_what_changes() {
        let patch = merge_patch(Some("7"), &NodePatchExtras::new(), &[("by", None)], None);
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "7", "annotations": {"by": null}}})
        );
    }

    #[test]
    fn a_function_of_the_node_decides_the_extras_from_what_it_reads() {
        let reopen = |n: &Node| {
            let listed = n
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("gates"))
                .cloned()
                .unwrap_or_default();
            listed
                .split(',')
                .filter(|g| !g.is_empty())
                .fold(NodePatchExtras::new(), |e, g| e.remove_label(g))
        };
        let extras = reopen.extras_for(&node(&[], &[("gates", "a,b")]));
        assert_eq!(
            extras,
            NodePatchExtras::new().remove_label("a").remove_label("b")
        );
        assert!(reopen.extras_for(&node(&[], &[])).is_empty());
    }
}
