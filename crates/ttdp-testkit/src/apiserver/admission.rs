//! Admission: what the real server does to an object before storing it. Built-in types get the
//! defaults kubectl and ttdp notice (pod `restartPolicy`, `terminationGracePeriodSeconds`,
//! DaemonSet `updateStrategy`, ...) and a few validations; custom resources get their CRD's
//! schema defaults, pruning, structural validation and CEL `x-kubernetes-validations` (with
//! `oldSelf` transition rules on updates), failing with 422 `Invalid`.

use kube::core::cel::{RootContext, Validator};
use serde_json::{Value, json};

use super::builtin_types;
use super::catalog::{CrdSchema, ResourceType};
use super::meta;
use super::schema_validation;
use super::status::{ApiError, ObjectRef, StatusCause};

/// Create-time preparation (the real strategies' `PrepareForCreate`): reset or initialise
/// `status`, finalizers the server adds itself.
pub fn prepare_for_create(rt: &ResourceType, obj: &mut Value) {
    if rt.is_custom() {
        if rt.status_subresource
            && let Some(o) = obj.as_object_mut()
        {
            o.remove("status");
        }
        return;
    }
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => {
            let qos = pod_qos_class(&obj["spec"]);
            obj["status"] = json!({"phase": "Pending", "qosClass": qos});
        }
        ("", "namespaces") => {
            obj["spec"]["finalizers"] = json!(["kubernetes"]);
            obj["status"] = json!({"phase": "Active"});
        }
        ("apps", "daemonsets") => {
            obj["status"] = json!({
                "currentNumberScheduled": 0,
                "numberMisscheduled": 0,
                "desiredNumberScheduled": 0,
                "numberReady": 0,
            });
        }
        ("apps", "deployments") | ("apps", "replicasets") => {
            obj["status"] = json!({});
        }
        ("policy", "poddisruptionbudgets") => {
            obj["status"] = json!({
                "disruptionsAllowed": 0,
                "currentHealthy": 0,
                "desiredHealthy": 0,
                "expectedPods": 0,
            });
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            let mut finalizers = meta::finalizers(obj);
            if !finalizers.iter().any(|f| f == CRD_CLEANUP_FINALIZER) {
                finalizers.push(CRD_CLEANUP_FINALIZER.into());
            }
            meta::set(obj, "finalizers", json!(finalizers));
            obj["status"] = crd_status(obj);
        }
        _ => {}
    }
}

/// The finalizer the real server puts on CRDs so their custom resources are removed first.
pub const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

fn crd_status(crd: &Value) -> Value {
    let now = meta::now();
    let storage: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .map(|v| v["name"].clone())
        .collect();
    let mut accepted = crd["spec"]["names"].clone();
    if accepted["singular"].is_null() {
        accepted["singular"] = json!(
            crd["spec"]["names"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_lowercase()
        );
    }
    if accepted["listKind"].is_null() {
        accepted["listKind"] = json!(format!(
            "{}List",
            crd["spec"]["names"]["kind"].as_str().unwrap_or_default()
        ));
    }
    json!({
        "acceptedNames": accepted,
        "storedVersions": storage,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    })
}

fn pod_qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let any_resources = containers.iter().any(|c| {
        c["resources"]["requests"]
            .as_object()
            .is_some_and(|m| !m.is_empty())
            || c["resources"]["limits"]
                .as_object()
                .is_some_and(|m| !m.is_empty())
    });
    if !any_resources {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let limits = &c["resources"]["limits"];
        let requests = &c["resources"]["requests"];
        ["cpu", "memory"].iter().all(|r| {
            limits[*r].is_string() && (requests[*r].is_null() || requests[*r] == limits[*r])
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn default_field(obj: &mut Value, field: &str, value: Value) {
    if obj.get(field).is_none_or(Value::is_null) {
        obj[field] = value;
    }
}

fn default_container(c: &mut Value) {
    let image = c["image"].as_str().unwrap_or_default().to_string();
    let tag = image.rsplit('/').next().unwrap_or_default();
    let latest = !tag.contains(':') || tag.ends_with(":latest");
    default_field(
        c,
        "imagePullPolicy",
        json!(if latest { "Always" } else { "IfNotPresent" }),
    );
    default_field(c, "terminationMessagePath", json!("/dev/termination-log"));
    default_field(c, "terminationMessagePolicy", json!("File"));
    default_field(c, "resources", json!({}));
}

/// The pod spec defaults the real server applies.
pub fn default_pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    default_field(spec, "restartPolicy", json!("Always"));
    default_field(spec, "terminationGracePeriodSeconds", json!(30));
    default_field(spec, "dnsPolicy", json!("ClusterFirst"));
    default_field(spec, "schedulerName", json!("default-scheduler"));
    default_field(spec, "securityContext", json!({}));
    default_field(spec, "enableServiceLinks", json!(true));
    for list in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            cs.iter_mut().for_each(default_container);
        }
    }
}

fn default_builtin(rt: &ResourceType, obj: &mut Value) {
    // Go structs serialise their non-pointer `spec`/`status` even when empty.
    let has_spec_and_status = matches!(
        rt.plural.as_str(),
        "namespaces"
            | "nodes"
            | "pods"
            | "daemonsets"
            | "deployments"
            | "replicasets"
            | "poddisruptionbudgets"
    );
    if has_spec_and_status {
        default_field(obj, "spec", json!({}));
        default_field(obj, "status", json!({}));
    }
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => {
            if let Some(spec) = obj.get_mut("spec") {
                default_pod_spec(spec);
                default_field(spec, "serviceAccountName", json!("default"));
            }
        }
        ("apps", "daemonsets") => {
            if let Some(spec) = obj.pointer_mut("/spec/template/spec") {
                default_pod_spec(spec);
            }
            let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
                return;
            };
            default_field(spec, "revisionHistoryLimit", json!(10));
            if spec["updateStrategy"].is_null() || spec["updateStrategy"]["type"].is_null() {
                spec["updateStrategy"]["type"] = json!("RollingUpdate");
            }
            if spec["updateStrategy"]["type"] == "RollingUpdate"
                && spec["updateStrategy"]["rollingUpdate"].is_null()
            {
                spec["updateStrategy"]["rollingUpdate"] =
                    json!({"maxUnavailable": 1, "maxSurge": 0});
            }
        }
        ("apps", "deployments") | ("apps", "replicasets") => {
            if let Some(spec) = obj.pointer_mut("/spec/template/spec") {
                default_pod_spec(spec);
            }
            if let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) {
                default_field(spec, "replicas", json!(1));
            }
        }
        _ => {}
    }
}

/// The message the real server gives for a forbidden pod spec update.
const POD_UPDATE_FORBIDDEN: &str = "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// Update rules of built-in types: pod specs are immutable but for images, tolerations and
/// `activeDeadlineSeconds` (and `spec.nodeName` only through the binding subresource); a
/// DaemonSet's selector is immutable.
fn validate_builtin_update(rt: &ResourceType, old: &Value, new: &Value) -> Vec<StatusCause> {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => {
            let mut normalised = new["spec"].clone();
            for list in ["containers", "initContainers"] {
                let old_images: Vec<Value> = old["spec"][list]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| c["image"].clone())
                    .collect();
                if let Some(items) = normalised.get_mut(list).and_then(Value::as_array_mut) {
                    for (c, image) in items.iter_mut().zip(old_images) {
                        c["image"] = image;
                    }
                }
            }
            for field in ["activeDeadlineSeconds", "tolerations", "schedulingGates"] {
                match old["spec"].get(field) {
                    Some(v) => normalised[field] = v.clone(),
                    None => {
                        if let Some(m) = normalised.as_object_mut() {
                            m.remove(field);
                        }
                    }
                }
            }
            if normalised != old["spec"] {
                return vec![StatusCause {
                    reason: "FieldValueForbidden".into(),
                    message: POD_UPDATE_FORBIDDEN.into(),
                    field: Some("spec".into()),
                }];
            }
            Vec::new()
        }
        ("apps", "daemonsets") if old["spec"]["selector"] != new["spec"]["selector"] => {
            vec![StatusCause {
                reason: "FieldValueInvalid".into(),
                message: format!(
                    "Invalid value: {}: field is immutable",
                    new["spec"]["selector"]
                ),
                field: Some("spec.selector".into()),
            }]
        }
        _ => Vec::new(),
    }
}

fn validate_builtin(rt: &ResourceType, obj: &Value) -> Vec<StatusCause> {
    let mut causes = Vec::new();
    let required = |field: &str| StatusCause {
        reason: "FieldValueRequired".into(),
        message: "Required value".into(),
        field: Some(field.into()),
    };
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => {
            let containers = obj["spec"]["containers"].as_array();
            if containers.is_none_or(Vec::is_empty) {
                causes.push(required("spec.containers"));
            }
            for (i, c) in containers.into_iter().flatten().enumerate() {
                if c["name"].as_str().unwrap_or_default().is_empty() {
                    causes.push(required(&format!("spec.containers[{i}].name")));
                }
                if c["image"].as_str().unwrap_or_default().is_empty() {
                    causes.push(required(&format!("spec.containers[{i}].image")));
                }
            }
        }
        ("apps", "daemonsets") if obj["spec"]["selector"].is_null() => {
            causes.push(required("spec.selector"));
        }
        ("policy", "poddisruptionbudgets")
            if !obj["spec"]["minAvailable"].is_null()
                && !obj["spec"]["maxUnavailable"].is_null() =>
        {
            causes.push(StatusCause {
                reason: "FieldValueInvalid".into(),
                message: "Invalid value: policy.PodDisruptionBudgetSpec{...}: minAvailable and maxUnavailable cannot be both set".into(),
                field: Some("spec".into()),
            });
        }
        _ => {}
    }
    causes
}

/// The `fieldValidation` request parameter: what happens to fields the schema does not know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and warn (`Warning` header); the default when the parameter is absent.
    #[default]
    Warn,
    /// Reject the request with 400 BadRequest (kubectl's default).
    Strict,
}

impl FieldValidation {
    /// Parse the query parameter (unknown values mean the default).
    pub fn parse(v: Option<&str>) -> Self {
        match v {
            Some("Strict") => Self::Strict,
            Some("Ignore") => Self::Ignore,
            _ => Self::Warn,
        }
    }
}

/// Default and validate an object about to be stored (`old` is the stored version on updates).
/// Returns the warnings to send back (unknown fields dropped under [`FieldValidation::Warn`]).
pub fn admit(
    rt: &ResourceType,
    old: Option<&Value>,
    obj: &mut Value,
    validation: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    let (causes, unknown) = match &rt.schema {
        Some(schema) => admit_custom(rt, schema, old, obj),
        None => {
            default_builtin(rt, obj);
            let unknown = builtin_types::check(rt, obj).map_err(|e| {
                ApiError::bad_request(format!(
                    "{kind} in version \"{version}\" cannot be handled as a {kind}: {e}",
                    kind = rt.kind,
                    version = rt.version
                ))
            })?;
            let mut causes = validate_builtin(rt, obj);
            if let Some(old) = old {
                causes.extend(validate_builtin_update(rt, old, obj));
            }
            (causes, unknown)
        }
    };
    let unknown: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    if !unknown.is_empty() && validation == FieldValidation::Strict {
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {fields}",
            kind = rt.kind,
            version = rt.version,
            fields = unknown.join(", ")
        )));
    }
    let warnings = if validation == FieldValidation::Warn {
        unknown
    } else {
        Vec::new()
    };
    if causes.is_empty() {
        return Ok(warnings);
    }
    let kind = if rt.group.is_empty() {
        rt.kind.clone()
    } else {
        format!("{}.{}", rt.kind, rt.group)
    };
    let qualified = rt.qualified();
    let mut err = ApiError::invalid(
        &kind,
        ObjectRef {
            qualified_resource: &qualified,
            group: &rt.group,
            plural: &rt.plural,
            name: meta::name(obj),
        },
        causes,
    );
    err.details = Some(Box::new((
        meta::name(obj).to_string(),
        rt.group.clone(),
        rt.kind.clone(),
    )));
    Err(err)
}

thread_local! {
    /// A CEL environment with the Kubernetes functions registered (costly to build; not `Sync`).
    static CEL: Validator = Validator::new();
}

/// Returns the validation failures and the unknown (pruned) fields.
fn admit_custom(
    rt: &ResourceType,
    crd_schema: &CrdSchema,
    old: Option<&Value>,
    obj: &mut Value,
) -> (Vec<StatusCause>, Vec<String>) {
    let schema = &crd_schema.openapi;
    schema_validation::apply_defaults(schema, obj, old);
    let mut removed = Vec::new();
    schema_validation::prune(schema, obj, "", old, &mut removed);
    let mut causes = Vec::new();
    schema_validation::validate(schema, obj, "", old, &mut causes);
    if !causes.is_empty() {
        return (causes, removed);
    }
    let root = RootContext {
        api_version: rt.api_version(),
        api_group: rt.group.clone(),
        kind: rt.kind.clone(),
    };
    let view = crd_schema.cel_view(obj);
    let old_view = old.map(|o| crd_schema.cel_view(o));
    let checked = CEL.with(|cel| {
        cel.validate_compiled_with_context(&crd_schema.cel, &view, old_view.as_deref(), Some(&root))
    });
    if let Err(errors) = checked {
        for e in errors.iter() {
            let field = if e.field_path.is_empty() {
                "<nil>".to_string()
            } else {
                e.field_path.clone()
            };
            let value = field_type_name(obj, &e.field_path);
            let reason = e
                .reason
                .clone()
                .unwrap_or_else(|| "FieldValueInvalid".into());
            let message = match reason.as_str() {
                "FieldValueForbidden" => format!("Forbidden: {}", e.message),
                "FieldValueRequired" => format!("Required value: {}", e.message),
                "FieldValueDuplicate" => format!("Duplicate value: {}", e.message),
                _ => format!("Invalid value: \"{value}\": {}", e.message),
            };
            causes.push(StatusCause {
                reason,
                message,
                field: Some(field),
            });
        }
    }
    (causes, removed)
}

fn field_type_name(obj: &Value, path: &str) -> &'static str {
    let mut current = obj;
    for seg in path.split('.').filter(|s| !s.is_empty()) {
        let name = seg.split('[').next().unwrap_or(seg);
        current = &current[name];
    }
    match current {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
    }
}
