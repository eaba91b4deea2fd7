//! Watch: event streams, resume from a resourceVersion, 410 Gone, bookmarks, selector
//! transitions, and kube-runtime's watcher (list-watch and streaming lists) over all of it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use std::time::Duration;

use apiserver_support::node;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use ttdp_testkit::apiserver::TestApiServer;

async fn next<S>(stream: &mut S) -> WatchEvent<Node>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<Node>>> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("watch event within 5s")
        .expect("stream still open")
        .expect("event decodes")
}

fn label_patch(k: &str, v: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"metadata": {"labels": {k: v}}}))
}

#[tokio::test]
async fn watch_from_a_resource_version_replays_later_changes_in_order() {
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    let created = nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    nodes
        .patch("n1", &PatchParams::default(), &label_patch("a", "1"))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node("n2", json!({})))
        .await
        .unwrap();
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();

    let mut stream = nodes
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    match next(&mut stream).await {
        WatchEvent::Modified(n) => assert_eq!(n.metadata.labels.unwrap()["a"], "1"),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    assert!(
        matches!(next(&mut stream).await, WatchEvent::Added(n) if n.metadata.name.as_deref() == Some("n2"))
    );
    assert!(
        matches!(next(&mut stream).await, WatchEvent::Deleted(n) if n.metadata.name.as_deref() == Some("n1"))
    );

    // Live events follow the replay.
    nodes
        .create(&PostParams::default(), &node("n3", json!({})))
        .await
        .unwrap();
    assert!(
        matches!(next(&mut stream).await, WatchEvent::Added(n) if n.metadata.name.as_deref() == Some("n3"))
    );
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_410_expired() {
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    let created = nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    nodes
        .patch("n1", &PatchParams::default(), &label_patch("a", "1"))
        .await
        .unwrap();
    server.compact_history();
    let rv = created.metadata.resource_version.unwrap();
    let mut stream = nodes
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    match next(&mut stream).await {
        // The real server sends the 410 as an ERROR event inside a 200 watch response.
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
            assert!(
                e.message
                    .starts_with(&format!("too old resource version: {rv}")),
                "{}",
                e.message
            );
        }
        other => panic!("expected ERROR 410, got {other:?}"),
    }
}

#[tokio::test]
async fn bookmarks_carry_the_current_resource_version() {
    let server = TestApiServer::builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let mut stream = nodes
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next(&mut stream).await, WatchEvent::Added(_)));
    let created = nodes
        .create(&PostParams::default(), &node("n2", json!({})))
        .await
        .unwrap();
    let created_rv = created.metadata.resource_version.unwrap();
    // Bookmarks may arrive at any time; the first one after ADDED n2 carries n2's version.
    let mut saw_added = false;
    loop {
        match next(&mut stream).await {
            WatchEvent::Added(n) => {
                assert_eq!(n.metadata.name.as_deref(), Some("n2"));
                saw_added = true;
            }
            WatchEvent::Bookmark(b) if saw_added => {
                assert_eq!(b.metadata.resource_version, created_rv);
                return;
            }
            WatchEvent::Bookmark(b) => {
                let rv: u64 = b.metadata.resource_version.parse().unwrap();
                assert!(
                    rv < created_rv.parse::<u64>().unwrap(),
                    "a bookmark never runs ahead of delivered events"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn objects_leaving_or_entering_a_label_selector_show_as_deleted_and_added() {
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    nodes
        .create(&PostParams::default(), &node("n1", json!({"pool": "a"})))
        .await
        .unwrap();
    let mut stream = nodes
        .watch(
            &WatchParams::default().disable_bookmarks().labels("pool=a"),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next(&mut stream).await, WatchEvent::Added(_)));
    nodes
        .patch("n1", &PatchParams::default(), &label_patch("pool", "b"))
        .await
        .unwrap();
    // Mirrors the watch cache: an object that stops matching is sent as DELETED.
    assert!(matches!(next(&mut stream).await, WatchEvent::Deleted(_)));
    nodes
        .patch("n1", &PatchParams::default(), &label_patch("pool", "a"))
        .await
        .unwrap();
    assert!(matches!(next(&mut stream).await, WatchEvent::Added(_)));
}

async fn watcher_sees_lifecycle(config: watcher::Config) {
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    nodes
        .create(&PostParams::default(), &node("before", json!({})))
        .await
        .unwrap();
    let mut events = watcher::watcher(nodes.clone(), config).boxed();
    let mut seen = Vec::new();
    let writer = nodes.clone();
    let mut wrote = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let line = match &ev {
            Event::Init => "init".to_string(),
            Event::InitApply(n) => format!("init-apply {}", n.metadata.name.clone().unwrap()),
            Event::InitDone => "init-done".to_string(),
            Event::Apply(n) => format!("apply {}", n.metadata.name.clone().unwrap()),
            Event::Delete(n) => format!("delete {}", n.metadata.name.clone().unwrap()),
        };
        seen.push(line);
        if matches!(ev, Event::InitDone) && !wrote {
            wrote = true;
            writer
                .create(&PostParams::default(), &node("after", json!({})))
                .await
                .unwrap();
            writer
                .delete("before", &DeleteParams::default())
                .await
                .unwrap();
        }
        if seen.last().map(String::as_str) == Some("delete before") {
            break;
        }
    }
    assert_eq!(
        seen,
        [
            "init",
            "init-apply before",
            "init-done",
            "apply after",
            "delete before"
        ]
    );
}

#[tokio::test]
async fn kube_runtime_watcher_works_with_list_then_watch() {
    watcher_sees_lifecycle(watcher::Config::default()).await;
}

#[tokio::test]
async fn kube_runtime_watcher_works_with_streaming_lists() {
    // sendInitialEvents=true: initial ADDED events end with the k8s.io/initial-events-end bookmark.
    watcher_sees_lifecycle(watcher::Config::default().streaming_lists()).await;
}

#[tokio::test]
async fn dropped_watches_are_resumed_by_the_watcher_without_losing_events() {
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watched = nodes.clone();
    let driver = tokio::spawn(async move {
        let mut events = watcher::watcher(watched, watcher::Config::default()).boxed();
        while let Some(ev) = events.next().await {
            if let Ok(Event::Apply(n) | Event::InitApply(n)) = ev {
                let _ = tx.send(n.metadata.name.unwrap_or_default());
            }
        }
    });
    // The watch request follows the initial list; drop it once it is open.
    apiserver_support::eventually(5, || async {
        (!server.recorder().filter(|r| r.verb == "watch").is_empty()).then_some(())
    })
    .await;
    server.faults().drop_watches();
    nodes
        .create(&PostParams::default(), &node("while-dropped", json!({})))
        .await
        .unwrap();
    let name = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name, "while-dropped");
    let watches = server
        .recorder()
        .filter(|r| r.verb == "watch" && r.resource == "nodes");
    assert!(
        watches.len() >= 2,
        "the watcher re-watched after the drop: {watches:?}"
    );
    driver.abort();
}
