//! Leader election: two controller replicas, one Lease; only the leader acts, and the other
//! takes over when the leader stops. Also runs against a real cluster with
//! `TTDP_TEST_KUBECONFIG`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::Duration;

use harness::{Harness, STEP, tt_node};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;
use tokio_util::sync::CancellationToken;
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
    assert!(a.ready.get(), "the leader is ready");
    assert!(!b.ready.get(), "the follower does not run the controller");
    assert_eq!(holder(&h).await.as_deref(), Some("replica-a"));

    a.token.cancel();
    tokio::time::timeout(Duration::from_secs(20), a.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    tokio::time::timeout(STEP, async {
        while !b.ready.get() {
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
