//! Fault injection and the request recorder.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use std::time::{Duration, Instant};

use apiserver_support::node;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use ttdp_testkit::apiserver::{Fault, TestApiServer};

#[tokio::test]
async fn injected_errors_fire_the_given_number_of_times_on_matching_requests_only() {
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    server
        .faults()
        .inject(Fault::error(503).verb("patch").resource("nodes").times(2));
    let p = Patch::Merge(json!({"metadata": {"labels": {"a": "1"}}}));
    for _ in 0..2 {
        match nodes
            .patch("n1", &PatchParams::default(), &p)
            .await
            .unwrap_err()
        {
            kube::Error::Api(s) => {
                assert_eq!((s.code, s.reason.as_str()), (503, "ServiceUnavailable"))
            }
            other => panic!("{other:?}"),
        }
    }
    // Reads were never affected, and the budget of two is spent.
    nodes.get("n1").await.unwrap();
    nodes
        .patch("n1", &PatchParams::default(), &p)
        .await
        .unwrap();
}

#[tokio::test]
async fn injected_conflicts_look_like_stale_resource_versions() {
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    let n = nodes
        .create(&PostParams::default(), &node("n1", json!({})))
        .await
        .unwrap();
    server
        .faults()
        .inject(Fault::conflict().verb("update").name("n1").times(1));
    match nodes
        .replace("n1", &PostParams::default(), &n)
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
            assert!(
                s.message.contains("the object has been modified"),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
    nodes
        .replace("n1", &PostParams::default(), &n)
        .await
        .unwrap();
}

#[tokio::test]
async fn injected_latency_delays_requests() {
    let server = TestApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    server
        .faults()
        .inject(Fault::latency(Duration::from_millis(1500)).verb("list"));
    let start = Instant::now();
    nodes.list(&ListParams::default()).await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(1500));
    server.faults().clear();
    let start = Instant::now();
    nodes.list(&ListParams::default()).await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(1500));
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
