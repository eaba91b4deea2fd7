//! `watch` and `--watch`: keeps a local copy of the policies (and, for `nodes`, the Nodes) from
//! API watches through kube-runtime's reflector, and redraws whenever they change. No polling:
//! a redraw happens only when the server sends an event, and only if the text differs.

use std::io::Write;
use std::sync::Arc;

use futures::{FutureExt, StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use ttdp_api::TenstorrentDriverPolicy;

use crate::cli::Output;
use crate::connection::Connection;
use crate::error::Error;
use crate::fleet::{Fleet, NodeFacts, PolicyView, policy_name};
use crate::render::RenderOptions;
use crate::run::NO_POLICIES;
use crate::view::{self, Request, View};

/// ANSI: cursor home, clear screen.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// Where and how redraws go.
#[derive(Debug, Clone, Copy)]
pub struct Screen {
    /// Clear the terminal before each redraw (stdout is a terminal, table output).
    pub clear: bool,
}

/// Whether a store has received its first complete list.
fn is_ready<K: kube::Resource + Clone>(store: &Store<K>) -> bool
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// A fleet from the reflectors' stores, limited to `only` when given.
fn snapshot(
    policies: &Store<TenstorrentDriverPolicy>,
    nodes: Option<&Store<Node>>,
    only: Option<&str>,
) -> Fleet {
    let mut list: Vec<Arc<TenstorrentDriverPolicy>> = policies.state();
    list.retain(|p| only.is_none_or(|o| policy_name(p) == o));
    list.sort_by(|a, b| policy_name(a).cmp(policy_name(b)));
    Fleet {
        policies: list
            .into_iter()
            .map(|p| PolicyView {
                policy: (*p).clone(),
                daemonset: None,
            })
            .collect(),
        nodes: nodes
            .map(|s| {
                s.state()
                    .iter()
                    .map(|n| NodeFacts::from(n.as_ref()))
                    .map(|n| (n.name.clone(), n))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// One redraw of `text` after `last`: the screen cleared first, a YAML document separator, or
/// a blank line between two tables.
fn frame(screen: Screen, output: Output, last: &str, text: &str) -> String {
    match (screen.clear, output) {
        (true, Output::Table | Output::Wide) => format!("{CLEAR}{text}"),
        (_, Output::Yaml) => format!("---\n{text}"),
        (false, Output::Table | Output::Wide) if !last.is_empty() => format!("\n{text}"),
        _ => text.to_owned(),
    }
}

/// Watches until interrupted or stdout closes, writing a redraw to `out` on every change.
/// `opts_at` gives the render options of each redraw (the clock moves).
pub async fn run(
    conn: &Connection,
    request: Request<'_>,
    screen: Screen,
    opts_at: impl Fn() -> RenderOptions,
    out: &mut impl Write,
    err: &mut impl Write,
) -> Result<(), Error> {
    let Request {
        view, only, output, ..
    } = request;
    // Fail fast, with the usual messages, if the CRD is missing, the policy does not exist or
    // RBAC denies the list; the watches below would only retry these forever.
    match only {
        Some(name) => drop(conn.policy(name).await?),
        None => drop(conn.policies().await?),
    }

    let (policy_store, policy_writer) = reflector::store();
    let policy_api: Api<TenstorrentDriverPolicy> = Api::all(conn.client.clone());
    let policy_events = watcher(policy_api, watcher::Config::default())
        .default_backoff()
        .reflect(policy_writer)
        .map(|e| e.map(|_| ()).map_err(|e| e.to_string()))
        .boxed();

    let (node_store, node_stream) = if view == View::Nodes {
        let (store, writer) = reflector::store();
        let api: Api<Node> = Api::all(conn.client.clone());
        let events = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .map(|e| e.map(|_| ()).map_err(|e| e.to_string()))
            .boxed();
        (Some(store), events)
    } else {
        (None, stream::empty().boxed())
    };

    let mut changes = stream::select(policy_events, node_stream).ready_chunks(1024);
    let mut last = String::new();
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let batch = tokio::select! {
            _ = &mut interrupted => return Ok(()),
            batch = changes.next() => batch,
        };
        let Some(batch) = batch else { return Ok(()) };
        for problem in batch.iter().filter_map(|r| r.as_ref().err()) {
            // The watcher backs off and resumes by itself; tell the user it is retrying.
            let _ = writeln!(err, "warning: watch interrupted, retrying: {problem}");
        }
        let ready = is_ready(&policy_store) && node_store.as_ref().is_none_or(is_ready);
        if !ready {
            continue;
        }
        let fleet = snapshot(&policy_store, node_store.as_ref(), only);
        let text = if fleet.policies.is_empty() && matches!(output, Output::Table | Output::Wide) {
            format!("{NO_POLICIES}\n")
        } else {
            view::render_request(&fleet, &request, &opts_at())?
        };
        if text == last {
            continue;
        }
        let frame = frame(screen, output, &last, &text);
        match out.write_all(frame.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => {}
            // The reader went away (`| head`, a closed terminal): stop quietly, as kubectl does.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(Error::Write(e)),
        }
        last = text;
    }
}
