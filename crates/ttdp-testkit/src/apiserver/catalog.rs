//! The resource types the server serves: the built-in ones ttdp uses and the custom resources of
//! every CustomResourceDefinition created through it.

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
    /// Singular name, e.g. `pod`.
    pub singular: String,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// Whether the `status` subresource exists (status writes go only through it).
    pub status_subresource: bool,
    /// Extra field-selector labels beyond `metadata.name` / `metadata.namespace`.
    pub field_labels: Vec<String>,
    /// The CRD's `openAPIV3Schema` for this version (None for built-ins).
    pub schema: Option<Value>,
    /// The CRD's `additionalPrinterColumns` for this version.
    pub printer_columns: Vec<Value>,
    /// Name of the CRD that defines this type (None for built-ins).
    pub crd: Option<String>,
}

impl ResourceType {
    /// Storage key shared by every version of the same resource: `group/plural`.
    /// events.k8s.io/v1 Events share the core Events' storage.
    pub fn storage_key(&self) -> String {
        if self.group == "events.k8s.io" && self.plural == "events" {
            return "/events".to_string();
        }
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

    /// Whether this is a custom resource.
    pub fn is_custom(&self) -> bool {
        self.crd.is_some()
    }
}

/// A row of [`BUILTINS`]: group, plural, kind, namespaced, short names, in kubectl's `all`
/// category, status subresource, extra field-selector labels (every built-in served is v1).
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    bool,
    bool,
    &'static [&'static str],
);

fn builtin_type(row: &Builtin) -> ResourceType {
    let (group, plural, kind, namespaced, short, all, status, field_labels) = *row;
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    ResourceType {
        group: group.into(),
        version: "v1".into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        namespaced,
        short_names: strings(short),
        categories: if all { vec!["all".into()] } else { Vec::new() },
        status_subresource: status,
        field_labels: strings(field_labels),
        schema: None,
        printer_columns: Vec::new(),
        crd: None,
    }
}

/// All served resource types.
#[derive(Debug, Clone)]
pub struct Catalog {
    types: Vec<ResourceType>,
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// Every built-in type served (all at version v1).
#[rustfmt::skip]
const BUILTINS: &[Builtin] = &[
    // group                   plural                       kind                        namespaced  short names       in all  status  field labels
    ("",                     "namespaces",                "Namespace",                false,      &["ns"],          false,  true,   &["status.phase"]),
    ("",                     "nodes",                     "Node",                     false,      &["no"],          false,  true,   &["spec.unschedulable"]),
    ("",                     "pods",                      "Pod",                      true,       &["po"],          true,   true,   POD_FIELDS),
    ("",                     "events",                    "Event",                    true,       &["ev"],          false,  false,  EVENT_FIELDS),
    ("",                     "serviceaccounts",           "ServiceAccount",           true,       &["sa"],          false,  false,  &[]),
    ("",                     "configmaps",                "ConfigMap",                true,       &["cm"],          false,  false,  &[]),
    ("",                     "secrets",                   "Secret",                   true,       &[],              false,  false,  &["type"]),
    ("apps",                 "daemonsets",                "DaemonSet",                true,       &["ds"],          true,   true,   &[]),
    ("apps",                 "deployments",               "Deployment",               true,       &["deploy"],      true,   true,   &[]),
    ("apps",                 "replicasets",               "ReplicaSet",               true,       &["rs"],          true,   true,   &[]),
    ("apps",                 "controllerrevisions",       "ControllerRevision",       true,       &[],              false,  false,  &[]),
    ("policy",               "poddisruptionbudgets",      "PodDisruptionBudget",      true,       &["pdb"],         false,  true,   &[]),
    ("coordination.k8s.io",  "leases",                    "Lease",                    true,       &[],              false,  false,  &[]),
    ("events.k8s.io",        "events",                    "Event",                    true,       &["ev"],          false,  false,  &[]),
    ("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", false,      &["crd", "crds"], false,  true,   &[]),
];

impl Catalog {
    /// The built-in types.
    pub fn builtin() -> Self {
        Self {
            types: BUILTINS.iter().map(builtin_type).collect(),
        }
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
        for t in &self.types {
            if t.group.is_empty() {
                continue;
            }
            match out.iter_mut().find(|(g, _)| *g == t.group) {
                Some((_, versions)) => {
                    if !versions.contains(&t.version) {
                        versions.push(t.version.clone());
                    }
                }
                None => out.push((t.group.clone(), vec![t.version.clone()])),
            }
        }
        out
    }
}

/// The resource types a CRD object (as JSON) serves: one per served version.
pub fn types_from_crd(crd: &Value) -> Vec<ResourceType> {
    let name = crd["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let spec = &crd["spec"];
    let names = &spec["names"];
    let group = spec["group"].as_str().unwrap_or_default().to_string();
    let plural = names["plural"].as_str().unwrap_or_default().to_string();
    let kind = names["kind"].as_str().unwrap_or_default().to_string();
    let singular = names["singular"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let mut out = Vec::new();
    for version in spec["versions"].as_array().into_iter().flatten() {
        if version["served"].as_bool() == Some(false) {
            continue;
        }
        out.push(ResourceType {
            group: group.clone(),
            version: version["name"].as_str().unwrap_or_default().to_string(),
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            namespaced,
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            status_subresource: version["subresources"]["status"].is_object(),
            field_labels: version["selectableFields"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["jsonPath"].as_str())
                .map(|p| p.trim_start_matches('.').to_string())
                .collect(),
            schema: version["schema"]["openAPIV3Schema"]
                .as_object()
                .map(|o| Value::Object(o.clone())),
            printer_columns: version["additionalPrinterColumns"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            crd: Some(name.clone()),
        });
    }
    out
}
