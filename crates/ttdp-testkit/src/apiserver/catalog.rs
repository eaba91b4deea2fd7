//! The resource types the server serves: the built-in ones the demo's programs use and the
//! custom resources of every CustomResourceDefinition stored.

use serde_json::Value;

use super::meta;
use super::store::Store;

/// One served resource at one group/version.
#[derive(Debug, Clone)]
pub struct ResourceType {
    /// API group, empty for core.
    pub group: String,
    /// API version within the group.
    pub version: String,
    /// Plural (URL) name, e.g. `pods`.
    pub plural: String,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: Vec<String>,
    /// Whether the `status` subresource exists (status writes go only through it).
    pub status_subresource: bool,
    /// Whether a CRD defines this type.
    pub custom: bool,
}

impl ResourceType {
    /// Storage key shared by every version of the same resource: `group/plural`.
    pub fn storage_key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    /// `apiVersion` string: `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        match self.group.as_str() {
            "" => self.version.clone(),
            group => format!("{group}/{}", self.version),
        }
    }

    /// `pods` or `daemonsets.apps`: how the real server names a resource in messages.
    pub fn qualified(&self) -> String {
        match self.group.as_str() {
            "" => self.plural.clone(),
            group => format!("{}.{group}", self.plural),
        }
    }

    /// Whether this is the resource `group`/`plural`.
    pub fn is(&self, group: &str, plural: &str) -> bool {
        self.group == group && self.plural == plural
    }
}

/// A built-in type: group, plural, kind, namespaced, short names, status subresource.
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    bool,
);

/// Every built-in type served, all at version v1.
#[rustfmt::skip]
const BUILTINS: &[Builtin] = &[
    ("",                     "namespaces",                "Namespace",                false, &["ns"],          true),
    ("",                     "nodes",                     "Node",                     false, &["no"],          true),
    ("",                     "pods",                      "Pod",                      true,  &["po"],          true),
    ("",                     "serviceaccounts",           "ServiceAccount",           true,  &["sa"],          false),
    ("",                     "events",                    "Event",                    true,  &[],              false),
    ("apps",                 "daemonsets",                "DaemonSet",                true,  &["ds"],          true),
    ("apps",                 "replicasets",               "ReplicaSet",               true,  &["rs"],          true),
    ("policy",               "poddisruptionbudgets",      "PodDisruptionBudget",      true,  &["pdb"],         true),
    ("coordination.k8s.io",  "leases",                    "Lease",                    true,  &[],              false),
    ("events.k8s.io",        "events",                    "Event",                    true,  &["ev"],          false),
    ("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", false, &["crd", "crds"], true),
];

/// Where CustomResourceDefinitions are stored.
const CRDS: &str = "apiextensions.k8s.io/customresourcedefinitions";

/// Every served type: the built-ins, then those of each CRD in the store (read from the CRDs
/// on each request, so a CRD's types are served from its creation to its removal).
pub fn served(store: &Store) -> Vec<ResourceType> {
    let builtins =
        BUILTINS.iter().map(
            |&(group, plural, kind, namespaced, short, status)| ResourceType {
                group: group.into(),
                version: "v1".into(),
                plural: plural.into(),
                kind: kind.into(),
                namespaced,
                short_names: short.iter().map(|s| s.to_string()).collect(),
                status_subresource: status,
                custom: false,
            },
        );
    let custom = store.list(CRDS, None).into_iter().flat_map(types_from_crd);
    builtins.chain(custom).collect()
}

/// The resource types a CRD object (as JSON) serves: one per served version. Its schema is not
/// read: custom resources are stored as sent.
pub fn types_from_crd(crd: &Value) -> Vec<ResourceType> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let spec = &crd["spec"];
    let names = &spec["names"];
    let short_names: Vec<String> = meta::items(&names["shortNames"]).map(text).collect();
    meta::items(&spec["versions"])
        .filter(|version| version["served"].as_bool() != Some(false))
        .map(|version| ResourceType {
            group: text(&spec["group"]),
            version: text(&version["name"]),
            plural: text(&names["plural"]),
            kind: text(&names["kind"]),
            namespaced: spec["scope"].as_str() != Some("Cluster"),
            short_names: short_names.clone(),
            status_subresource: version["subresources"]["status"].is_object(),
            custom: true,
        })
        .collect()
}
