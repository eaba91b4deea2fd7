//! Pausing, on the real control plane: nothing changes state while a policy is paused, whatever
//! else changes in its spec, and a pause holds nobody out of service (a node in flight finishes
//! its upgrade and is uncordoned).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::Duration;

use harness::{Harness, STEP, condition, node_entry, node_state, tt_node};
use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use ttdp_api::NodeState::*;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::annotations;

fn loaded(
    version: &'static str,
    n: usize,
) -> impl Fn(&str) -> Vec<ttdp_testkit::sim::TenstorrentNode> {
    move |prefix| (0..n).map(|_| tt_node(prefix).loaded(version)).collect()
}

fn cordoned(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
        || n.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotations::CORDONED_BY))
}

async fn wait_paused(h: &Harness, policy: &str) {
    h.wait_policy(policy, "Paused condition", STEP, |p| {
        condition(p, "Paused").is_some_and(|c| c.0 == "True")
    })
    .await;
}

/// The natural "stage it, unpause in the window" workflow: pause, change the version, wait
/// longer than a step may take, unpause. While paused every node stays Done on the old version,
/// none is cordoned, and none fails for waiting; once unpaused the rollout runs as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_staged_while_paused_moves_no_node_until_unpaused() {
    let h = Harness::start(loaded("2.7.0", 3)).await;
    let policy = h
        .create_policy(
            "fleet",
            "2.7.0",
            json!({"upgradePolicy": {"nodeTimeoutSeconds": 3}}),
        )
        .await;
    h.wait_ready(&policy, STEP).await;
    let nodes = h.nodes();
    h.patch_spec(&policy, json!({"paused": true})).await;
    wait_paused(&h, &policy).await;
    h.monitor.reset();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    // Longer than nodeTimeoutSeconds, so a node wrongly started would also have failed by now.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let p = h.policies().get(&policy).await.unwrap();
    for node in &nodes {
        let entry = node_entry(&p, node).unwrap();
        assert_eq!(
            entry.state, Done,
            "{node} left Done while paused: {entry:?}"
        );
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.7.0"));
        assert!(!cordoned(&h.node_api().get(node).await.unwrap()), "{node}");
        assert!(
            h.monitor.sequence(&policy, node).iter().all(|s| *s == Done),
            "{node} went through {:?} while paused",
            h.monitor.sequence(&policy, node)
        );
    }
    assert_eq!(
        h.monitor.max_cordoned(),
        0,
        "nothing is cordoned while paused"
    );
    h.patch_spec(&policy, json!({"paused": false})).await;
    let p = h.wait_ready(&policy, STEP * 3).await;
    for node in &nodes {
        assert_eq!(node_state(&p, node), Some(Done), "{node}");
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.8.0"));
    }
    assert_eq!(h.monitor.max_cordoned(), 1);
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

/// A pause that lands while a node is being drained: that node finishes its drain and its
/// upgrade and is uncordoned during the pause; the other node does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_draining_when_paused_finishes_and_is_uncordoned() {
    let h = Harness::start(loaded("2.7.0", 2)).await;
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    h.wait_ready(&policy, STEP).await;
    let nodes = h.nodes();
    h.device_workload("inference-0", &nodes[0]).await;
    h.blocking_budget().await;
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    h.wait_policy(&policy, "drain blocked by the budget", STEP, |p| {
        node_state(p, &nodes[0]) == Some(Draining)
    })
    .await;
    h.patch_spec(&policy, json!({"paused": true})).await;
    wait_paused(&h, &policy).await;
    h.delete_budget().await;
    let finished = |p: &TenstorrentDriverPolicy| node_state(p, &nodes[0]) == Some(Done);
    let p = h
        .wait_policy(
            &policy,
            "the drained node Done while paused",
            STEP * 2,
            finished,
        )
        .await;
    assert_eq!(h.kmd_version(&nodes[0]).await.as_deref(), Some("2.8.0"));
    assert!(!cordoned(&h.node_api().get(&nodes[0]).await.unwrap()));
    let other = node_entry(&p, &nodes[1]).unwrap();
    assert_eq!(other.state, Pending, "{other:?}");
    assert_eq!(other.reason.as_deref(), Some("Paused"), "{other:?}");
    assert_eq!(h.kmd_version(&nodes[1]).await.as_deref(), Some("2.7.0"));
    assert!(!cordoned(&h.node_api().get(&nodes[1]).await.unwrap()));
    h.patch_spec(&policy, json!({"paused": false})).await;
    h.wait_ready(&policy, STEP * 2).await;
    assert_eq!(h.monitor.max_cordoned(), 1);
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}
