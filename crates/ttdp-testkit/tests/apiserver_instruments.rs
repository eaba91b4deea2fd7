//! In-process only: tests of the test API server's own instruments (the request recorder,
//! forced compaction, bookmark timing, completing graceful pod deletion when no kubelet runs,
//! the state of a fresh server). Fault injection lives in the fault proxy, tested on the real
//! control plane (`tests/fault_proxy.rs`). They test the testkit, not Kubernetes, and
//! need a `TestApiServer` of their own, so they never run against `TTDP_TEST_KUBECONFIG`; the
//! Kubernetes behaviour each one mirrors is named on it. Every other `apiserver_*` suite is
//! portable and also runs against a real cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use std::time::Duration;

use apiserver_support::{eventually, kubectl, node, pod};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
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
async fn the_recorder_shows_who_wrote_what() {
    let server = TestApiServer::start().await.unwrap();
    let mut config = server.config().unwrap();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static("ttdp-agent/0.1"),
    ));
    let client = kube::Client::try_from(config).unwrap();
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let pp = PatchParams::apply("ttdp-agent");
    let cfg = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"x": "1"}}});
    nodes.patch("n1", &pp, &Patch::Apply(&cfg)).await.unwrap();
    nodes.get("n1").await.unwrap();

    let writes = server.recorder().writes();
    let summary: Vec<(String, String, String, u16)> = writes
        .iter()
        .map(|r| (r.verb.clone(), r.resource.clone(), r.name.clone(), r.status))
        .collect();
    assert_eq!(
        summary,
        [
            (
                "create".to_string(),
                "nodes".to_string(),
                String::new(),
                201
            ),
            (
                "patch".to_string(),
                "nodes".to_string(),
                "n1".to_string(),
                200
            )
        ]
    );
    let patch = &writes[1];
    assert_eq!(patch.user_agent, "ttdp-agent/0.1");
    assert!(patch.query.contains("fieldManager=ttdp-agent"));
    assert_eq!(patch.content_type, "application/apply-patch+yaml");
    assert_eq!(patch.body.as_ref().unwrap()["metadata"]["labels"]["x"], "1");
    assert_eq!(server.recorder().by_user_agent("ttdp-agent").len(), 3);
    server.recorder().clear();
    assert!(server.recorder().requests().is_empty());
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_410_expired() {
    // Mirrors etcd compaction and the watch cache's limited window: a watch from a version the
    // server no longer has gets 410 Expired. A real cluster cannot be made to compact on demand,
    // so this needs the in-process server's `compact_history`.
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
    // Mirrors the watch cache's BOOKMARK events (allowWatchBookmarks), which a real server sends
    // about once a minute with the current resourceVersion of the whole resource; the 100 ms
    // interval and "the bookmark carries n2's version" hold only on a server nobody else writes.
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
async fn without_a_kubelet_the_server_completes_graceful_deletion_itself() {
    // Stands in for the kubelet's final delete (PodTermination::Server, the default), which a
    // real cluster leaves to the node's kubelet.
    let server = TestApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(server.client().await.unwrap());
    pods.create(&PostParams::default(), &pod("p1", "n1", json!({})))
        .await
        .unwrap();
    assert!(
        pods.delete("p1", &DeleteParams::default())
            .await
            .unwrap()
            .is_left()
    );
    eventually(5, || async {
        pods.get_opt("p1").await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_fresh_server_has_exactly_the_default_namespaces() {
    // Mirrors a new cluster's namespaces; a shared real cluster has more (the portable check that
    // these exist and are Active is in apiserver_crud.rs).
    let server = TestApiServer::start().await.unwrap();
    let ns: Api<Namespace> = Api::all(server.client().await.unwrap());
    let names: Vec<String> = ns
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
}

#[tokio::test]
async fn kubectl_drain_evicts_through_the_eviction_subresource() {
    // The recorder shows how kubectl drain removes pods: by POSTing evictions (which is what
    // makes PodDisruptionBudgets apply), not by deleting them.
    let server = TestApiServer::start().await.unwrap();
    let client = server.client().await.unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    for name in ["p1", "p2"] {
        pods.create(&PostParams::default(), &pod(name, "n1", json!({})))
            .await
            .unwrap();
    }
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(server.kubeconfig_path())
            .args(["drain", "n1", "--force", "--timeout=30s"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("kubectl drain finishes within 60s")
    .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let evictions = server
        .recorder()
        .filter(|r| r.subresource == "eviction" && r.status == 201);
    assert_eq!(evictions.len(), 2, "{evictions:?}");
    let deletes = server.recorder().filter(|r| {
        r.verb == "delete" && r.resource == "pods" && r.user_agent.starts_with("kubectl")
    });
    assert!(
        deletes.is_empty(),
        "kubectl deleted pods itself: {deletes:?}"
    );
}
