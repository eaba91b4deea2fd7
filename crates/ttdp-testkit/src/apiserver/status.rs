//! `Status` failure bodies, shaped like the real API server's (`kind: Status`, `reason`, `code`,
//! `message`, `details`).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::catalog::ResourceType;

/// One entry of `details.causes` in a `Status` body.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusCause {
    /// Machine-readable reason, e.g. `DisruptionBudget`.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// A failed request, rendered as the real server's `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (also `code` in the body).
    pub code: u16,
    /// `reason` in the body, e.g. `NotFound`, `AlreadyExists`, `Conflict`.
    pub reason: &'static str,
    /// `message` in the body.
    pub message: String,
    /// `details`: the object's name, group and resource (plural), when about one object.
    pub details: Option<Box<(String, String, String)>>,
    /// `details.causes`.
    pub causes: Vec<StatusCause>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            causes: Vec::new(),
        }
    }

    fn about(mut self, rt: &ResourceType, name: &str) -> Self {
        self.details = Some(Box::new((
            name.to_string(),
            rt.group.clone(),
            rt.plural.clone(),
        )));
        self
    }

    /// 404 `pods "x" not found`.
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified()),
        )
        .about(rt, name)
    }

    /// 404 for a path that names no served resource.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 `pods "x" already exists`.
    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.qualified()),
        )
        .about(rt, name)
    }

    /// 409 Conflict about one object (a failed precondition).
    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                rt.qualified()
            ),
        )
        .about(rt, name)
    }

    /// 409 for a stale `resourceVersion` (optimistic concurrency), with the real server's message.
    pub fn stale(rt: &ResourceType, name: &str) -> Self {
        Self::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 410 Gone for a `resourceVersion` older than the kept history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 415 for a body or patch in a format this server does not decode.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (sent as JSON) (got {content_type:?}; this imitation API server decodes JSON only: no protobuf, no strategic merge patch)"
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
                .map(|c| json!({"reason": c.reason, "message": c.message}))
                .collect::<Vec<_>>();
            details.insert("causes".into(), Value::Array(causes));
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
        (
            code,
            [(header::CONTENT_TYPE, "application/json")],
            self.body().to_string(),
        )
            .into_response()
    }
}

/// The `Status` body of a successful delete or eviction (`status: Success`).
pub fn success(code: u16, details: Value) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
        "details": details,
    })
}
