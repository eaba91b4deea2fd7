//! The log request of `logs NODE`, end to end through HTTP: the control plane the e2e tests
//! run has no kubelet to serve a pod's log, so here a stand-in API server answers the pod list
//! and the pod's `log` subresource, and records what the plugin asked for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use kubectl_tt_driver::{Cli, run};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The agent's log as the stand-in server gives it.
const LOG: &str = "{\"msg\":\"module loaded\"}\n{\"msg\":\"validated 4 devices\"}\n";

/// The pod list: one agent pod of policy `fleet` on node `n1`, with a sidecar beside the
/// agent container (so the plugin must name the container).
fn pod_list() -> String {
    json!({
        "apiVersion": "v1", "kind": "PodList", "metadata": {},
        "items": [{
            "metadata": {"name": "ttdrv-fleet-x7k2p", "namespace": "ops",
                         "labels": {"driver.tenstorrent.com/policy": "fleet"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "agent"}, {"name": "sidecar"}]},
        }],
    })
    .to_string()
}

/// Serves requests until the test ends, recording each request's target.
async fn serve(listener: TcpListener, seen: Arc<Mutex<Vec<String>>>) {
    loop {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && socket.read(&mut byte).await.unwrap() == 1 {
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let target = head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        seen.lock().unwrap().push(target.clone());
        let (status, body) = if target.starts_with("/api/v1/pods?") {
            ("200 OK", pod_list())
        } else if target.starts_with("/api/v1/namespaces/ops/pods/ttdrv-fleet-x7k2p/log?") {
            ("200 OK", LOG.to_owned())
        } else {
            (
                "404 Not Found",
                json!({"kind": "Status", "code": 404}).to_string(),
            )
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(answer.as_bytes()).await.unwrap();
        socket.shutdown().await.ok();
    }
}

#[tokio::test]
async fn logs_asks_for_the_agent_containers_log_and_prints_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn(serve(listener, seen.clone()));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kubeconfig");
    std::fs::write(
        &config,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {{}}\n"
        ),
    )
    .unwrap();
    let cli = Cli::try_parse_args([
        "kubectl-tt-driver",
        "--kubeconfig",
        config.to_str().unwrap(),
        "logs",
        "n1",
        "-f",
        "--tail",
        "20",
        "--previous",
    ])
    .unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    run(cli, &mut out, &mut err).await.unwrap();
    assert_eq!(String::from_utf8(out).unwrap(), LOG);
    assert_eq!(String::from_utf8(err).unwrap(), "");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert!(
        seen[0].contains("labelSelector=driver.tenstorrent.com%2Fpolicy")
            && seen[0].contains("fieldSelector=spec.nodeName%3Dn1"),
        "the agent pods on n1: {}",
        seen[0]
    );
    let log = &seen[1];
    for part in [
        "container=agent",
        "follow=true",
        "tailLines=20",
        "previous=true",
    ] {
        assert!(log.contains(part), "{part} missing in {log}");
    }
}
