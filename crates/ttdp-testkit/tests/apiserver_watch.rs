//! Watch: event streams, resume from a resourceVersion, selector transitions, and kube-runtime's
//! watcher (list-watch and streaming lists) over all of it.
//!
//! Kubernetes behaviour only: every test runs against the real control plane of
//! `ttdp_testkit::launcher::test_kubeconfig` (`TTDP_TEST_KUBECONFIG`, else one started for the
//! test process). The watched objects are ConfigMaps in the test's own
//! namespace carrying the test's run label (selected by it): nothing else writes them, whereas
//! on a real cluster controllers update new Node objects (node IPAM, node lifecycle), which
//! would add events.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use std::time::Duration;

use apiserver_support::Target;
use apiserver_support::target::RUN_LABEL;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};

async fn next<S>(stream: &mut S) -> WatchEvent<ConfigMap>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("watch event within 5s")
        .expect("stream still open")
        .expect("event decodes")
}

fn label_patch(k: &str, v: &str) -> Patch<Value> {
    Patch::Merge(json!({"metadata": {"labels": {k: v}}}))
}

/// A ConfigMap with `labels` plus the test's run label.
fn configmap(t: &Target, name: &str, labels: Value) -> ConfigMap {
    let mut labels = labels;
    labels[RUN_LABEL] = json!(t.namespace());
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

fn named(ev: &WatchEvent<ConfigMap>) -> (&'static str, String) {
    match ev {
        WatchEvent::Added(c) => ("ADDED", c.metadata.name.clone().unwrap()),
        WatchEvent::Modified(c) => ("MODIFIED", c.metadata.name.clone().unwrap()),
        WatchEvent::Deleted(c) => ("DELETED", c.metadata.name.clone().unwrap()),
        WatchEvent::Bookmark(_) => ("BOOKMARK", String::new()),
        WatchEvent::Error(e) => ("ERROR", e.message.clone()),
    }
}

#[tokio::test]
async fn watch_from_a_resource_version_replays_later_changes_in_order() {
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    let created = cms
        .create(&PostParams::default(), &configmap(&t, "n1", json!({})))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    cms.patch("n1", &PatchParams::default(), &label_patch("a", "1"))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &configmap(&t, "n2", json!({})))
        .await
        .unwrap();
    cms.delete("n1", &DeleteParams::default()).await.unwrap();

    let wp = WatchParams::default()
        .disable_bookmarks()
        .labels(&t.run_selector());
    let mut stream = cms.watch(&wp, &rv).await.unwrap().boxed();
    match next(&mut stream).await {
        WatchEvent::Modified(n) => assert_eq!(n.metadata.labels.unwrap()["a"], "1"),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    assert_eq!(named(&next(&mut stream).await), ("ADDED", "n2".to_owned()));
    assert_eq!(
        named(&next(&mut stream).await),
        ("DELETED", "n1".to_owned())
    );

    // Live events follow the replay.
    cms.create(&PostParams::default(), &configmap(&t, "n3", json!({})))
        .await
        .unwrap();
    assert_eq!(named(&next(&mut stream).await), ("ADDED", "n3".to_owned()));
}

#[tokio::test]
async fn objects_leaving_or_entering_a_label_selector_show_as_deleted_and_added() {
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    cms.create(
        &PostParams::default(),
        &configmap(&t, "n1", json!({"pool": "a"})),
    )
    .await
    .unwrap();
    let mut stream = cms
        .watch(
            &WatchParams::default()
                .disable_bookmarks()
                .labels(&t.own("pool=a")),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next(&mut stream).await, WatchEvent::Added(_)));
    cms.patch("n1", &PatchParams::default(), &label_patch("pool", "b"))
        .await
        .unwrap();
    // Mirrors the watch cache: an object that stops matching is sent as DELETED.
    assert!(matches!(next(&mut stream).await, WatchEvent::Deleted(_)));
    cms.patch("n1", &PatchParams::default(), &label_patch("pool", "a"))
        .await
        .unwrap();
    assert!(matches!(next(&mut stream).await, WatchEvent::Added(_)));
}

/// Waits until a list at resourceVersion 0, served from the API server's watch cache, shows
/// `name`. kube-runtime's watcher starts its list or streaming list at resourceVersion 0 ("any
/// version"), so an object written just before may otherwise arrive after the initial events.
async fn wait_for_the_watch_cache(cms: &Api<ConfigMap>, t: &Target, name: &str) {
    let params = kube::api::ListParams::default()
        .labels(&t.run_selector())
        .match_any();
    for _ in 0..100 {
        let list = cms.list(&params).await.unwrap();
        if list
            .items
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(name))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the watch cache never showed {name}");
}

async fn watcher_sees_lifecycle(config: fn(&Target) -> watcher::Config) {
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    cms.create(&PostParams::default(), &configmap(&t, "before", json!({})))
        .await
        .unwrap();
    wait_for_the_watch_cache(&cms, &t, "before").await;
    let mut events = watcher::watcher(cms.clone(), config(&t)).boxed();
    let mut seen = Vec::new();
    let writer = cms.clone();
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
                .create(&PostParams::default(), &configmap(&t, "after", json!({})))
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
    watcher_sees_lifecycle(|t| watcher::Config::default().labels(&t.run_selector())).await;
}

#[tokio::test]
async fn kube_runtime_watcher_works_with_streaming_lists() {
    // sendInitialEvents=true: initial ADDED events end with the k8s.io/initial-events-end bookmark.
    watcher_sees_lifecycle(|t| {
        watcher::Config::default()
            .labels(&t.run_selector())
            .streaming_lists()
    })
    .await;
}
