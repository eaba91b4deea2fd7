//! Which builder image each node's agent runs: the one whose GCC built the node's kernel.
//!
//! kbuild wants a module built by the compiler that built the kernel. The agent labels its node
//! with that compiler's family (`driver.tenstorrent.com/kernel-compiler=gcc-13`), and a policy
//! without `installer.image` gets one DaemonSet per family an image serves (other than the
//! default image's), each with node affinity on the label and that family's image:
//!
//! - `ttdrv-<policy>`, the default DaemonSet, runs the default image on every node no family
//!   DaemonSet takes: nodes not labelled yet (their agent labels them, then the node moves),
//!   nodes of the default image's own family, and nodes no image serves;
//! - `ttkmd-gcc<N>-<policy>` runs family `N`'s image on nodes labelled `gcc-<N>`.
//!
//! Every DaemonSet of a policy carries the same template hash (it is computed with the set of
//! images, not the one image, see `daemonset`), so a node moving from one to the other runs an
//! agent of the current template throughout: it is neither drained nor upgraded for the move,
//! and its agent finds the module it left loaded. `installer.image` keeps one DaemonSet for all.
//!
//! A node whose family no image serves waits (`UnsupportedCompiler`) instead of being cordoned
//! for a build that cannot happen, unless the policy downloads prebuilt modules.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::compiler::{
    BUILDER_GCC_LABEL, KERNEL_COMPILER_LABEL, family_daemonset_name, gcc_label_value,
};

use crate::settings::Settings;

/// The GCC majors builder images are made for when the admin names none.
pub const DERIVED_FAMILIES: [u32; 4] = [11, 12, 13, 14];

/// The image of each GCC major: `explicit` when the admin named any, else derived from the
/// default image `repository:tag` as `repository:tag-gcc<N>`. A default image without a tag
/// (a digest) derives none: every node then runs the default image.
pub fn builder_images(
    explicit: &BTreeMap<u32, String>,
    default_image: &str,
) -> BTreeMap<u32, String> {
    if !explicit.is_empty() {
        return explicit.clone();
    }
    let Some(tagged) = tagged(default_image) else {
        return BTreeMap::new();
    };
    DERIVED_FAMILIES
        .iter()
        .map(|major| (*major, format!("{tagged}-gcc{major}")))
        .collect()
}

/// `repository:tag` for an image reference, adding `:latest` when it has no tag; `None` for a
/// digest reference (`repository@sha256:...`), which cannot take a suffix.
fn tagged(image: &str) -> Option<String> {
    if image.contains('@') {
        return None;
    }
    let name_start = image.rfind('/').map_or(0, |i| i + 1);
    Some(if image[name_start..].contains(':') {
        image.to_owned()
    } else {
        format!("{image}:latest")
    })
}

/// The families that get their own DaemonSet for `policy`, with their image: none with
/// `installer.image`, else every family whose image is not the default one.
pub fn family_images(
    policy: &TenstorrentDriverPolicy,
    settings: &Settings,
) -> BTreeMap<u32, String> {
    if policy.spec.installer.image.is_some() {
        return BTreeMap::new();
    }
    settings
        .served_builder_images()
        .into_iter()
        .filter(|(_, image)| *image != settings.default_image)
        .collect()
}

/// What the template hash covers of the images: the override, else the default image and, when
/// the admin named them, every family's. A change to any of them restarts every agent of the
/// policy through the rollout, as a new default image does.
pub fn hashed_images(policy: &TenstorrentDriverPolicy, settings: &Settings) -> String {
    if let Some(image) = &policy.spec.installer.image {
        return image.clone();
    }
    let mut key = settings.default_image.clone();
    for (major, image) in &settings.builder_images {
        key.push_str(&format!(" gcc{major}={image}"));
    }
    key
}

/// The default DaemonSet turned away from the nodes a family DaemonSet takes.
pub fn leave_families(mut ds: DaemonSet, families: &BTreeMap<u32, String>) -> DaemonSet {
    if families.is_empty() {
        return ds;
    }
    let values = families.keys().map(|m| gcc_label_value(*m)).collect();
    add_requirement(&mut ds, "NotIn", values);
    ds
}

/// The default DaemonSet made into family `major`'s: its name, label, selector, image and
/// node affinity (only nodes labelled `gcc-<major>`). The template hash stays the policy's.
pub fn for_family(mut ds: DaemonSet, policy: &str, major: u32, image: &str) -> DaemonSet {
    let family = major.to_string();
    ds.metadata.name = Some(family_daemonset_name(policy, major));
    ds.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(BUILDER_GCC_LABEL.to_owned(), family.clone());
    add_requirement(&mut ds, "In", vec![gcc_label_value(major)]);
    let Some(spec) = ds.spec.as_mut() else {
        return ds;
    };
    spec.selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(BUILDER_GCC_LABEL.to_owned(), family.clone());
    spec.template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(BUILDER_GCC_LABEL.to_owned(), family);
    if let Some(pod) = spec.template.spec.as_mut() {
        for container in &mut pod.containers {
            container.image = Some(image.to_owned());
        }
    }
    ds
}

/// Adds `kernel-compiler <operator> <values>` to every required node-selector term.
fn add_requirement(ds: &mut DaemonSet, operator: &str, values: Vec<String>) {
    let terms = ds
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .and_then(|p| p.affinity.as_mut())
        .and_then(|a| a.node_affinity.as_mut())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_mut()
        });
    let Some(terms) = terms else {
        return;
    };
    for term in &mut terms.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(NodeSelectorRequirement {
                key: KERNEL_COMPILER_LABEL.to_owned(),
                operator: operator.to_owned(),
                values: Some(values.clone()),
            });
    }
}

/// Why no image can build for this node (its `kernel-compiler` label names a family no image
/// serves), with what to do; `None` when one can, when the node is not labelled yet, or when the
/// policy needs no builder of ours (`installer.image`, prebuilt modules).
pub fn unsupported_compiler(
    policy: &TenstorrentDriverPolicy,
    settings: &Settings,
    node_labels: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    let spec = &policy.spec;
    let prebuilt = spec.source.as_ref().is_some_and(|s| s.prebuilt.is_some());
    if spec.installer.image.is_some() || prebuilt {
        return None;
    }
    let family = node_labels?.get(KERNEL_COMPILER_LABEL)?;
    let served: Vec<String> = settings
        .served_builder_images()
        .keys()
        .map(|m| gcc_label_value(*m))
        .collect();
    if served.contains(family) {
        return None;
    }
    let served = if served.is_empty() {
        "none".to_owned()
    } else {
        served.join(", ")
    };
    Some(format!(
        "the node's kernel was built by {family} and no builder image serves it (served: {served}); build an agent image with that compiler and name it in the chart's driver.builderImages, set spec.installer.image to one, or use spec.source.prebuilt"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pure::daemonset::{daemonset_template_hash, desired_daemonset};
    use ttdp_api::node_selection::NodeSelection;

    const DEFAULT: &str = "registry.example:5000/tt/builder:1.2.0";

    fn policy(image: Option<&str>) -> TenstorrentDriverPolicy {
        let mut p: TenstorrentDriverPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": {"name": "fleet", "uid": "u-1"},
            "spec": {"version": "2.8.0"}
        }))
        .unwrap();
        p.spec.installer.image = image.map(str::to_owned);
        p
    }

    fn settings(explicit: &[(u32, &str)]) -> Settings {
        Settings {
            default_image: DEFAULT.to_owned(),
            builder_images: explicit
                .iter()
                .map(|(m, i)| (*m, (*i).to_owned()))
                .collect(),
            ..Settings::default()
        }
    }

    fn labels(family: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(KERNEL_COMPILER_LABEL.to_owned(), family.to_owned())])
    }

    #[test]
    fn images_are_derived_from_the_default_tag_unless_named() {
        let derived = builder_images(&BTreeMap::new(), DEFAULT);
        assert_eq!(
            derived.keys().copied().collect::<Vec<_>>(),
            DERIVED_FAMILIES
        );
        assert_eq!(derived[&13], "registry.example:5000/tt/builder:1.2.0-gcc13");
        let untagged = builder_images(&BTreeMap::new(), "registry.example:5000/tt/builder");
        assert_eq!(
            untagged[&11],
            "registry.example:5000/tt/builder:latest-gcc11"
        );
        assert!(builder_images(&BTreeMap::new(), "tt/builder@sha256:00").is_empty());
        let named = BTreeMap::from([(13, "mirror/b:13".to_owned())]);
        assert_eq!(builder_images(&named, DEFAULT), named);
    }

    #[test]
    fn each_family_gets_a_daemonset_except_the_default_images_and_with_an_override() {
        let s = settings(&[(12, DEFAULT), (13, "b:13"), (14, "b:14")]);
        assert_eq!(
            family_images(&policy(None), &s),
            BTreeMap::from([(13, "b:13".to_owned()), (14, "b:14".to_owned())])
        );
        assert!(family_images(&policy(Some("own:1")), &s).is_empty());
    }

    /// The default and a family DaemonSet of one policy: disjoint nodes, one template hash, the
    /// family's image and label; the hash follows every family's image.
    #[test]
    fn family_daemonsets_split_the_nodes_and_share_the_template_hash() {
        let p = policy(None);
        let s = settings(&[(12, DEFAULT), (13, "b:13")]);
        let sel = NodeSelection::new(&p.spec.user_selector()).unwrap();
        let base = desired_daemonset(&p, &s, &sel).unwrap();
        let families = family_images(&p, &s);
        let default = leave_families(base.clone(), &families);
        let gcc13 = for_family(base.clone(), "fleet", 13, "b:13");
        assert_eq!(gcc13.metadata.name.as_deref(), Some("ttkmd-gcc13-fleet"));
        assert_eq!(default.metadata.name.as_deref(), Some("ttdrv-fleet"));
        assert_eq!(
            daemonset_template_hash(&default),
            daemonset_template_hash(&gcc13)
        );
        let requirement = |ds: &DaemonSet| {
            let affinity = ds
                .spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .affinity
                .clone();
            let term = affinity
                .unwrap()
                .node_affinity
                .unwrap()
                .required_during_scheduling_ignored_during_execution
                .unwrap()
                .node_selector_terms[0]
                .clone();
            let r = term
                .match_expressions
                .unwrap()
                .into_iter()
                .find(|r| r.key == KERNEL_COMPILER_LABEL)
                .unwrap();
            (r.operator, r.values.unwrap())
        };
        assert_eq!(
            requirement(&default),
            ("NotIn".to_owned(), vec!["gcc-13".to_owned()])
        );
        assert_eq!(
            requirement(&gcc13),
            ("In".to_owned(), vec!["gcc-13".to_owned()])
        );
        let spec = gcc13.spec.as_ref().unwrap();
        assert_eq!(
            spec.template.spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("b:13")
        );
        let family_label = Some(&"13".to_owned());
        assert_eq!(
            spec.selector
                .match_labels
                .as_ref()
                .unwrap()
                .get(BUILDER_GCC_LABEL),
            family_label
        );
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(pod_labels.get(BUILDER_GCC_LABEL), family_label);

        let other = settings(&[(12, DEFAULT), (13, "b:13.1")]);
        assert_ne!(
            daemonset_template_hash(&desired_daemonset(&p, &other, &sel).unwrap()),
            daemonset_template_hash(&base)
        );
    }

    #[test]
    fn derived_images_keep_the_template_hash_of_one_image() {
        let p = policy(None);
        let sel = NodeSelection::new(&p.spec.user_selector()).unwrap();
        let derived = settings(&[]);
        let ds = desired_daemonset(&p, &derived, &sel).unwrap();
        assert_eq!(hashed_images(&p, &derived), DEFAULT);
        assert_eq!(hashed_images(&policy(Some("own:1")), &derived), "own:1");
        assert!(daemonset_template_hash(&ds).is_some());
    }

    #[test]
    fn a_family_no_image_serves_is_unsupported_unless_the_policy_needs_no_builder() {
        let s = settings(&[(11, "b:11"), (13, "b:13")]);
        let p = policy(None);
        assert_eq!(unsupported_compiler(&p, &s, Some(&labels("gcc-13"))), None);
        assert_eq!(unsupported_compiler(&p, &s, None), None);
        assert_eq!(unsupported_compiler(&p, &s, Some(&BTreeMap::new())), None);
        let clang = unsupported_compiler(&p, &s, Some(&labels("clang-18"))).unwrap();
        assert!(
            clang.contains("clang-18")
                && clang.contains("gcc-11, gcc-13")
                && clang.contains("driver.builderImages"),
            "{clang}"
        );
        assert!(unsupported_compiler(&p, &s, Some(&labels("gcc-9"))).is_some());
        assert_eq!(
            unsupported_compiler(&policy(Some("own:1")), &s, Some(&labels("clang-18"))),
            None
        );
        let mut prebuilt = policy(None);
        prebuilt.spec.source = serde_json::from_value(serde_json::json!({
            "prebuilt": {"url": "https://kmd.example/{version}/{kernelRelease}/tenstorrent.ko"}
        }))
        .unwrap();
        assert_eq!(
            unsupported_compiler(&prebuilt, &s, Some(&labels("clang-18"))),
            None
        );
    }
}
