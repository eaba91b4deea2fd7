//! `Status` bodies, shaped like the real API server's (`kind: Status`, `reason`, `code`,
//! `message`, `details`).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::catalog::ResourceType;

/// The `Content-Type` of every answer.
pub const JSON: [(header::HeaderName, &str); 1] = [(header::CONTENT_TYPE, "application/json")];

/// Why a write with a stale `resourceVersion` fails, in the real server's words.
pub const STALE: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// A failed request, rendered as the real server's `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (also `code` in the body).
    pub code: u16,
    /// `reason` in the body, e.g. `NotFound`, `AlreadyExists`, `Conflict`.
    pub reason: &'static str,
    /// `message` in the body.
    pub message: String,
    /// `details` in the body (null: none).
    pub details: Value,
}

impl ApiError {
    /// An error without `details`.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: Value::Null,
        }
    }

    /// An error about one object: `<resource> "<name>" <what>`, with the object in `details`.
    fn about(code: u16, reason: &'static str, rt: &ResourceType, name: &str, what: &str) -> Self {
        let mut err = Self::new(
            code,
            reason,
            format!("{} \"{name}\" {what}", rt.qualified()),
        );
        err.details = json!({"name": name, "group": rt.group, "kind": rt.plural});
        err
    }

    /// 404 `pods "x" not found`.
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::about(404, "NotFound", rt, name, "not found")
    }

    /// 404 for a path that names no served resource.
    pub fn no_route(path: &str) -> Self {
        let message = format!("the server could not find the requested resource ({path})");
        Self::new(404, "NotFound", message)
    }

    /// 409 `pods "x" already exists`.
    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::about(409, "AlreadyExists", rt, name, "already exists")
    }

    /// 409 Conflict about one object (a failed precondition), with the real server's message.
    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        let mut err = Self::about(409, "Conflict", rt, name, "");
        err.message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            rt.qualified()
        );
        err
    }

    /// 409 for a stale `resourceVersion` (optimistic concurrency), with the real server's message.
    pub fn stale(rt: &ResourceType, name: &str) -> Self {
        Self::conflict(rt, name, STALE)
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 415 for a body or patch in a format this server does not decode.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        let message = format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (sent as JSON) (got {content_type:?}; this imitation API server decodes JSON only: no protobuf, no strategic merge patch)"
        );
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 429 TooManyRequests: an eviction a PodDisruptionBudget forbids, the reason in
    /// `details.causes`.
    pub fn disruption_budget(why: String) -> Self {
        let message = "Cannot evict pod as it would violate the pod's disruption budget.";
        let mut err = Self::new(429, "TooManyRequests", message);
        err.details = json!({"causes": [{"reason": "DisruptionBudget", "message": why}]});
        err
    }

    /// The `Status` body.
    pub fn body(&self) -> Value {
        let mut body = status("Failure", self.code, self.details.clone());
        body["message"] = json!(self.message);
        body["reason"] = json!(self.reason);
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, JSON, self.body().to_string()).into_response()
    }
}

/// A `Status` body: `Success` (a delete or an eviction) or `Failure`.
pub fn status(status: &str, code: u16, details: Value) -> Value {
    let mut body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status, "code": code});
    if !details.is_null() {
        body["details"] = details;
    }
    body
}
