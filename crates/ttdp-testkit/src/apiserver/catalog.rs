//! The resource types the server serves: the built-in ones ttdp uses and the custom resources of
//! every CustomResourceDefinition created through it.

use std::sync::Arc;

use kube::core::cel::{CompiledSchema, compile_schema};
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
    /// The CRD's schema for this version (None for built-ins); shared, as every request clones
    /// its resource type.
    pub schema: Option<Arc<CrdSchema>>,
    /// The CRD's `additionalPrinterColumns` for this version.
    pub printer_columns: Vec<Value>,
    /// Name of the CRD that defines this type (None for built-ins).
    pub crd: Option<String>,
}

/// A custom resource version's `openAPIV3Schema`, with its `x-kubernetes-validations` rules
/// compiled once (the API server also compiles them when the CRD is written, not per request).
#[derive(Debug)]
pub struct CrdSchema {
    /// The schema as written in the CRD.
    pub openapi: Value,
    /// Its CEL rules, compiled.
    pub cel: CompiledSchema,
    /// Top-level fields no CEL rule can read: none inside them, and the root's rules only name
    /// other fields (`self.metadata.name`). See [`CrdSchema::cel_view`].
    unread_by_cel: Vec<String>,
}

impl CrdSchema {
    /// Compiles the CEL rules of `openapi`.
    pub fn new(openapi: Value) -> Self {
        let cel = compile_schema(&openapi);
        let unread_by_cel = unread_by_cel(&openapi);
        Self {
            openapi,
            cel,
            unread_by_cel,
        }
    }

    /// The object as the CEL rules need to see it. The API server's CEL reads `self` lazily, so
    /// a root rule such as `size(self.metadata.name) <= 57` costs the same with a status of
    /// thousands of entries; kube-cel converts all of `self` first. Leaving out the fields no
    /// rule can read keeps a status write as cheap as on a real server, with the same verdict.
    pub fn cel_view<'a>(&self, obj: &'a Value) -> std::borrow::Cow<'a, Value> {
        let Value::Object(map) = obj else {
            return std::borrow::Cow::Borrowed(obj);
        };
        if !self.unread_by_cel.iter().any(|f| map.contains_key(f)) {
            return std::borrow::Cow::Borrowed(obj);
        }
        let kept = map
            .iter()
            .filter(|(k, _)| !self.unread_by_cel.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        std::borrow::Cow::Owned(Value::Object(kept))
    }
}

/// The top-level properties without rules of their own that the root's rules (and messages)
/// never name. Any use of `self` or `oldSelf` other than `.field` (the whole object, `self[...]`,
/// `self.?field`) means every field may be read, and none is listed.
fn unread_by_cel(schema: &Value) -> Vec<String> {
    let Ok(access) = regex::Regex::new(r"\b(?:self|oldSelf)\b(\.[A-Za-z_][A-Za-z0-9_]*)?") else {
        return Vec::new();
    };
    let mut named = Vec::new();
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for text in ["rule", "messageExpression"]
            .iter()
            .filter_map(|k| rule[*k].as_str())
        {
            for found in access.captures_iter(text) {
                match found.get(1) {
                    Some(field) => named.push(field.as_str()[1..].to_string()),
                    None => return Vec::new(),
                }
            }
        }
    }
    fn has_rules(schema: &Value) -> bool {
        match schema {
            Value::Object(map) => {
                map.contains_key("x-kubernetes-validations") || map.values().any(has_rules)
            }
            Value::Array(items) => items.iter().any(has_rules),
            _ => false,
        }
    }
    schema["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, sub)| !named.contains(name) && !has_rules(sub))
        .map(|(name, _)| name.clone())
        .collect()
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
                .map(|o| Arc::new(CrdSchema::new(Value::Object(o.clone())))),
            printer_columns: version["additionalPrinterColumns"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            crd: Some(name.clone()),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(root_rule: &str) -> CrdSchema {
        CrdSchema::new(json!({
            "type": "object",
            "x-kubernetes-validations": [{"rule": root_rule}],
            "properties": {
                "spec": {"type": "object", "properties": {"v": {
                    "type": "string",
                    "x-kubernetes-validations": [{"rule": "self != 'bad'"}]
                }}},
                "status": {"type": "object", "properties": {"n": {"type": "integer"}}},
                "extra": {"type": "object"}
            }
        }))
    }

    #[test]
    fn fields_no_rule_reads_are_left_out_of_the_cel_view() {
        let s = schema("size(self.metadata.name) <= 5 && has(self.extra)");
        let obj =
            json!({"metadata": {"name": "a"}, "spec": {"v": "x"}, "extra": {}, "status": {"n": 1}});
        // spec has a rule inside, extra is named by the root rule: both stay.
        assert_eq!(
            *s.cel_view(&obj),
            json!({"metadata": {"name": "a"}, "spec": {"v": "x"}, "extra": {}})
        );
    }

    #[test]
    fn a_root_rule_on_the_whole_object_sees_every_field() {
        for rule in [
            "self == oldSelf",
            "self['status'] != null",
            "has(self.?status)",
        ] {
            let obj = json!({"metadata": {"name": "a"}, "status": {"n": 1}});
            assert_eq!(*schema(rule).cel_view(&obj), obj, "{rule}");
        }
    }
}
