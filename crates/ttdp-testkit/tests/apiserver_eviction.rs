//! The eviction subresource with PodDisruptionBudgets, and PDB status, through kube-rs.
//!
//! Kubernetes behaviour only: every test runs against the real control plane of
//! `ttdp_testkit::launcher::test_kubeconfig` (`TTDP_TEST_KUBECONFIG`, else one started for the
//! test process). Pods are bound to a node name no kubelet serves and the
//! tests write their status, as a kubelet would; evicted pods stay terminating, as on a real
//! cluster without a kubelet for their node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use apiserver_support::target::RUN_LABEL;
use apiserver_support::{Target, eventually, pod};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use kube::api::{Api, EvictParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

async fn running_ready_pods(t: &Target, pods: &Api<Pod>, names: &[&str], ready: bool) {
    for name in names {
        pods.create(
            &PostParams::default(),
            &pod(name, &t.name("n1"), json!({"app": "w"})),
        )
        .await
        .unwrap();
        let status = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": if ready { "True" } else { "False" }}
        ]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap();
    }
}

fn pdb(name: &str, spec: Value) -> PodDisruptionBudget {
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": "w"}});
    serde_json::from_value(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name}, "spec": spec})).unwrap()
}

/// Waits until the budget's status covers its current generation and `expected_pods` pods.
/// Mirrors the real eviction subresource, which answers 429 ("the disruption budget is still
/// being processed by the server") until the disruption controller has written that status.
async fn observed(
    pdbs: &Api<PodDisruptionBudget>,
    name: &str,
    expected_pods: i32,
) -> PodDisruptionBudgetStatus {
    eventually(30, || async {
        let pdb = pdbs.get(name).await.unwrap();
        let generation = pdb.metadata.generation;
        pdb.status
            .filter(|s| s.observed_generation == generation && s.expected_pods == expected_pods)
    })
    .await
}

#[tokio::test]
async fn eviction_without_a_budget_deletes_the_pod_gracefully() {
    let t = Target::start().await;
    let pods: Api<Pod> = Api::default_namespaced(t.client());
    running_ready_pods(&t, &pods, &["p1"], true).await;
    pods.evict("p1", &EvictParams::default()).await.unwrap();
    let p = pods.get("p1").await.unwrap();
    assert!(
        p.metadata.deletion_timestamp.is_some(),
        "evicted = deleted with the pod's grace period"
    );
}

#[tokio::test]
async fn eviction_that_would_break_the_budget_is_429_with_the_real_body() {
    let t = Target::start().await;
    let client = t.client();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client);
    running_ready_pods(&t, &pods, &["p1", "p2"], true).await;
    pdbs.create(
        &PostParams::default(),
        &pdb("budget", json!({"minAvailable": 2})),
    )
    .await
    .unwrap();
    observed(&pdbs, "budget", 2).await;

    let err = match pods.evict("p1", &EvictParams::default()).await.unwrap_err() {
        kube::Error::Api(s) => s,
        other => panic!("{other:?}"),
    };
    assert_eq!((err.code, err.reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(
        err.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let cause = &err.details.unwrap().causes[0];
    assert_eq!(cause.reason, "DisruptionBudget");
    assert_eq!(
        cause.message,
        "The disruption budget budget needs 2 healthy pods and has 2 currently"
    );
    assert!(
        pods.get("p1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );

    let status = observed(&pdbs, "budget", 2).await;
    assert_eq!(
        (
            status.current_healthy,
            status.desired_healthy,
            status.disruptions_allowed
        ),
        (2, 2, 0)
    );
    assert_eq!(status.observed_generation, Some(1));
}

#[tokio::test]
async fn a_budget_allowing_one_disruption_allows_exactly_one_eviction() {
    let t = Target::start().await;
    let client = t.client();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client);
    running_ready_pods(&t, &pods, &["p1", "p2", "p3"], true).await;
    pdbs.create(
        &PostParams::default(),
        &pdb("budget", json!({"minAvailable": 2})),
    )
    .await
    .unwrap();
    assert_eq!(observed(&pdbs, "budget", 3).await.disruptions_allowed, 1);
    pods.evict("p1", &EvictParams::default()).await.unwrap();
    // p1 is terminating, hence no longer healthy: the budget is spent.
    let err = pods.evict("p2", &EvictParams::default()).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 429),
        "{err:?}"
    );
}

#[tokio::test]
async fn max_unavailable_percent_of_a_replica_set_allows_exactly_one_eviction() {
    // The disruption controller takes percentages of the scale of the pods' controller (bare
    // pods count as none), so the pods belong to a ReplicaSet of 3 replicas: on a real cluster
    // its controller adopts them (replacements it creates for evicted pods stay Pending, as no
    // node matches its template).
    let t = Target::start().await;
    let client = t.client();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client.clone());
    running_ready_pods(&t, &pods, &["p1", "p2", "p3"], true).await;
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "w"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "w"}},
            "template": {"metadata": {"labels": {"app": "w"}}, "spec": {
                "nodeSelector": {RUN_LABEL: t.name("no-node")},
                "containers": [{"name": "c", "image": "busybox:1.36"}]
            }}
        }
    }))
    .unwrap();
    let rs = Api::<ReplicaSet>::default_namespaced(client)
        .create(&PostParams::default(), &rs)
        .await
        .unwrap();
    // Adopt the pods as the ReplicaSet controller does (the test server runs none; on a real
    // cluster it may already have, and this writes the same controller reference).
    let adopted = json!({"metadata": {"ownerReferences": [{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w",
        "uid": rs.metadata.uid, "controller": true, "blockOwnerDeletion": true
    }]}});
    for name in ["p1", "p2", "p3"] {
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&adopted))
            .await
            .unwrap();
    }
    // 33% of 3 pods rounds up to 1 (the disruption controller rounds percentages up).
    pdbs.create(
        &PostParams::default(),
        &pdb("budget", json!({"maxUnavailable": "33%"})),
    )
    .await
    .unwrap();
    assert_eq!(observed(&pdbs, "budget", 3).await.disruptions_allowed, 1);
    pods.evict("p1", &EvictParams::default()).await.unwrap();
    // p1 is terminating, hence no longer healthy: the budget is spent.
    let err = pods.evict("p2", &EvictParams::default()).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 429),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_unready_pod_can_be_evicted_while_the_budget_is_met() {
    // policy/v1 unhealthyPodEvictionPolicy IfHealthyBudget (the default).
    let t = Target::start().await;
    let client = t.client();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client);
    running_ready_pods(&t, &pods, &["ok1"], true).await;
    running_ready_pods(&t, &pods, &["sick"], false).await;
    pdbs.create(
        &PostParams::default(),
        &pdb("budget", json!({"minAvailable": 1})),
    )
    .await
    .unwrap();
    observed(&pdbs, "budget", 2).await;
    pods.evict("sick", &EvictParams::default()).await.unwrap();
    let err = pods
        .evict("ok1", &EvictParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 429),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_pod_covered_by_two_budgets_cannot_be_evicted() {
    let t = Target::start().await;
    let client = t.client();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client);
    running_ready_pods(&t, &pods, &["p1", "p2"], true).await;
    pdbs.create(
        &PostParams::default(),
        &pdb("a", json!({"minAvailable": 0})),
    )
    .await
    .unwrap();
    pdbs.create(
        &PostParams::default(),
        &pdb("b", json!({"minAvailable": 0})),
    )
    .await
    .unwrap();
    match pods.evict("p1", &EvictParams::default()).await.unwrap_err() {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 500);
            assert!(
                s.message.contains("more than one PodDisruptionBudget"),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn evicting_a_pending_pod_ignores_budgets() {
    let t = Target::start().await;
    let client = t.client();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client);
    pods.create(
        &PostParams::default(),
        &pod("p1", &t.name("n1"), json!({"app": "w"})),
    )
    .await
    .unwrap();
    pdbs.create(
        &PostParams::default(),
        &pdb("budget", json!({"minAvailable": 5})),
    )
    .await
    .unwrap();
    pods.evict("p1", &EvictParams::default()).await.unwrap();
}
