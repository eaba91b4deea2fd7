//! HTTP routing: turns a request path into discovery, OpenAPI or a resource verb, applies
//! injected faults, dispatches to the cluster, and records the exchange.

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::admission::FieldValidation;
use super::catalog::ResourceType;
use super::cluster::{Cluster, ClusterState, DeleteOpts, ListQuery, WriteCtx};
use super::discovery;
use super::eviction;
use super::openapi;
use super::patch::PatchType;
use super::protobuf;
use super::status::ApiError;
use super::table;
use super::watch::{self, WatchQuery};

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
    Version,
    Health,
    CoreVersions,
    Groups,
    Group(String),
    ResourceList(String, String),
    OpenApiV2,
    OpenApiV3Root,
    OpenApiV3(String, String),
    Resource(Box<ResourcePath>),
}

fn parse_target(app: &App, path: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match segs.as_slice() {
        ["version"] => Ok(Target::Version),
        ["healthz" | "livez" | "readyz", ..] => Ok(Target::Health),
        ["api"] => Ok(Target::CoreVersions),
        ["apis"] => Ok(Target::Groups),
        ["apis", g] => Ok(Target::Group(g.to_string())),
        ["api", v] => Ok(Target::ResourceList(String::new(), v.to_string())),
        ["apis", g, v] => Ok(Target::ResourceList(g.to_string(), v.to_string())),
        ["openapi", "v2"] => Ok(Target::OpenApiV2),
        ["openapi", "v3"] => Ok(Target::OpenApiV3Root),
        ["openapi", "v3", "api", v] => Ok(Target::OpenApiV3(String::new(), v.to_string())),
        ["openapi", "v3", "apis", g, v] => Ok(Target::OpenApiV3(g.to_string(), v.to_string())),
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
    let namespaced_plural = |plural: &str| find(plural).filter(|rt| rt.namespaced);
    let (rt, namespace, name, sub) = match rest {
        ["namespaces", ns, plural, tail @ ..] if namespaced_plural(plural).is_some() => {
            let rt = namespaced_plural(plural).ok_or_else(|| ApiError::no_route(path))?;
            match tail {
                [] => (rt, Some(ns.to_string()), None, ""),
                [name] => (rt, Some(ns.to_string()), Some(name.to_string()), ""),
                [name, sub] => (rt, Some(ns.to_string()), Some(name.to_string()), *sub),
                _ => return Err(ApiError::no_route(path)),
            }
        }
        [plural, tail @ ..] => {
            let rt = find(plural).ok_or_else(|| ApiError::no_route(path))?;
            match tail {
                [] => (rt, None, None, ""),
                [name] if !rt.namespaced => (rt, None, Some(name.to_string()), ""),
                [name, sub] if !rt.namespaced => (rt, None, Some(name.to_string()), *sub),
                _ => return Err(ApiError::no_route(path)),
            }
        }
        [] => return Err(ApiError::no_route(path)),
    };
    let allowed_sub = match sub {
        "" => true,
        "status" => rt.status_subresource,
        "eviction" | "binding" => rt.group.is_empty() && rt.plural == "pods",
        "finalize" => rt.group.is_empty() && rt.plural == "namespaces",
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
    let user_agent = header(header::USER_AGENT);
    let content_type = header(header::CONTENT_TYPE);
    let accept = header(header::ACCEPT);
    let response = match parse_target(&app, &path) {
        Err(e) => e.into_response(),
        Ok(Target::Resource(rp)) => match resource(
            &app,
            &method,
            &rp,
            &query,
            &headers,
            &user_agent,
            &content_type,
            &accept,
            &body,
        ) {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        Ok(other) => non_resource(&app, other, &accept),
    };
    tracing::debug!(%method, %path, query = uri.query().unwrap_or_default(), %accept, status = response.status().as_u16(), "request");
    response
}

fn non_resource(app: &App, target: Target, accept: &str) -> Response {
    let aggregated = accept.contains("as=APIGroupDiscoveryList") && accept.contains("v=v2;");
    let state = app.cluster.lock();
    let found = |v: Option<Value>| match v {
        Some(v) => json_response(StatusCode::OK, &v),
        None => ApiError::no_route("discovery").into_response(),
    };
    match target {
        Target::Version => json_response(StatusCode::OK, &discovery::version()),
        Target::Health => (StatusCode::OK, "ok").into_response(),
        Target::CoreVersions | Target::Groups if aggregated => {
            let core = matches!(target, Target::CoreVersions);
            let body = discovery::aggregated(&state.catalog, core);
            (
                StatusCode::OK,
                [(
                    header::CONTENT_TYPE,
                    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
                )],
                body.to_string(),
            )
                .into_response()
        }
        Target::CoreVersions => {
            json_response(StatusCode::OK, &discovery::core_versions(&app.address))
        }
        Target::Groups => json_response(StatusCode::OK, &discovery::group_list(&state.catalog)),
        Target::Group(g) => found(discovery::group(&state.catalog, &g)),
        Target::ResourceList(g, v) => found(discovery::resource_list(&state.catalog, &g, &v)),
        Target::OpenApiV2 => ApiError::no_route("/openapi/v2").into_response(),
        Target::OpenApiV3Root => json_response(StatusCode::OK, &openapi::v3_root(&state.catalog)),
        Target::OpenApiV3(g, v) => found(openapi::v3_group_version(&state.catalog, &g, &v)),
        Target::Resource(_) => ApiError::no_route("resource").into_response(),
    }
}

fn field_manager(query: &HashMap<String, String>, user_agent: &str) -> String {
    query
        .get("fieldManager")
        .cloned()
        .unwrap_or_else(|| user_agent.split('/').next().unwrap_or_default().to_string())
}

fn list_query(query: &HashMap<String, String>) -> ListQuery {
    ListQuery {
        label_selector: query.get("labelSelector").cloned(),
        field_selector: query.get("fieldSelector").cloned(),
        limit: query.get("limit").and_then(|l| l.parse().ok()),
        continue_token: query.get("continue").cloned(),
        resource_version: query.get("resourceVersion").cloned(),
        resource_version_match: query.get("resourceVersionMatch").cloned(),
    }
}

/// Run a write under the state lock, collecting the warnings it produced, and wake the
/// background controllers.
fn write<T>(
    app: &App,
    f: impl FnOnce(&mut ClusterState) -> Result<T, ApiError>,
) -> Result<(T, Vec<String>), ApiError> {
    let mut state = app.cluster.lock();
    state.warnings.clear();
    let result = f(&mut state);
    let warnings = std::mem::take(&mut state.warnings);
    drop(state);
    app.cluster.wake.notify_one();
    result.map(|v| (v, warnings))
}

/// Add `Warning: 299 - "..."` headers, as the real server does for dropped unknown fields.
fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}

fn decode_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    if content_type.starts_with(protobuf::CONTENT_TYPE) {
        return protobuf::decode(body);
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

#[allow(clippy::too_many_arguments)]
fn resource(
    app: &App,
    method: &Method,
    rp: &ResourcePath,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    user_agent: &str,
    content_type: &str,
    accept: &str,
    body: &[u8],
) -> Result<Response, ApiError> {
    let _ = headers;
    let rt = &rp.rt;
    let ns = rp.namespace.as_deref().unwrap_or_default();
    let dry_run = query.get("dryRun").is_some_and(|d| d == "All");
    let ctx = WriteCtx {
        manager: field_manager(query, user_agent),
        dry_run,
        subresource: if rp.subresource == "status" {
            "status".into()
        } else {
            String::new()
        },
        field_validation: FieldValidation::parse(query.get("fieldValidation").map(String::as_str)),
    };
    let wants_table = accept.contains("as=Table");
    let wants_metadata = accept.contains("as=PartialObjectMetadata");
    let respond = |code: StatusCode, v: &Value| -> Response {
        if wants_table && method == Method::GET {
            json_response(
                code,
                &table::render(rt, v, query.get("includeObject").map(String::as_str)),
            )
        } else if wants_metadata {
            json_response(code, &partial_metadata(v))
        } else {
            json_response(code, v)
        }
    };
    match (method.as_str(), rp.name.as_deref()) {
        ("GET", None) => {
            if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
                let wq = WatchQuery {
                    list: list_query(query),
                    resource_version: query.get("resourceVersion").cloned(),
                    bookmarks: query
                        .get("allowWatchBookmarks")
                        .is_some_and(|b| b == "true"),
                    send_initial_events: query
                        .get("sendInitialEvents")
                        .is_some_and(|b| b == "true"),
                    timeout: query
                        .get("timeoutSeconds")
                        .and_then(|t| t.parse().ok())
                        .map(Duration::from_secs),
                    as_table: wants_table
                        .then(|| query.get("includeObject").cloned().unwrap_or_default()),
                };
                let interval = app.cluster.lock().options.bookmark_interval;
                return watch::watch(
                    &app.cluster,
                    rt,
                    rp.namespace.as_deref(),
                    wq,
                    interval,
                    app.stop.clone(),
                );
            }
            let list = app
                .cluster
                .lock()
                .list(rt, rp.namespace.as_deref(), &list_query(query))?;
            Ok(respond(StatusCode::OK, &list))
        }
        ("GET", Some(name)) => {
            let obj = app.cluster.lock().get(rt, ns, name)?;
            Ok(respond(StatusCode::OK, &obj))
        }
        ("POST", None) => {
            let input = decode_body(content_type, body)?;
            let (obj, warnings) = write(app, |s| s.create(rt, ns, input, &ctx))?;
            Ok(with_warnings(respond(StatusCode::CREATED, &obj), &warnings))
        }
        ("POST", Some(name)) if rp.subresource == "eviction" => {
            let result = eviction::evict(
                &mut app.cluster.lock(),
                rt,
                ns,
                name,
                &decode_body(content_type, body)?,
            )?;
            app.cluster.wake.notify_one();
            Ok(json_response(StatusCode::CREATED, &result))
        }
        ("POST", Some(name)) if rp.subresource == "binding" => {
            let result = eviction::bind(
                &mut app.cluster.lock(),
                rt,
                ns,
                name,
                &decode_body(content_type, body)?,
                &ctx,
            )?;
            app.cluster.wake.notify_one();
            Ok(json_response(StatusCode::CREATED, &result))
        }
        ("PUT", Some(name)) => {
            let input = decode_body(content_type, body)?;
            let (obj, warnings) = write(app, |s| s.update(rt, ns, name, input, &ctx))?;
            Ok(with_warnings(respond(StatusCode::OK, &obj), &warnings))
        }
        ("PATCH", Some(name)) => {
            let patch_type = PatchType::from_content_type(content_type)?;
            let force = query.get("force").is_some_and(|f| f == "true");
            let ((obj, created), warnings) = write(app, |s| {
                s.patch(rt, ns, name, patch_type, body, force, &ctx)
            })?;
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(with_warnings(respond(code, &obj), &warnings))
        }
        ("DELETE", name) => {
            let mut opts = DeleteOpts {
                grace_period_seconds: query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()),
                propagation: query.get("propagationPolicy").cloned(),
                dry_run,
                ..Default::default()
            };
            if !body.is_empty() {
                opts.merge_body(&decode_body(content_type, body)?);
            }
            let mut state = app.cluster.lock();
            let result = match name {
                Some(name) => state.delete(rt, ns, name, &opts)?,
                None => state.delete_collection(
                    rt,
                    rp.namespace.as_deref(),
                    &list_query(query),
                    &opts,
                )?,
            };
            drop(state);
            app.cluster.wake.notify_one();
            Ok(json_response(StatusCode::OK, &result))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {})",
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
