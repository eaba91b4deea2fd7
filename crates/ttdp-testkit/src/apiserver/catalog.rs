//! The resource types the server serves: the built-in ones the demo's programs use and the
//! custom resources of every CustomResourceDefinition created through it.

use serde_json::Value;

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
    /// Name of the CRD that defines this type (None for built-ins).
    pub crd: Option<String>,
}

impl ResourceType {
    /// Storage key shared by every version of the same resource: `group/plural`.
    pub fn storage_key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    /// `apiVersion` string: `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `daemonsets.apps`: how the real server names a resource in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
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

/// All served resource types.
#[derive(Debug, Clone)]
pub struct Catalog {
    types: Vec<ResourceType>,
}

impl Catalog {
    /// The built-in types.
    pub fn builtin() -> Self {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        let types = BUILTINS
            .iter()
            .map(
                |&(group, plural, kind, namespaced, short, status)| ResourceType {
                    group: group.into(),
                    version: "v1".into(),
                    plural: plural.into(),
                    kind: kind.into(),
                    namespaced,
                    short_names: strings(short),
                    status_subresource: status,
                    crd: None,
                },
            )
            .collect();
        Self { types }
    }

    /// Every served type.
    pub fn all(&self) -> &[ResourceType] {
        &self.types
    }

    /// The type served at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
    }

    /// Whether the group/version is served at all.
    pub fn has_group_version(&self, group: &str, version: &str) -> bool {
        self.types
            .iter()
            .any(|t| t.group == group && t.version == version)
    }

    /// Replace the types defined by CRD `crd_name` with `types` (empty to remove).
    pub fn set_crd_types(&mut self, crd_name: &str, types: Vec<ResourceType>) {
        self.types.retain(|t| t.crd.as_deref() != Some(crd_name));
        self.types.extend(types);
    }

    /// Served groups in a stable order (core excluded), each with its versions.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for t in self.types.iter().filter(|t| !t.group.is_empty()) {
            match out.iter_mut().find(|(g, _)| *g == t.group) {
                Some((_, versions)) if !versions.contains(&t.version) => {
                    versions.push(t.version.clone())
                }
                Some(_) => {}
                None => out.push((t.group.clone(), vec![t.version.clone()])),
            }
        }
        out
    }
}

/// The resource types a CRD object (as JSON) serves: one per served version. Its schema is not
/// read: custom resources are stored as sent.
pub fn types_from_crd(crd: &Value) -> Vec<ResourceType> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let spec = &crd["spec"];
    let names = &spec["names"];
    let short_names = names["shortNames"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect::<Vec<_>>();
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|version| version["served"].as_bool() != Some(false))
        .map(|version| ResourceType {
            group: text(&spec["group"]),
            version: text(&version["name"]),
            plural: text(&names["plural"]),
            kind: text(&names["kind"]),
            namespaced: spec["scope"].as_str() != Some("Cluster"),
            short_names: short_names.clone(),
            status_subresource: version["subresources"]["status"].is_object(),
            crd: Some(text(&crd["metadata"]["name"])),
        })
        .collect()
}
