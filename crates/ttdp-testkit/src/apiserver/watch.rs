//! Watch: a chunked stream of `{"type": ..., "object": ...}` lines. Starts with synthetic ADDED
//! events (no `resourceVersion`, or `0`), or resumes after a `resourceVersion` from the kept
//! history (an ERROR event with a 410 `Expired` status when it is too old), then follows changes
//! until `timeoutSeconds` (default 30 minutes) or shutdown. No BOOKMARKs are sent, as a server
//! may; streaming lists (`sendInitialEvents`) are refused by the routes: kube-rs and kubectl
//! fall back to list-then-watch.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use futures::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::catalog::ResourceType;
use super::cluster::Cluster;
use super::selectors::Selection;
use super::status::ApiError;
use super::store::Change;

/// The event type a change shows as through `selection`, if any.
fn event_type(selection: &Selection, change: &Change) -> Option<&'static str> {
    let now = !change.deleted && selection.matches(&change.object);
    let before = change.previous.iter().any(|p| selection.matches(p));
    match (before, now) {
        (true, true) => Some("MODIFIED"),
        (false, true) => Some("ADDED"),
        (true, false) => Some("DELETED"),
        (false, false) => None,
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

/// Start a watch of `rt` from `resource_version`; returns the streaming body.
pub fn watch(
    cluster: &Cluster,
    rt: &ResourceType,
    selection: Selection,
    resource_version: &str,
    timeout_seconds: Option<u64>,
    stop: CancellationToken,
) -> Result<Body, ApiError> {
    let storage = rt.storage_key();
    let state = cluster.lock();
    let initial: Vec<Bytes> = if resource_version.is_empty() || resource_version == "0" {
        let objects = state.store.list(&storage, selection.namespace());
        let selected = objects.into_iter().filter(|o| selection.matches(o));
        selected.map(|o| line("ADDED", o)).collect()
    } else {
        let since: u64 = resource_version.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid resource version: {resource_version}"))
        })?;
        match state.store.changes_since(&storage, since) {
            Ok(changes) => (changes.iter())
                .filter_map(|c| Some(line(event_type(&selection, c)?, &c.object)))
                .collect(),
            Err(compacted) => {
                let message = format!("too old resource version: {since} ({compacted})");
                let gone = line("ERROR", &ApiError::new(410, "Expired", message).body());
                return Ok(Body::from(gone));
            }
        }
    };
    let changes = futures::stream::unfold(state.store.subscribe(), |mut rx| async move {
        // A watcher too slow to keep up is closed; clients re-list, as with the real server's
        // watch cache.
        rx.recv().await.ok().map(|change| (change, rx))
    });
    drop(state);
    let live = changes.filter_map(move |change| {
        let kind = (change.storage == storage).then(|| event_type(&selection, &change));
        futures::future::ready(kind.flatten().map(|kind| line(kind, &change.object)))
    });
    let timeout = Duration::from_secs(timeout_seconds.unwrap_or(1800));
    let end = async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(timeout) => {}
        }
    };
    let events = futures::stream::iter(initial).chain(live).take_until(end);
    Ok(Body::from_stream(events.map(Ok::<_, Infallible>)))
}
