//! The pod the DaemonSet controller creates for one node: template, revision labels, owner
//! reference, node binding and the tolerations every DaemonSet pod gets.
//!
//! Mirrors the real controller (`pkg/controller/daemon`): pods are named `<ds>-<random>`, labelled
//! `controller-revision-hash` and `pod-template-generation`, tolerate `not-ready`/`unreachable`
//! (`NoExecute`), the pressure taints and `node.kubernetes.io/unschedulable` (`NoSchedule`, so a
//! cordoned node keeps its daemon pods), and carry a required node affinity on `metadata.name`.
//! Unlike the real controller, which lets the scheduler bind the pod, the stand-in also sets
//! `spec.nodeName` at creation (it is the scheduler too).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec,
    PodTemplateSpec, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::error::SimError;
use super::node_fit::{NO_EXECUTE, NO_SCHEDULE, UNSCHEDULABLE_TAINT_KEY};

/// Pod label holding the hash of the template revision the pod was created from.
pub const REVISION_HASH_LABEL: &str = "controller-revision-hash";
/// Pod label holding the DaemonSet generation the pod was created at.
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";

/// A stable short hash of a pod template (the stand-in's `controller-revision-hash`).
pub fn template_hash(template: &PodTemplateSpec) -> String {
    // serde_json writes maps (BTreeMap) in key order, so equal templates hash equally.
    // FNV-1a, so the value is stable across builds (pods keep their label across restarts).
    let text = serde_json::to_string(template).unwrap_or_default();
    let mut value: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        value ^= u64::from(byte);
        value = value.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // The alphabet Kubernetes uses for generated names (no vowels, no confusable digits).
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut out = String::new();
    for _ in 0..10 {
        let index = usize::try_from(value % ALPHABET.len() as u64).unwrap_or(0);
        out.push(char::from(ALPHABET[index]));
        value /= ALPHABET.len() as u64;
    }
    out
}

/// The tolerations the DaemonSet controller adds to every daemon pod.
pub fn daemon_pod_tolerations(host_network: bool) -> Vec<Toleration> {
    let exists = |key: &str, effect: &str| Toleration {
        key: Some(key.to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some(effect.to_owned()),
        ..Toleration::default()
    };
    let mut tolerations = vec![
        exists("node.kubernetes.io/not-ready", NO_EXECUTE),
        exists("node.kubernetes.io/unreachable", NO_EXECUTE),
        exists("node.kubernetes.io/disk-pressure", NO_SCHEDULE),
        exists("node.kubernetes.io/memory-pressure", NO_SCHEDULE),
        exists("node.kubernetes.io/pid-pressure", NO_SCHEDULE),
        exists(UNSCHEDULABLE_TAINT_KEY, NO_SCHEDULE),
    ];
    if host_network {
        tolerations.push(exists(
            "node.kubernetes.io/network-unavailable",
            NO_SCHEDULE,
        ));
    }
    tolerations
}

/// The template's pod spec with the daemon tolerations added (what scheduling is judged on).
pub fn daemon_pod_spec(ds: &DaemonSet) -> Result<PodSpec, SimError> {
    let mut spec = template(ds)?.spec.clone().unwrap_or_default();
    let mut tolerations = spec.tolerations.take().unwrap_or_default();
    for extra in daemon_pod_tolerations(spec.host_network.unwrap_or(false)) {
        if !tolerations
            .iter()
            .any(|t| t.key == extra.key && t.effect == extra.effect && t.operator == extra.operator)
        {
            tolerations.push(extra);
        }
    }
    spec.tolerations = Some(tolerations);
    Ok(spec)
}

/// Renders the pod for `node_name`, bound to it, owned by `ds`.
pub fn render_daemon_pod(ds: &DaemonSet, node_name: &str, hash: &str) -> Result<Pod, SimError> {
    let template = template(ds)?;
    let uid = ds
        .uid()
        .ok_or_else(|| malformed(ds, "it has no uid (was it read from the api?)"))?;
    let mut spec = daemon_pod_spec(ds)?;
    spec.node_name = Some(node_name.to_owned());
    pin_to_node(&mut spec, node_name);

    let template_meta = template.metadata.clone().unwrap_or_default();
    let mut labels: BTreeMap<String, String> = template_meta.labels.unwrap_or_default();
    labels.insert(REVISION_HASH_LABEL.to_owned(), hash.to_owned());
    labels.insert(
        TEMPLATE_GENERATION_LABEL.to_owned(),
        ds.metadata.generation.unwrap_or(1).to_string(),
    );
    Ok(Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", ds.name_any())),
            namespace: ds.namespace(),
            labels: Some(labels),
            annotations: template_meta.annotations,
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".to_owned(),
                kind: "DaemonSet".to_owned(),
                name: ds.name_any(),
                uid,
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// Replaces the required node affinity with `metadata.name In [node]`, as the real controller does.
fn pin_to_node(spec: &mut PodSpec, node_name: &str) {
    let term = NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![node_name.to_owned()]),
        }]),
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![term],
    });
}

fn template(ds: &DaemonSet) -> Result<&PodTemplateSpec, SimError> {
    ds.spec
        .as_ref()
        .map(|s| &s.template)
        .ok_or_else(|| malformed(ds, "it has no spec"))
}

fn malformed(ds: &DaemonSet, message: &str) -> SimError {
    SimError::Malformed {
        object: format!(
            "DaemonSet {}/{}",
            ds.namespace().unwrap_or_default(),
            ds.name_any()
        ),
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::node_fit::{matches_required_affinity, pod_fits_node};
    use k8s_openapi::api::apps::v1::DaemonSetSpec;
    use k8s_openapi::api::core::v1::{Container, Node, NodeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn ds() -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some("ttdrv-default".to_owned()),
                namespace: Some("ttdp".to_owned()),
                uid: Some("uid-1".to_owned()),
                generation: Some(3),
                ..ObjectMeta::default()
            },
            spec: Some(DaemonSetSpec {
                selector: LabelSelector::default(),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(BTreeMap::from([("app".to_owned(), "agent".to_owned())])),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "agent".to_owned(),
                            image: Some("ttdp-agent:dev".to_owned()),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                ..DaemonSetSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn rendered_pod_is_bound_owned_and_labelled() {
        let ds = ds();
        let hash = template_hash(&ds.spec.as_ref().unwrap().template);
        let pod = render_daemon_pod(&ds, "n1", &hash).unwrap();
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels["app"], "agent");
        assert_eq!(labels[REVISION_HASH_LABEL], hash);
        assert_eq!(labels[TEMPLATE_GENERATION_LABEL], "3");
        assert_eq!(
            pod.metadata.generate_name.as_deref(),
            Some("ttdrv-default-")
        );
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ttdp"));
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("DaemonSet", "uid-1", Some(true))
        );
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        let mut other = Node::default();
        other.metadata.name = Some("n2".to_owned());
        assert!(
            !matches_required_affinity(spec.affinity.as_ref(), &other),
            "pinned to n1 by metadata.name"
        );
    }

    #[test]
    fn daemon_pods_tolerate_a_cordon() {
        let mut node = Node::default();
        node.metadata.name = Some("n1".to_owned());
        node.spec = Some(NodeSpec {
            unschedulable: Some(true),
            ..NodeSpec::default()
        });
        let spec = daemon_pod_spec(&ds()).unwrap();
        assert!(pod_fits_node(&spec, &node).can_schedule);
    }

    #[test]
    fn the_hash_follows_the_template_only() {
        let a = ds();
        let mut b = ds();
        b.metadata.generation = Some(9);
        let hash = |d: &DaemonSet| template_hash(&d.spec.as_ref().unwrap().template);
        assert_eq!(hash(&a), hash(&b));
        assert_eq!(hash(&a).len(), 10);
        b.spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .image = Some("ttdp-agent:new".to_owned());
        assert_ne!(hash(&a), hash(&b));
    }
}
