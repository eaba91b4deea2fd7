//! HTTP routing: turns a request path into discovery or a resource verb and dispatches it to
//! the cluster. Bodies are JSON only (protobuf gets 415); every answer is JSON, also to a
//! request for a `Table` (as from a server without table support). What the demo's programs
//! never send is refused with a message saying so: PUT (405), `dryRun`, `continue` and
//! `sendInitialEvents` (400).

use std::collections::HashMap;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::catalog::ResourceType;
use super::cluster::{Cluster, ClusterState};
use super::discovery;
use super::eviction;
use super::patch::PatchType;
use super::selectors::Selection;
use super::status::{ApiError, JSON};
use super::watch;

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

/// One request, as the routes read it.
struct Request<'a> {
    method: &'a Method,
    query: HashMap<String, String>,
    content_type: String,
    accept: String,
    body: &'a [u8],
}

/// A resource path: `.../[namespaces/<namespace>/]<plural>[/<name>[/<subresource>]]`.
struct ResourcePath<'a> {
    rt: ResourceType,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
    subresource: &'a str,
}

async fn handle(
    State(app): State<App>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: header::HeaderName| {
        let value = headers.get(name).and_then(|v| v.to_str().ok());
        value.unwrap_or_default().to_string()
    };
    let request = Request {
        method: &method,
        query: Query::try_from_uri(&uri).map(|q| q.0).unwrap_or_default(),
        content_type: header(header::CONTENT_TYPE),
        accept: header(header::ACCEPT),
        body: &body,
    };
    let response = route(&app, uri.path(), &request).unwrap_or_else(IntoResponse::into_response);
    let (content_type, accept) = (&request.content_type, &request.accept);
    let status = response.status().as_u16();
    tracing::debug!(%method, %uri, %content_type, %accept, status, "request");
    response
}

fn route(app: &App, path: &str, request: &Request) -> Result<Response, ApiError> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let state = app.cluster.lock();
    let found = |document: Option<Value>| match document {
        Some(document) => Ok(json_response(StatusCode::OK, &document)),
        None => Err(ApiError::no_route(path)),
    };
    let (group, version, rest) = match segments.as_slice() {
        ["api"] => return found(Some(discovery::core_versions(&app.address))),
        ["apis"] => return found(Some(discovery::group_list(&state.served()))),
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return found(None),
    };
    if rest.is_empty() {
        return found(discovery::resource_list(&state.served(), group, version));
    }
    let target =
        resource_path(&state, group, version, rest).ok_or_else(|| ApiError::no_route(path))?;
    drop(state);
    resource(app, &target, request)
}

fn resource_path<'a>(
    state: &ClusterState,
    group: &str,
    version: &str,
    rest: &[&'a str],
) -> Option<ResourcePath<'a>> {
    let find = |plural: &str| state.resource(group, version, plural);
    let (rt, namespace, tail) = match rest {
        ["namespaces", namespace, plural, tail @ ..]
            if find(plural).is_some_and(|rt| rt.namespaced) =>
        {
            (find(plural)?, Some(*namespace), tail)
        }
        [plural, tail @ ..] => {
            let rt = find(plural).filter(|rt| !rt.namespaced || tail.is_empty())?;
            (rt, None, tail)
        }
        [] => return None,
    };
    let (name, subresource) = match tail {
        [] => (None, ""),
        [name] => (Some(*name), ""),
        [name, subresource] => (Some(*name), *subresource),
        _ => return None,
    };
    let served = match subresource {
        "" => true,
        "status" => rt.status_subresource,
        "eviction" => rt.is("", "pods"),
        _ => false,
    };
    served.then_some(ResourcePath {
        rt,
        namespace,
        name,
        subresource,
    })
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, JSON, body.to_string()).into_response()
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

fn decode_body(request: &Request) -> Result<Value, ApiError> {
    let content_type = &request.content_type;
    if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    serde_json::from_slice(request.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body (JSON only): {e}")))
}

impl Request<'_> {
    /// A query parameter, "" when not sent.
    fn param(&self, key: &str) -> &str {
        self.query.get(key).map(String::as_str).unwrap_or_default()
    }
}

/// The `DeleteOptions` of a delete: its body, with a `gracePeriodSeconds` query parameter.
fn delete_options(request: &Request) -> Result<Value, ApiError> {
    let mut options = match request.body {
        [] => json!({}),
        _ => decode_body(request)?,
    };
    if !options.is_object() {
        return Err(ApiError::bad_request("DeleteOptions must be a JSON object"));
    }
    if let Ok(grace) = request.param("gracePeriodSeconds").parse::<i64>() {
        options["gracePeriodSeconds"] = json!(grace);
    }
    Ok(options)
}

fn resource(app: &App, rp: &ResourcePath, request: &Request) -> Result<Response, ApiError> {
    let unsupported = ["dryRun", "continue", "sendInitialEvents"];
    if let Some(parameter) =
        (unsupported.iter()).find(|p| !matches!(request.param(p), "" | "false"))
    {
        return Err(ApiError::bad_request(format!(
            "{parameter} is not supported by this imitation API server"
        )));
    }
    let (rt, query) = (&rp.rt, &request.query);
    let ns = rp.namespace.unwrap_or_default();
    let respond = |code, v: &Value| match request.accept.contains("as=PartialObjectMetadata") {
        true => json_response(code, &partial_metadata(v)),
        false => json_response(code, v),
    };
    let watching = matches!(request.param("watch"), "true" | "1");
    match (request.method.as_str(), rp.name, rp.subresource) {
        ("GET", None, _) if watching => {
            let selection = Selection::from_query(rp.namespace, query)?;
            let rv = request.param("resourceVersion");
            let timeout = request.param("timeoutSeconds").parse().ok();
            let stop = app.stop.clone();
            let body = watch::watch(&app.cluster, rt, selection, rv, timeout, stop)?;
            Ok((StatusCode::OK, JSON, body).into_response())
        }
        ("GET", None, _) => {
            let selection = Selection::from_query(rp.namespace, query)?;
            let list = app.cluster.lock().list(rt, &selection);
            Ok(json_response(StatusCode::OK, &list))
        }
        ("GET", Some(name), _) => Ok(respond(
            StatusCode::OK,
            &app.cluster.lock().get(rt, ns, name)?,
        )),
        ("POST", None, _) => {
            let input = decode_body(request)?;
            let obj = write(app, |s| s.create(rt, ns, input))?;
            Ok(respond(StatusCode::CREATED, &obj))
        }
        ("POST", Some(name), "eviction") => {
            let input = decode_body(request)?;
            let result = write(app, |s| eviction::evict(s, rt, ns, name, &input))?;
            Ok(json_response(StatusCode::CREATED, &result))
        }
        ("PATCH", Some(name), "" | "status") => {
            let patch_type = PatchType::from_content_type(&request.content_type)?;
            let patch = decode_body(request)?;
            let patch =
                |s: &mut ClusterState| s.patch(rt, ns, name, patch_type, patch, rp.subresource);
            match write(app, patch)? {
                (obj, true) => Ok(respond(StatusCode::CREATED, &obj)),
                (obj, false) => Ok(respond(StatusCode::OK, &obj)),
            }
        }
        ("DELETE", Some(name), "") => {
            let options = delete_options(request)?;
            let result = write(app, |s| s.delete(rt, ns, name, &options))?;
            Ok(json_response(StatusCode::OK, &result))
        }
        (method, ..) => {
            let what = format!("{method} on {}", rt.qualified());
            let message =
                format!("this imitation API server does not serve {what} (no PUT: use a patch)");
            Err(ApiError::new(405, "MethodNotAllowed", message))
        }
    }
}

/// An object as `PartialObjectMetadata`: what a real server answers a read or write of one
/// object whose `Accept` asks for only the metadata (the controller's status writes do). Lists
/// are always whole: no client of the demo lists metadata only.
fn partial_metadata(v: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": v["metadata"],
    })
}
