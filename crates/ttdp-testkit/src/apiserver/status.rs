//! `Status` failure bodies, shaped like the real API server's (`kind: Status`, `reason`, `code`,
//! `message`, `details`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One entry of `details.causes` in a `Status` body.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusCause {
    /// Machine-readable reason, e.g. `FieldValueInvalid` or `FieldManagerConflict`.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// The field the cause is about (e.g. `spec.version` or `.spec.replicas`), if any.
    pub field: Option<String>,
}

/// A failed request, rendered as the real server's `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (also `code` in the body).
    pub code: u16,
    /// `reason` in the body, e.g. `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`.
    pub reason: &'static str,
    /// `message` in the body.
    pub message: String,
    /// `details.name`, `details.group`, `details.kind`.
    pub details: Option<Box<(String, String, String)>>,
    /// `details.causes`.
    pub causes: Vec<StatusCause>,
    /// `details.retryAfterSeconds` (also sent as the `Retry-After` header).
    pub retry_after_seconds: Option<u32>,
}

/// Identifies an object in error messages: the resource (plural, with group) and name.
#[derive(Debug, Clone, Copy)]
pub struct ObjectRef<'a> {
    /// `pods`, `daemonsets.apps`, `tenstorrentdriverpolicies.driver.tenstorrent.com`.
    pub qualified_resource: &'a str,
    /// API group, empty for the core group.
    pub group: &'a str,
    /// Plural resource name (`details.kind` holds the plural, as the real server does).
    pub plural: &'a str,
    /// Object name.
    pub name: &'a str,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            causes: Vec::new(),
            retry_after_seconds: None,
        }
    }

    fn with_object(mut self, object: ObjectRef<'_>) -> Self {
        self.details = Some(Box::new((
            object.name.to_string(),
            object.group.to_string(),
            object.plural.to_string(),
        )));
        self
    }

    /// 404 `pods "x" not found`.
    pub fn not_found(object: ObjectRef<'_>) -> Self {
        Self::new(
            404,
            "NotFound",
            format!(
                "{} \"{}\" not found",
                object.qualified_resource, object.name
            ),
        )
        .with_object(object)
    }

    /// 404 for a path that names no known resource.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 `pods "x" already exists`.
    pub fn already_exists(object: ObjectRef<'_>) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!(
                "{} \"{}\" already exists",
                object.qualified_resource, object.name
            ),
        )
        .with_object(object)
    }

    /// 409 on a stale `resourceVersion` (optimistic concurrency).
    pub fn conflict(object: ObjectRef<'_>, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {why}",
                object.qualified_resource, object.name
            ),
        )
        .with_object(object)
    }

    /// 409 Conflict with a free-form message (server-side apply conflicts).
    pub fn conflict_plain(message: impl Into<String>) -> Self {
        Self::new(409, "Conflict", message)
    }

    /// 409 for a stale `resourceVersion`, with the real server's message.
    pub fn stale(object: ObjectRef<'_>) -> Self {
        Self::conflict(
            object,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 `Kind "name" is invalid: [causes]`.
    pub fn invalid(kind: &str, object: ObjectRef<'_>, causes: Vec<StatusCause>) -> Self {
        let list = causes
            .iter()
            .map(|c| match &c.field {
                Some(f) => format!("{f}: {}", c.message),
                None => c.message.clone(),
            })
            .collect::<Vec<_>>();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut err = Self::new(
            422,
            "Invalid",
            format!("{kind} \"{}\" is invalid: {joined}", object.name),
        );
        err.details = Some(Box::new((
            object.name.to_string(),
            object.group.to_string(),
            kind.to_string(),
        )));
        err.causes = causes;
        err
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 410 Gone for a `resourceVersion` older than the kept event history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 504 for a read at a `resourceVersion` newer than the server has (after the real server
    /// has waited for it for a while).
    pub fn too_large_resource_version(asked: u64, current: u64) -> Self {
        let mut err = Self::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {asked}, current: {current}"),
        );
        err.causes = vec![StatusCause {
            reason: "ResourceVersionTooLarge".into(),
            message: "Too large resource version".into(),
            field: None,
        }];
        err.retry_after_seconds = Some(1);
        err
    }

    /// 415 for a request body this server cannot decode.
    pub fn unsupported_body(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json (this test server decodes {content_type} only for Eviction, DeleteOptions, Namespace, ConfigMap and ServiceAccount; send JSON, e.g. use `kubectl apply`)"
            ),
        )
    }

    /// 415 UnsupportedMediaType for a patch.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// 429 TooManyRequests with causes (eviction blocked by a PodDisruptionBudget).
    pub fn too_many_requests(message: impl Into<String>, causes: Vec<StatusCause>) -> Self {
        let mut err = Self::new(429, "TooManyRequests", message);
        err.causes = causes;
        err
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// 403 Forbidden, e.g. creating objects in a terminating namespace.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// The `Status` body.
    pub fn body(&self) -> Value {
        let mut body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        if let Some(d) = &self.details {
            let (name, group, kind) = &**d;
            if !name.is_empty() {
                details.insert("name".into(), json!(name));
            }
            if !group.is_empty() {
                details.insert("group".into(), json!(group));
            }
            details.insert("kind".into(), json!(kind));
        }
        if !self.causes.is_empty() {
            let causes = self
                .causes
                .iter()
                .map(|c| {
                    let mut v = json!({"reason": c.reason, "message": c.message});
                    if let Some(f) = &c.field {
                        v["field"] = json!(f);
                    }
                    v
                })
                .collect::<Vec<_>>();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(secs) = self.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(secs));
        }
        if !details.is_empty() {
            body["details"] = Value::Object(details);
        }
        body
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            code,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.body().to_string(),
        )
            .into_response();
        if let Some(secs) = self.retry_after_seconds
            && let Ok(v) = axum::http::HeaderValue::from_str(&secs.to_string())
        {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, v);
        }
        response
    }
}

/// The `Status` body of a successful delete (`status: Success`).
pub fn success(name: &str, group: &str, kind: &str, uid: &str) -> Value {
    let mut details = json!({"name": name, "kind": kind, "uid": uid});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}
