//! The fault proxy's instruments, on the real control plane (`TTDP_TEST_KUBECONFIG`): injected
//! errors and conflicts, latency, cut watches, expired resumptions and the request record. The
//! suites that prove our components survive faults rely on each of these doing what it says.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use ttdp_testkit::fault_proxy::FaultProxy;
use ttdp_testkit::faults::Fault;
use ttdp_testkit::scratch::Scratch;

/// A scratch namespace, a proxy in front of the server, and config maps through the proxy.
async fn setup(kind: &str) -> (Scratch, FaultProxy, Api<ConfigMap>) {
    let scratch = Scratch::new(kind).await.unwrap();
    let proxy = FaultProxy::start(scratch.client()).await.unwrap();
    let maps = Api::namespaced(
        proxy.client(scratch.namespace()).unwrap(),
        scratch.namespace(),
    );
    (scratch, proxy, maps)
}

fn map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

fn api_error(e: kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason, s.message),
        other => panic!("not an API error: {other:?}"),
    }
}

#[tokio::test]
async fn injected_errors_fire_the_given_number_of_times_on_matching_requests_only() {
    let (_scratch, proxy, maps) = setup("fp-err").await;
    maps.create(&PostParams::default(), &map("a"))
        .await
        .unwrap();
    proxy.faults().inject(
        Fault::error(503)
            .verb("patch")
            .resource("configmaps")
            .times(2),
    );
    let patch = Patch::Merge(json!({"data": {"k": "w"}}));
    for _ in 0..2 {
        let (code, reason, _) = api_error(
            maps.patch("a", &PatchParams::default(), &patch)
                .await
                .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (503, "ServiceUnavailable"));
    }
    // Reads were never affected, and the budget of two is spent.
    maps.get("a").await.unwrap();
    maps.patch("a", &PatchParams::default(), &patch)
        .await
        .unwrap();
    let statuses: Vec<u16> = proxy
        .recorder()
        .filter(|r| r.verb == "patch")
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [503, 503, 200]);
}

#[tokio::test]
async fn injected_conflicts_look_like_stale_resource_versions() {
    let (_scratch, proxy, maps) = setup("fp-409").await;
    let created = maps
        .create(&PostParams::default(), &map("a"))
        .await
        .unwrap();
    proxy
        .faults()
        .inject(Fault::conflict().verb("update").name("a").times(1));
    let (code, reason, message) = api_error(
        maps.replace("a", &PostParams::default(), &created)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(
        message.contains("the object has been modified"),
        "{message}"
    );
    maps.replace("a", &PostParams::default(), &created)
        .await
        .unwrap();
}

#[tokio::test]
async fn injected_latency_delays_requests() {
    let (_scratch, proxy, maps) = setup("fp-slow").await;
    proxy
        .faults()
        .inject(Fault::latency(Duration::from_millis(1500)).verb("list"));
    let start = Instant::now();
    maps.list(&ListParams::default()).await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(1500));
    proxy.faults().clear();
    let start = Instant::now();
    maps.list(&ListParams::default()).await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(1500));
}

/// The names a watcher of `maps` delivers, and the task driving it.
fn names_seen(
    maps: Api<ConfigMap>,
) -> (
    tokio::sync::mpsc::UnboundedReceiver<String>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut events = watcher::watcher(maps, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            if let Ok(Event::Apply(m) | Event::InitApply(m)) = event {
                let _ = tx.send(m.metadata.name.unwrap_or_default());
            }
        }
    });
    (rx, driver)
}

async fn until_watching(proxy: &FaultProxy, at_least: usize) {
    let start = Instant::now();
    while proxy.recorder().filter(|r| r.verb == "watch").len() < at_least {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no watch started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn next_name(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(15), rx.recv())
        .await
        .expect("an event within 15 s")
        .expect("the watcher runs")
}

#[tokio::test]
async fn cut_watches_are_resumed_without_losing_events() {
    let (_scratch, proxy, maps) = setup("fp-cut").await;
    let (mut rx, driver) = names_seen(maps.clone());
    until_watching(&proxy, 1).await;
    proxy.faults().drop_watches();
    maps.create(&PostParams::default(), &map("while-cut"))
        .await
        .unwrap();
    // The namespace's own `kube-root-ca.crt` comes first, with the initial list.
    while next_name(&mut rx).await != "while-cut" {}
    until_watching(&proxy, 2).await;
    let lists = proxy.recorder().filter(|r| r.verb == "list").len();
    assert_eq!(
        lists, 1,
        "a cut watch resumes from its resourceVersion, without a new list"
    );
    driver.abort();
}

#[tokio::test]
async fn an_expired_resumption_makes_the_watcher_list_again() {
    let (_scratch, proxy, maps) = setup("fp-410").await;
    let (mut rx, driver) = names_seen(maps.clone());
    until_watching(&proxy, 1).await;
    proxy
        .faults()
        .inject(Fault::expired_watch("", "configmaps").times(1));
    proxy.faults().drop_watches();
    maps.create(&PostParams::default(), &map("after-expiry"))
        .await
        .unwrap();
    // The watcher relists: the new map arrives with the list (or the watch after it).
    while next_name(&mut rx).await != "after-expiry" {}
    let lists = proxy.recorder().filter(|r| r.verb == "list").len();
    assert!(
        lists >= 2,
        "the 410 Expired answer did not make the watcher list again"
    );
    driver.abort();
}

#[tokio::test]
async fn the_recorder_shows_who_wrote_what() {
    let (scratch, proxy, _) = setup("fp-rec").await;
    let mut config = kube::Config::new(proxy.url().parse().unwrap());
    config.default_namespace = scratch.namespace().to_owned();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static("ttdp-agent/0.1"),
    ));
    let maps: Api<ConfigMap> = Api::default_namespaced(kube::Client::try_from(config).unwrap());
    maps.create(&PostParams::default(), &map("a"))
        .await
        .unwrap();
    let apply = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"x": "1"}});
    maps.patch(
        "a",
        &PatchParams::apply("ttdp-agent"),
        &Patch::Apply(&apply),
    )
    .await
    .unwrap();
    maps.get("a").await.unwrap();
    let writes = proxy.recorder().writes();
    let summary: Vec<(&str, &str, &str, u16)> = writes
        .iter()
        .map(|r| {
            (
                r.verb.as_str(),
                r.resource.as_str(),
                r.name.as_str(),
                r.status,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("create", "configmaps", "", 201),
            ("patch", "configmaps", "a", 200)
        ]
    );
    let patch = &writes[1];
    assert_eq!(patch.user_agent, "ttdp-agent/0.1");
    assert!(patch.query.contains("fieldManager=ttdp-agent"));
    assert_eq!(patch.content_type, "application/apply-patch+yaml");
    assert_eq!(patch.body.as_ref().unwrap()["data"]["x"], "1");
    assert_eq!(proxy.recorder().by_user_agent("ttdp-agent").len(), 3);
}
