//! The `drain` example program against the testkit API server: kubectl's flags and output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Output;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use ttdp_testkit::apiserver::{KUBECONFIG_CONTEXT, TestApiServer};

/// The example binary, built by `cargo test` next to the test binaries.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("examples").join("drain");
    assert!(
        path.exists(),
        "{} is missing: cargo test builds examples",
        path.display()
    );
    path
}

async fn run(server: &TestApiServer, args: &[&str]) -> (bool, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = tokio::process::Command::new(example())
        .args(args)
        .arg("--kubeconfig")
        .arg(server.kubeconfig_path())
        .args(["--context", KUBECONFIG_CONTEXT, "--timeout", "20s"])
        .output()
        .await
        .unwrap();
    (
        status.success(),
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(stderr).unwrap(),
    )
}

async fn create<K>(api: Api<K>, v: Value) -> K
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap()
}

fn pod(name: &str, owner: Option<(&str, &str, String)>) -> Value {
    let mut v = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}});
    if let Some((kind, owner, uid)) = owner {
        v["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind,
            "name": owner, "uid": uid, "controller": true}]);
    }
    v
}

fn owner_body(kind: &str, name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
}

#[tokio::test]
async fn prints_what_kubectl_drain_prints() {
    let server = TestApiServer::start().await.unwrap();
    let client = server.client().await.unwrap();
    let _: Node = create(
        Api::all(client.clone()),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
    )
    .await;
    let rs: ReplicaSet = create(
        Api::default_namespaced(client.clone()),
        owner_body("ReplicaSet", "web"),
    )
    .await;
    let ds: DaemonSet = create(
        Api::default_namespaced(client.clone()),
        owner_body("DaemonSet", "proxy"),
    )
    .await;
    let rs_uid = rs.metadata.uid.unwrap();
    let ds_uid = ds.metadata.uid.unwrap();
    let _: Pod = create(
        Api::default_namespaced(client.clone()),
        pod("web-1", Some(("ReplicaSet", "web", rs_uid))),
    )
    .await;
    let _: Pod = create(
        Api::default_namespaced(client.clone()),
        pod("proxy-n1", Some(("DaemonSet", "proxy", ds_uid))),
    )
    .await;
    let _: Pod = create(Api::default_namespaced(client.clone()), pod("bare", None)).await;

    let (ok, out, err) = run(
        &server,
        &["n1", "--dry-run", "--ignore-daemonsets", "--force"],
    )
    .await;
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "node/n1 cordoned (dry run)",
            "evicting pod default/bare (dry run)",
            "evicting pod default/web-1 (dry run)",
            "node/n1 drained (dry run)",
        ],
        "{err}"
    );
    let nodes: Api<Node> = Api::all(client.clone());
    assert_ne!(
        nodes.get("n1").await.unwrap().spec.unwrap().unschedulable,
        Some(true)
    );

    let (ok, out, err) = run(&server, &["n1", "--ignore-daemonsets"]).await;
    assert!(!ok);
    assert_eq!(out.trim(), "node/n1 cordoned");
    assert!(
        err.contains(
            "error: unable to drain node \"n1\" due to error: [cannot delete Pods that declare no controller (use --force to override): default/bare], continuing command..."
        ),
        "{err}"
    );

    let (ok, out, err) = run(&server, &["n1", "--ignore-daemonsets", "--force"]).await;
    assert!(ok, "{out}\n{err}");
    let mut lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"node/n1 already cordoned"));
    assert_eq!(lines.last(), Some(&"node/n1 drained"));
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "evicting pod default/bare",
            "evicting pod default/web-1",
            "node/n1 already cordoned",
            "node/n1 drained",
            "pod/bare evicted",
            "pod/web-1 evicted",
        ]
    );
    assert!(
        err.contains("Warning: deleting Pods that declare no controller: default/bare"),
        "{err}"
    );
    assert!(
        err.contains("Warning: ignoring DaemonSet-managed Pods: default/proxy-n1"),
        "{err}"
    );

    let (ok, out, _) = run(&server, &["n1", "--uncordon"]).await;
    assert!(ok);
    assert_eq!(out.trim(), "node/n1 uncordoned");
    assert_ne!(
        nodes.get("n1").await.unwrap().spec.unwrap().unschedulable,
        Some(true)
    );
    server.shutdown().await;
}
