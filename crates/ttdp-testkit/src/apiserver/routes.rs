//! HTTP routing: turns a request path into discovery or a resource verb and dispatches it to
//! the cluster. Bodies are JSON only (protobuf gets 415); every answer is JSON, also to a
//! request for a `Table` (as from a server without table support). What the demo's programs
//! never send is refused with a message saying so: PUT (405), `dryRun`, `continue` and
//! `sendInitialEvents` (400).

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::catalog::ResourceType;
use super::cluster::{Cluster, ClusterState, DeleteOpts, ListQuery};
use super::discovery;
use super::eviction;
use super::patch::PatchType;
use super::status::ApiError;
use super::watch::{self, WatchQuery};

/// How often watches that asked for bookmarks get one.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

/// Shared state of the HTTP layer.
#[derive(Debug, Clone)]
pub struct App {
    /// The cluster.
    pub cluster: Cluster,
    /// Cancelled on shutdown (ends watches).
    pub stop: CancellationToken,
    /// `host:port` the server listens on.
    pub address: String,
}

/// The router.
pub fn router(app: App) -> Router {
    Router::new().fallback(handle).with_state(app)
}

/// A parsed resource path.
#[derive(Debug, Clone)]
struct ResourcePath {
    rt: ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    subresource: String,
}

enum Target {
    CoreVersions,
    Groups,
    ResourceList(String, String),
    Resource(Box<ResourcePath>),
}

fn parse_target(app: &App, path: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["api"] => Ok(Target::CoreVersions),
        ["apis"] => Ok(Target::Groups),
        ["api", v] => Ok(Target::ResourceList(String::new(), v.to_string())),
        ["apis", g, v] => Ok(Target::ResourceList(g.to_string(), v.to_string())),
        ["api", v, rest @ ..] => parse_resource(app, "", v, rest, path),
        ["apis", g, v, rest @ ..] => parse_resource(app, g, v, rest, path),
        _ => Err(ApiError::no_route(path)),
    }
}

fn parse_resource(
    app: &App,
    group: &str,
    version: &str,
    rest: &[&str],
    path: &str,
) -> Result<Target, ApiError> {
    let state = app.cluster.lock();
    let find = |plural: &str| state.resource(group, version, plural);
    let namespaced = |plural: &str| find(plural).filter(|rt| rt.namespaced);
    let (rt, namespace, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] if namespaced(plural).is_some() => {
            let rt = namespaced(plural).ok_or_else(|| ApiError::no_route(path))?;
            (rt, Some(ns.to_string()), tail)
        }
        [plural, tail @ ..] => {
            let rt = find(plural).ok_or_else(|| ApiError::no_route(path))?;
            if rt.namespaced && !tail.is_empty() {
                return Err(ApiError::no_route(path));
            }
            (rt, None, tail)
        }
        [] => return Err(ApiError::no_route(path)),
    };
    let (name, sub) = match tail {
        [] => (None, ""),
        [name] => (Some(name.to_string()), ""),
        [name, sub] => (Some(name.to_string()), *sub),
        _ => return Err(ApiError::no_route(path)),
    };
    let allowed_sub = match sub {
        "" => true,
        "status" => rt.status_subresource,
        "eviction" => rt.is("", "pods"),
        _ => false,
    };
    if !allowed_sub {
        return Err(ApiError::no_route(path));
    }
    Ok(Target::Resource(Box::new(ResourcePath {
        rt,
        namespace,
        name,
        subresource: sub.to_string(),
    })))
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn handle(
    State(app): State<App>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let query: HashMap<String, String> = Query::<HashMap<String, String>>::try_from_uri(&uri)
        .map(|q| q.0)
        .unwrap_or_default();
    let header = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let content_type = header(header::CONTENT_TYPE);
    let accept = header(header::ACCEPT);
    let response = match parse_target(&app, &path) {
        Err(e) => e.into_response(),
        Ok(Target::Resource(rp)) => {
            resource(&app, &method, &rp, &query, &content_type, &accept, &body)
                .unwrap_or_else(IntoResponse::into_response)
        }
        Ok(other) => non_resource(&app, other),
    };
    tracing::debug!(%method, %path, query = uri.query().unwrap_or_default(), status = response.status().as_u16(), "request");
    response
}

fn non_resource(app: &App, target: Target) -> Response {
    let state = app.cluster.lock();
    let found = |v: Option<Value>| match v {
        Some(v) => json_response(StatusCode::OK, &v),
        None => ApiError::no_route("discovery").into_response(),
    };
    match target {
        Target::CoreVersions => {
            json_response(StatusCode::OK, &discovery::core_versions(&app.address))
        }
        Target::Groups => json_response(StatusCode::OK, &discovery::group_list(&state.catalog)),
        Target::ResourceList(g, v) => found(discovery::resource_list(&state.catalog, &g, &v)),
        Target::Resource(_) => ApiError::no_route("resource").into_response(),
    }
}

fn list_query(query: &HashMap<String, String>) -> ListQuery {
    ListQuery {
        label_selector: query.get("labelSelector").cloned(),
        field_selector: query.get("fieldSelector").cloned(),
    }
}

/// Run a write under the state lock and wake the disruption controller.
fn write<T>(
    app: &App,
    f: impl FnOnce(&mut ClusterState) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let result = f(&mut app.cluster.lock());
    app.cluster.wake.notify_one();
    result
}

fn decode_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

fn resource(
    app: &App,
    method: &Method,
    rp: &ResourcePath,
    query: &HashMap<String, String>,
    content_type: &str,
    accept: &str,
    body: &[u8],
) -> Result<Response, ApiError> {
    let rt = &rp.rt;
    let ns = rp.namespace.as_deref().unwrap_or_default();
    let status_sub = if rp.subresource == "status" {
        "status"
    } else {
        ""
    };
    let is_true = |key: &str| query.get(key).is_some_and(|b| b == "true");
    for (unsupported, sent) in [
        ("dryRun", query.contains_key("dryRun")),
        (
            "continue",
            query.get("continue").is_some_and(|c| !c.is_empty()),
        ),
        ("sendInitialEvents", is_true("sendInitialEvents")),
    ] {
        if sent {
            return Err(ApiError::bad_request(format!(
                "{unsupported} is not supported by this imitation API server"
            )));
        }
    }
    let respond = |code: StatusCode, v: &Value| -> Response {
        if accept.contains("as=PartialObjectMetadata") {
            json_response(code, &partial_metadata(v))
        } else {
            json_response(code, v)
        }
    };
    match (method.as_str(), rp.name.as_deref()) {
        ("GET", None) if query.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            let wq = WatchQuery {
                list: list_query(query),
                resource_version: query.get("resourceVersion").cloned(),
                bookmarks: is_true("allowWatchBookmarks"),
                timeout: query
                    .get("timeoutSeconds")
                    .and_then(|t| t.parse().ok())
                    .map(Duration::from_secs),
            };
            let namespace = rp.namespace.as_deref();
            let stop = app.stop.clone();
            watch::watch(&app.cluster, rt, namespace, wq, BOOKMARK_INTERVAL, stop)
        }
        ("GET", None) => {
            let q = list_query(query);
            let list = app.cluster.lock().list(rt, rp.namespace.as_deref(), &q)?;
            Ok(respond(StatusCode::OK, &list))
        }
        ("GET", Some(name)) => {
            let obj = app.cluster.lock().get(rt, ns, name)?;
            Ok(respond(StatusCode::OK, &obj))
        }
        ("POST", None) => {
            let input = decode_body(content_type, body)?;
            let obj = write(app, |s| s.create(rt, ns, input))?;
            Ok(respond(StatusCode::CREATED, &obj))
        }
        ("POST", Some(name)) if rp.subresource == "eviction" => {
            let input = decode_body(content_type, body)?;
            let result = write(app, |s| eviction::evict(s, rt, ns, name, &input))?;
            Ok(json_response(StatusCode::CREATED, &result))
        }
        ("PATCH", Some(name)) => {
            let patch_type = PatchType::from_content_type(content_type)?;
            let (obj, created) =
                write(app, |s| s.patch(rt, ns, name, patch_type, body, status_sub))?;
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(respond(code, &obj))
        }
        ("DELETE", Some(name)) => {
            let mut opts = DeleteOpts {
                grace_period_seconds: query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()),
                ..DeleteOpts::default()
            };
            if !body.is_empty() {
                opts.merge_body(&decode_body(content_type, body)?);
            }
            let result = write(app, |s| s.delete(rt, ns, name, &opts))?;
            Ok(json_response(StatusCode::OK, &result))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "this imitation API server does not serve {method} on {} (no PUT: use a patch)",
            rt.qualified()
        ))),
    }
}

/// An object (or list) as `PartialObjectMetadata` (`PartialObjectMetadataList`): what a real
/// server answers a read or write whose `Accept` asks for only the metadata.
fn partial_metadata(v: &Value) -> Value {
    let one = |o: &Value| json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]});
    match v["items"].as_array() {
        Some(items) => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": v["metadata"],
            "items": items.iter().map(one).collect::<Vec<_>>(),
        }),
        None => one(v),
    }
}
