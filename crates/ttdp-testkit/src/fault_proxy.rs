//! A recording, fault-injecting proxy in front of a real API server.
//!
//! The real control plane keeps no request log and fails no request on demand, yet some tests
//! must prove what a component sent (only merge patches, evictions carrying the pod's UID, pods
//! listed per node) or how it copes with a 5xx, a 409 or an API the server does not serve. A
//! [`FaultProxy`] listens on loopback over plain HTTP, records every request in a [`Recorder`],
//! lets [`Faults`] (rules: group, verb, resource, subresource, name, times) answer instead of
//! the server, and forwards everything else through an admin client of the real server, streaming the answer back
//! (watches included). Only the requests of the clients made by [`FaultProxy::client`] or run
//! with [`FaultProxy::kubeconfig`] pass through it; everything else in a shared cluster talks to
//! the server directly.
//!
//! It must not be used for what a real server can do itself: a 403 comes from an identity RBAC
//! limits (see [`crate::launcher::tokens`]), a 401 from a token the server does not know.

use std::path::Path;

use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, Request, Response, StatusCode, header};
use axum::response::IntoResponse;
use kube::Client;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::apiserver::status::{ApiError, JSON, STALE};
use crate::faults::{FaultEffect, Faults};
use crate::launcher::pki::plain_http_kubeconfig;
pub use crate::recorder::{RecordedRequest, Recorder};

/// A running proxy; dropping it stops serving.
pub struct FaultProxy {
    url: String,
    shared: Upstream,
    kubeconfig: tempfile::NamedTempFile,
    stop: CancellationToken,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// What the proxy's handler shares with the [`FaultProxy`] that controls it.
#[derive(Clone)]
struct Upstream {
    client: Client,
    recorder: Recorder,
    faults: Faults,
}

impl FaultProxy {
    /// Serves on a free loopback port, forwarding to the server `upstream` talks to (with
    /// `upstream`'s credentials: give it an admin client).
    pub async fn start(upstream: Client) -> Result<FaultProxy> {
        let shared = Upstream {
            client: upstream,
            recorder: Recorder::default(),
            faults: Faults::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fault proxy to a loopback port")?;
        let url = format!("http://{}", listener.local_addr()?);
        let kubeconfig =
            plain_http_kubeconfig(&url).context("writing the fault proxy's kubeconfig")?;
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(shared.clone());
        let stop = CancellationToken::new();
        let serve =
            axum::serve(listener, app).with_graceful_shutdown(stop.clone().cancelled_owned());
        tokio::spawn(async move { serve.await });
        Ok(FaultProxy {
            url,
            shared,
            kubeconfig,
            stop,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The requests that went through the proxy.
    pub fn recorder(&self) -> Recorder {
        self.shared.recorder.clone()
    }

    /// The fault rules applied before forwarding.
    pub fn faults(&self) -> Faults {
        self.shared.faults.clone()
    }

    /// A kubeconfig (namespace `default`) naming the proxy, for kubectl.
    pub fn kubeconfig(&self) -> &Path {
        self.kubeconfig.path()
    }

    /// A client of the proxy with `namespace` as its default namespace and without kube's
    /// automatic retries (a 429 from a budget reaches the caller at once).
    pub fn client(&self, namespace: &str) -> Result<Client> {
        let mut config = kube::Config::new(self.url.parse()?);
        config.default_namespace = namespace.to_owned();
        config.default_retry = false;
        Client::try_from(config)
            .with_context(|| format!("a client of the fault proxy at {}", self.url))
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What a request path names.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Target {
    pub(crate) group: String,
    pub(crate) resource: String,
    pub(crate) subresource: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...`; `None` for discovery, `/version`,
/// OpenAPI and other non-resource paths.
fn parse_target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => ((*group).to_owned(), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, more @ ..] if !more.is_empty() => ((*ns).to_owned(), more),
        other => (String::new(), other),
    };
    let resource = rest.first()?;
    let part = |i: usize| rest.get(i).map_or_else(String::new, |p| (*p).to_owned());
    Some(Target {
        group,
        resource: (*resource).to_owned(),
        subresource: part(2),
        namespace,
        name: part(1),
    })
}

/// The Kubernetes verb of a request for `target`; "" for a non-resource path.
fn verb_of(method: &Method, target: Option<&Target>, query: &str) -> &'static str {
    let Some(target) = target else { return "" };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    match *method {
        Method::GET if watch => "watch",
        Method::GET if target.name.is_empty() => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if target.name.is_empty() => "deletecollection",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// A `Status` answer of the proxy's own, shaped as the API server's.
fn status_body(code: u16, message: &str) -> Response<Body> {
    let reason = match code {
        400 => "BadRequest",
        403 => "Forbidden",
        409 => "Conflict",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    ApiError::new(code, reason, message).into_response()
}

/// kube-apiserver's answer for a path it does not serve.
fn not_served() -> Response<Body> {
    let headers = [
        (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    (StatusCode::NOT_FOUND, headers, "404 page not found\n").into_response()
}

fn injected(code: u16, target: &Target) -> Response<Body> {
    let message = match code {
        409 => {
            let dot = if target.group.is_empty() { "" } else { "." };
            let (resource, group, name) = (&target.resource, &target.group, &target.name);
            format!("Operation cannot be fulfilled on {resource}{dot}{group} \"{name}\": {STALE}")
        }
        503 => "injected: the server is currently unable to handle the request".to_owned(),
        _ => "injected failure".to_owned(),
    };
    status_body(code, &message)
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> String {
    let value = headers.get(name).and_then(|v| v.to_str().ok());
    value.unwrap_or_default().to_owned()
}

async fn forward(State(up): State<Upstream>, request: Request<Body>) -> Response<Body> {
    let arrived = std::time::Instant::now();
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => return status_body(400, &format!("proxy: reading the body: {e}")),
    };
    let query = parts.uri.query().unwrap_or_default().to_owned();
    // Non-resource paths (discovery, /version, OpenAPI) have no verb and meet no rule.
    let target = parse_target(parts.uri.path());
    let verb = verb_of(&parts.method, target.as_ref(), &query);
    // Subscribed before forwarding: a drop asked for while the watch starts still ends it.
    let watch_drop = (verb == "watch").then(|| up.faults.watch_drops());
    let request_body = serde_json::from_slice(&body).ok();
    let response = match &target {
        Some(t) => answer(&up, &parts, body, verb, t).await,
        None => send(&up.client, &parts, body).await,
    };
    let target = target.unwrap_or_default();
    up.recorder.record(RecordedRequest {
        method: parts.method.to_string(),
        verb: verb.to_owned(),
        path: parts.uri.path().to_owned(),
        query,
        user_agent: header_text(&parts.headers, header::USER_AGENT),
        content_type: header_text(&parts.headers, header::CONTENT_TYPE),
        body: request_body,
        group: target.group,
        resource: target.resource,
        subresource: target.subresource,
        namespace: target.namespace,
        name: target.name,
        status: response.status().as_u16(),
        arrived,
    });
    match watch_drop {
        Some(drop) => ended_by(response, drop),
        None => response,
    }
}

/// The answer to a request for `target`: the first injected fault that is not a delay (after
/// the delays), or the server's.
async fn answer(
    up: &Upstream,
    parts: &Parts,
    body: Bytes,
    verb: &str,
    target: &Target,
) -> Response<Body> {
    let mut answer = None;
    for effect in up.faults.decide(verb, target) {
        match effect {
            FaultEffect::Latency(d) => tokio::time::sleep(d).await,
            other => answer = answer.or(Some(other)),
        }
    }
    match answer {
        Some(FaultEffect::Error(code)) => injected(code, target),
        Some(FaultEffect::NotServed) => not_served(),
        Some(FaultEffect::ExpiredWatch) => expired_watch(),
        Some(FaultEffect::EmptyList) => without_items(send(&up.client, parts, body).await).await,
        Some(FaultEffect::Latency(_)) | None => send(&up.client, parts, body).await,
    }
}

/// The response with its body cut off when [`Faults::drop_watches`] fires: the client sees its
/// watch stream end, as when a real server or a load balancer closes the connection.
fn ended_by(
    response: Response<Body>,
    mut drop: tokio::sync::broadcast::Receiver<()>,
) -> Response<Body> {
    use futures::StreamExt;
    let (parts, body) = response.into_parts();
    let dropped = async move {
        let _ = drop.recv().await;
    };
    let stream = body.into_data_stream().take_until(Box::pin(dropped));
    Response::from_parts(parts, Body::from_stream(stream))
}

/// kube-apiserver's watch answer for a `resourceVersion` older than its history: 200, one
/// `ERROR` event with a 410 `Expired` Status, then the end of the stream.
fn expired_watch() -> Response<Body> {
    let message = "too old resource version (injected by the fault proxy)";
    let event = json!({"type": "ERROR", "object": ApiError::new(410, "Expired", message).body()});
    (JSON, format!("{event}\n")).into_response()
}

/// Forwards the request to the server through the admin client, without the client's own
/// credentials and connection headers, and streams the answer back.
async fn send(client: &Client, parts: &Parts, body: Bytes) -> Response<Body> {
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut builder = Request::builder()
        .method(parts.method.clone())
        .uri(path_and_query);
    for (name, value) in &parts.headers {
        if matches!(
            name.as_str(),
            "host" | "connection" | "content-length" | "transfer-encoding" | "authorization"
        ) {
            continue;
        }
        builder = builder.header(name, value);
    }
    let request = match builder.body(kube::client::Body::from(body.to_vec())) {
        Ok(r) => r,
        Err(e) => return status_body(400, &format!("proxy: building the request: {e}")),
    };
    match client.send(request).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => status_body(502, &format!("proxy: forwarding to the API server: {e}")),
    }
}

/// A successful JSON list answer with its items removed (and no `continue` token); anything
/// else unchanged.
async fn without_items(response: Response<Body>) -> Response<Body> {
    if !response.status().is_success() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => return status_body(502, &format!("proxy: reading the server's list: {e}")),
    };
    let mut list: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(_) => return Response::from_parts(parts, Body::from(bytes)),
    };
    list["items"] = json!([]);
    if let Some(meta) = list
        .get_mut("metadata")
        .and_then(serde_json::Value::as_object_mut)
    {
        meta.remove("continue");
        meta.remove("remainingItemCount");
    }
    // The body is new and whole: the server's framing headers no longer apply.
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::TRANSFER_ENCODING);
    Response::from_parts(parts, Body::from(list.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_targets() {
        let t = parse_target("/api/v1/namespaces/ns/pods/p/eviction");
        assert_eq!(
            t,
            Some(Target {
                group: String::new(),
                resource: "pods".into(),
                subresource: "eviction".into(),
                namespace: "ns".into(),
                name: "p".into(),
            })
        );
        let t = parse_target("/apis/driver.tenstorrent.com/v1alpha1/tenstorrentdriverpolicies");
        assert_eq!(
            t.as_ref().map(|t| (t.group.as_str(), t.resource.as_str())),
            Some(("driver.tenstorrent.com", "tenstorrentdriverpolicies"))
        );
        assert_eq!(parse_target("/apis/apps/v1"), None);
        assert_eq!(parse_target("/version"), None);
    }
}
