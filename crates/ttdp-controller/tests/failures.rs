//! Failures reach the user, on a real control plane: what the API server refuses, what the
//! DaemonSet controller cannot create and what the scheduler cannot place show in the policy's
//! status (a condition, the nodes' messages) and Events, in Kubernetes' own words.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::collections::BTreeMap;

use harness::{Harness, STEP, condition, node_entry, tt_node};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use ttdp_api::NodeState;
use ttdp_api::names;
use ttdp_testkit::sim::Workload;

/// The reasons of the Events recorded about `policy`.
async fn event_notes(h: &Harness, policy: &str) -> Vec<(String, String)> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.client.clone());
    let list = events.list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(policy))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// A DaemonSet the API server refuses (its namespace does not exist): the policy's
/// `Reconciled` condition turns False with the server's message, a Warning Event says the same,
/// and once the namespace exists it turns True again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemonset_the_api_server_refuses_is_reported_in_status_and_events() {
    let h = Harness::start_with(
        |p| vec![tt_node(p).loaded("2.7.0")],
        |s| s.namespace.push_str("-late"),
    )
    .await;
    let late = h.settings.namespace.clone();
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    let p = h
        .wait_policy(&policy, "Reconciled False", STEP, |p| {
            condition(p, "Reconciled").is_some_and(|c| c.0 == "False")
        })
        .await;
    let (_, reason, message) = condition(&p, "Reconciled").unwrap();
    assert_eq!(reason, "DaemonSetApplyFailed");
    assert!(
        message.contains(&format!("namespaces \"{late}\" not found"))
            && message.contains("HTTP 404"),
        "the API server's words: {message}"
    );
    let (ready, ready_reason, _) = condition(&p, "Ready").unwrap();
    assert_eq!(
        (ready.as_str(), ready_reason.as_str()),
        ("False", "DaemonSetApplyFailed")
    );
    let notes = tokio::time::timeout(STEP, async {
        loop {
            let notes = event_notes(&h, &policy).await;
            if notes.iter().any(|(r, _)| r == "DaemonSetApplyFailed") {
                return notes;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("a DaemonSetApplyFailed Event on the policy");
    let (_, note) = notes
        .iter()
        .find(|(r, _)| r == "DaemonSetApplyFailed")
        .unwrap();
    assert!(note.contains("not found"), "{note}");
    harness::create_namespace(&h.client, &late).await;
    let p = h.wait_ready(&policy, STEP).await;
    assert_eq!(condition(&p, "Reconciled").unwrap().0, "True");
    h.shutdown().await;
}

/// The DaemonSet controller cannot create agent pods (their ServiceAccount does not exist):
/// every node says so with the DaemonSet's FailedCreate message, until the account exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_pods_the_daemonset_controller_cannot_create_are_reported() {
    let h = Harness::start_with(
        |p| (0..2).map(|_| tt_node(p)).collect(),
        |s| s.agent_service_account = "missing-agent-sa".into(),
    )
    .await;
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    let nodes = h.nodes();
    let p = h
        .wait_policy(&policy, "FailedCreate on every node", STEP, |p| {
            nodes.iter().all(|n| {
                node_entry(p, n).is_some_and(|e| e.reason.as_deref() == Some("FailedCreate"))
            })
        })
        .await;
    for node in &nodes {
        let e = node_entry(&p, node).unwrap();
        assert_eq!(e.state, NodeState::Pending, "{e:?}");
        let message = e.message.as_deref().unwrap();
        assert!(
            message.contains("serviceaccount \"missing-agent-sa\" not found"),
            "the DaemonSet controller's words: {message}"
        );
    }
    // Create the account, and nudge the DaemonSet controller (it retries failed creations
    // with a growing back-off; an update of the DaemonSet makes it try at once).
    let sa: ServiceAccount = serde_json::from_value(
        json!({"metadata": {"name": "missing-agent-sa", "namespace": h.namespace}}),
    )
    .unwrap();
    Api::<ServiceAccount>::namespaced(h.client.clone(), &h.namespace)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    Api::<DaemonSet>::namespaced(h.client.clone(), &h.namespace)
        .patch(
            &names::daemonset_name(&policy),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"ttdp.test/nudge": "1"}}})),
        )
        .await
        .unwrap();
    h.wait_ready(&policy, STEP * 2).await;
    h.shutdown().await;
}

/// The scheduler cannot place the agent pod (the node's CPU is taken by a pod of the same
/// priority, which it will not preempt): the node says so with the scheduler's message, until
/// the CPU is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_pod_the_scheduler_cannot_place_is_reported() {
    let h = Harness::start(|p| vec![tt_node(p)]).await;
    let node = h.nodes()[0].clone();
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), h.cluster.namespace());
    let hog = Workload::new("cpu-hog", &node);
    let mut filler = hog.pod(h.cluster.namespace(), None).unwrap();
    let spec = filler.spec.as_mut().unwrap();
    spec.priority_class_name = Some("system-node-critical".into());
    spec.containers[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(BTreeMap::from([("cpu".to_owned(), Quantity("8".into()))])),
        ..Default::default()
    });
    pods.create(&PostParams::default(), &filler).await.unwrap();
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    let p = h
        .wait_policy(&policy, "the node unschedulable", STEP, |p| {
            node_entry(p, &node).is_some_and(|e| e.reason.as_deref() == Some("Unschedulable"))
        })
        .await;
    let message = node_entry(&p, &node).unwrap().message.clone().unwrap();
    assert!(
        message.contains("Insufficient cpu"),
        "the scheduler's words: {message}"
    );
    pods.delete("cpu-hog", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_ready(&policy, STEP * 2).await;
    h.shutdown().await;
}

/// A failure-budget halt belongs to its version: two nodes fail on 2.9.0 (its tag cannot be
/// fetched) with one slot, which halts the rollout; a new `spec.version` starts a new rollout
/// that those failures do not halt, and every node ends on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_is_not_halted_by_the_failures_of_the_last() {
    let h = Harness::start(|p| (0..3).map(|_| tt_node(p).loaded("2.7.0")).collect()).await;
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    h.wait_ready(&policy, STEP).await;
    let nodes = h.nodes();
    h.patch_spec(&policy, json!({"version": "2.9.0"})).await;
    h.wait_policy(
        &policy,
        "the rollout halted by two failures",
        STEP * 2,
        |p| condition(p, "Degraded").is_some_and(|c| c.0 == "True" && c.1 == "RolloutHalted"),
    )
    .await;
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    let p = h.wait_ready(&policy, STEP * 3).await;
    for node in &nodes {
        let entry = node_entry(&p, node).unwrap();
        assert_eq!(entry.state, NodeState::Done, "{entry:?}");
        assert_eq!(entry.current_version.as_deref(), Some("2.8.0"), "{entry:?}");
    }
    let (degraded, reason, _) = condition(&p, "Degraded").unwrap();
    assert_eq!(
        (degraded.as_str(), reason.as_str()),
        ("False", "NoFailures")
    );
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}
