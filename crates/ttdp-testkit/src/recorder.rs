//! The request log of the fault proxy: every request it answered or forwarded, so tests can
//! assert what a component wrote (e.g. "the agent never wrote anything but its own node's
//! labels").

use std::sync::{Arc, Mutex};

use serde_json::Value;

/// One answered request.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    /// HTTP method (`GET`, `POST`, `PUT`, `PATCH`, `DELETE`).
    pub method: String,
    /// Kubernetes verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`, or "" for non-resource paths (discovery, version, OpenAPI).
    pub verb: String,
    /// Request path.
    pub path: String,
    /// Raw query string ("" when none).
    pub query: String,
    /// `User-Agent` header.
    pub user_agent: String,
    /// `Content-Type` header.
    pub content_type: String,
    /// Request body parsed as JSON, None when empty or not JSON.
    pub body: Option<Value>,
    /// API group ("" for core) when the path names a resource.
    pub group: String,
    /// Resource plural, e.g. `nodes` ("" for non-resource paths).
    pub resource: String,
    /// Subresource, e.g. `status` or `eviction` ("" for none).
    pub subresource: String,
    /// Namespace from the path ("" for none).
    pub namespace: String,
    /// Object name from the path ("" for collections).
    pub name: String,
    /// HTTP status code of the answer.
    pub status: u16,
    /// When the request reached the proxy. A request is recorded once answered, so the log is
    /// in answer order; this says what was asked when.
    pub arrived: std::time::Instant,
}

impl RecordedRequest {
    /// Whether the request could change state (not GET/HEAD/OPTIONS).
    pub fn is_write(&self) -> bool {
        !matches!(self.method.as_str(), "GET" | "HEAD" | "OPTIONS")
    }
}

/// The shared request log.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
}

impl Recorder {
    /// Append a request.
    pub(crate) fn record(&self, request: RecordedRequest) {
        self.lock().push(request);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RecordedRequest>> {
        self.requests.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().clone()
    }

    /// The requests `keep` accepts.
    pub fn filter(&self, keep: impl Fn(&RecordedRequest) -> bool) -> Vec<RecordedRequest> {
        self.lock().iter().filter(|r| keep(r)).cloned().collect()
    }

    /// Requests that could change state.
    pub fn writes(&self) -> Vec<RecordedRequest> {
        self.filter(RecordedRequest::is_write)
    }

    /// Requests whose `User-Agent` starts with `prefix`.
    pub fn by_user_agent(&self, prefix: &str) -> Vec<RecordedRequest> {
        self.filter(|r| r.user_agent.starts_with(prefix))
    }

    /// Requests for one resource plural (any group), e.g. `pods`.
    pub fn for_resource(&self, resource: &str) -> Vec<RecordedRequest> {
        self.filter(|r| r.resource == resource)
    }

    /// Forget everything recorded so far.
    pub fn clear(&self) {
        self.lock().clear();
    }
}
