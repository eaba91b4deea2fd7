//! Watch: a chunked stream of `{"type": ..., "object": ...}` lines. Starts with synthetic ADDED
//! events (no `resourceVersion`, or `0`), or resumes after a `resourceVersion` from the kept
//! history (an ERROR event with a 410 `Expired` status when it is too old), then follows changes,
//! with periodic BOOKMARKs when asked for. Streaming lists (`sendInitialEvents`) are refused
//! by the routes: kube-rs and kubectl fall back to list-then-watch.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::SinkExt;
use futures::channel::mpsc;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::catalog::ResourceType;
use super::cluster::{Cluster, ListQuery};
use super::selectors::Selector;
use super::status::ApiError;
use super::store::{Change, ChangeKind};

/// Watch parameters from the query string.
#[derive(Debug, Clone, Default)]
pub struct WatchQuery {
    /// Selectors.
    pub list: ListQuery,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
}

struct Filter {
    storage: String,
    namespace: Option<String>,
    labels: Selector,
    fields: Selector,
}

impl Filter {
    fn matches(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns))
            && self.labels.matches_labels(&obj["metadata"]["labels"])
            && self.fields.matches_fields(obj)
    }

    /// The event type a change shows as through this filter, if any.
    fn event_type(&self, change: &Change) -> Option<&'static str> {
        if change.storage != self.storage {
            return None;
        }
        let now = self.matches(&change.object);
        let before = change.previous.as_ref().is_some_and(|p| self.matches(p));
        match change.kind {
            ChangeKind::Added => now.then_some("ADDED"),
            ChangeKind::Deleted => before.then_some("DELETED"),
            ChangeKind::Modified => match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            },
        }
    }
}

/// One watch event line, `type` first as a real API server writes it: clients decoding the
/// adjacently tagged event (kube's `WatchEvent`) can then read the object straight into its
/// type, where an `object` before its `type` must first be buffered whole.
fn line(kind: &str, object: &Value) -> Bytes {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        object: &'a Value,
    }
    let mut s = serde_json::to_vec(&Line { kind, object }).unwrap_or_default();
    s.push(b'\n');
    Bytes::from(s)
}

fn bookmark(rt: &ResourceType, revision: u64) -> Value {
    let metadata = json!({"resourceVersion": revision.to_string()});
    json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": metadata})
}

/// Start a watch and return the streaming response.
pub fn watch(
    cluster: &Cluster,
    rt: &ResourceType,
    namespace: Option<&str>,
    q: WatchQuery,
    bookmark_interval: Duration,
    stop: CancellationToken,
) -> Result<Response, ApiError> {
    let filter = Filter {
        storage: rt.storage_key(),
        namespace: namespace.filter(|_| rt.namespaced).map(str::to_string),
        labels: Selector::parse(q.list.label_selector.as_deref().unwrap_or_default())?,
        fields: Selector::parse(q.list.field_selector.as_deref().unwrap_or_default())?,
    };
    let mut initial: Vec<Bytes> = Vec::new();
    let (mut rx, mut last_revision) = {
        let state = cluster.lock();
        let current = state.store.revision();
        let rv = q.resource_version.as_deref().unwrap_or_default();
        if rv.is_empty() || rv == "0" {
            for obj in state
                .store
                .list(&filter.storage, filter.namespace.as_deref())
            {
                if filter.matches(obj) {
                    initial.push(line("ADDED", obj));
                }
            }
        } else {
            let since: u64 = rv
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
            match state.store.changes_since(&filter.storage, since) {
                Some(changes) => {
                    for change in changes {
                        if let Some(kind) = filter.event_type(&change) {
                            initial.push(line(kind, &change.object));
                        }
                    }
                }
                None => {
                    let gone = ApiError::gone(format!(
                        "too old resource version: {since} ({})",
                        state.store.compacted_revision()
                    ));
                    initial.push(line("ERROR", &gone.body()));
                    let body =
                        futures::stream::iter(initial.into_iter().map(Ok::<_, std::io::Error>));
                    return Ok(streaming(Body::from_stream(body)));
                }
            }
        }
        (state.store.subscribe(), current)
    };
    let (mut tx, body_rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let rt = rt.clone();
    tokio::spawn(async move {
        for chunk in initial {
            if tx.send(Ok(chunk)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(q.timeout.unwrap_or(Duration::from_secs(1800)));
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(bookmark_interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = stop.cancelled() => return,
                _ = ticker.tick(), if q.bookmarks => {
                    if tx.send(Ok(line("BOOKMARK", &bookmark(&rt, last_revision)))).await.is_err() {
                        return;
                    }
                }
                change = rx.recv() => match change {
                    Ok(change) => {
                        last_revision = last_revision.max(change.revision);
                        if let Some(kind) = filter.event_type(&change)
                            && tx.send(Ok(line(kind, &change.object))).await.is_err()
                        {
                            return;
                        }
                    }
                    // A watcher too slow to keep up is closed; clients re-list, as with the
                    // real server's watch cache.
                    Err(_) => return,
                },
            }
        }
    });
    Ok(streaming(Body::from_stream(body_rx)))
}

fn streaming(body: Body) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}
