//! Leader election: two controller replicas, one Lease; only the leader acts, the other stands
//! by (Ready, so that a rolling update can go on) and takes over when the leader stops. Also
//! runs against a real cluster with `TTDP_TEST_KUBECONFIG`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use harness::{Harness, STEP, tt_node};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use ttdp_api::NodeState::Cordoning;
use ttdp_controller::leader::LeaderElection;
use ttdp_controller::server::Readiness;
use ttdp_controller::{RunOptions, run};

struct Replica {
    token: CancellationToken,
    ready: Readiness,
    task: tokio::task::JoinHandle<Result<(), ttdp_controller::Error>>,
}

fn replica(h: &Harness, identity: &str) -> Replica {
    let token = CancellationToken::new();
    let ready = Readiness::default();
    let options = RunOptions {
        leader_election: Some(LeaderElection {
            lease_name: "ttdp-controller".into(),
            namespace: h.namespace.clone(),
            identity: identity.into(),
            duration_seconds: 3,
        }),
        readiness: Some(ready.clone()),
        instance: Some(identity.into()),
        ..RunOptions::default()
    };
    let task = tokio::spawn(run(
        h.client.clone(),
        h.settings.clone(),
        options,
        token.clone(),
    ));
    Replica { token, ready, task }
}

async fn holder(h: &Harness) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(h.client.clone(), &h.namespace);
    leases
        .get_opt("ttdp-controller")
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_acts_and_the_follower_takes_over() {
    let h = Harness::start_idle(|p| vec![tt_node(p).loaded("2.7.0")], |_| {}).await;
    let a = replica(&h, "replica-a");
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    h.wait_ready(&policy, STEP).await;
    assert_eq!(holder(&h).await.as_deref(), Some("replica-a"));
    let b = replica(&h, "replica-b");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        a.ready.get() && !a.ready.is_standing_by(),
        "the leader is ready"
    );
    assert!(
        b.ready.get() && b.ready.is_standing_by(),
        "the follower is ready, standing by for the lease"
    );
    assert_eq!(holder(&h).await.as_deref(), Some("replica-a"));

    a.token.cancel();
    tokio::time::timeout(Duration::from_secs(20), a.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    tokio::time::timeout(STEP, async {
        while b.ready.is_standing_by() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the follower takes over");
    assert_eq!(holder(&h).await.as_deref(), Some("replica-b"));
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    h.wait_ready(&policy, STEP * 2).await;
    assert_eq!(h.kmd_version(&h.nodes()[0]).await.as_deref(), Some("2.8.0"));
    b.token.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), b.task).await;
    h.shutdown().await;
}

/// A free loopback address for a replica's admin server.
fn free_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// `GET /readyz` over real HTTP: the status code and the body (None: nothing listens yet).
async fn readyz(address: SocketAddr) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    let request = "GET /readyz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    Some((code, body))
}

const STANDING_BY: &str = "ready: standing by for the leader lease";
const LEADING: &str = "ready";

/// Waits until `/readyz` at `address` answers 200 with the body `says`.
async fn wait_readyz(address: SocketAddr, says: &str, timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let answer = readyz(address).await;
        if answer
            .as_ref()
            .is_some_and(|(code, body)| *code == 200 && body.trim() == says)
        {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "/readyz at {address} never said {says:?} in {timeout:?}; last: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a rolling update of the controller's Deployment does, with the real binary: a second
/// process stands by and answers `/readyz` 200 while the first leads; the leader, stopped with
/// SIGTERM in the middle of a rollout, hands the Lease over within the lease duration; the new
/// leader finishes the rollout, and no node is drained or upgraded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_process_is_ready_and_takes_over_a_rollout_when_the_leader_stops() {
    let h = Harness::start_idle(
        |p| (0..2).map(|_| tt_node(p).loaded("2.7.0")).collect(),
        |_| {},
    )
    .await;
    let logs = tempfile::tempdir().unwrap();
    let (at_a, at_b) = (free_address(), free_address());
    let mut a = h.spawn_controller_replica("replica-a", at_a, &logs.path().join("a.log"));
    a.wait_ready(STEP).await;
    let (policy, nodes, removals) = h.nodes_holding_their_devices().await;

    let mut b = h.spawn_controller_replica("replica-b", at_b, &logs.path().join("b.log"));
    wait_readyz(at_b, STANDING_BY, STEP).await;
    assert_eq!(readyz(at_a).await, Some((200, LEADING.to_owned())));
    assert_eq!(holder(&h).await.as_deref(), Some("replica-a"));

    h.monitor.reset();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    tokio::time::timeout(STEP, async {
        while !h.monitor.sequence(&policy, &nodes[0]).contains(&Cordoning) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the first node's upgrade starts");
    a.signal("TERM");
    let stopped = Instant::now();
    tokio::time::timeout(Duration::from_secs(20), async {
        while a.running() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the leader exits on SIGTERM");
    // The binary's lease lasts 15 s: the standby must lead before it would have expired.
    let took_over = wait_readyz(at_b, LEADING, Duration::from_secs(15)).await;
    assert_eq!(holder(&h).await.as_deref(), Some("replica-b"));
    eprintln!(
        "the standby led {:?} after the leader's SIGTERM ({took_over:?} of polling)",
        stopped.elapsed()
    );
    b.assert_running();

    let p = h.wait_ready(&policy, STEP * 2).await;
    h.assert_upgraded_once(&p, &nodes, &removals).await;
    drop(b);
    h.shutdown().await;
}
