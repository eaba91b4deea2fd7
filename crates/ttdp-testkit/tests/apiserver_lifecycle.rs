//! Deletion: graceful pod deletion, finalizers, owner-reference garbage collection (background,
//! foreground, orphan) and namespace termination.
//!
//! Kubernetes behaviour only: every test runs against the real control plane of
//! `ttdp_testkit::launcher::test_kubeconfig` (`TTDP_TEST_KUBECONFIG`, else one started for the
//! test process). Pods are bound to node names that no kubelet serves, so
//! graceful deletions stay pending as on a real cluster until the test deletes with grace
//! period 0 (the kubelet's final delete).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use apiserver_support::target::RUN_LABEL;
use apiserver_support::{Target, eventually, pod};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use serde_json::json;

/// How long a real cluster's controllers (garbage collector, namespace controller) may take.
const CONTROLLERS: u64 = 60;

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn gone<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.unwrap().is_none()
}

fn configmap(name: &str, owner: Option<(&str, &str, bool)>) -> ConfigMap {
    let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
    if let Some((owner_name, uid, block)) = owner {
        v["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "v1", "kind": "ConfigMap", "name": owner_name, "uid": uid, "blockOwnerDeletion": block
        }]);
    }
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn a_bound_pod_terminates_gracefully_and_the_kubelet_completes_the_deletion() {
    // Mirrors the real server: a pod on a node gets deletionTimestamp + grace period and stays
    // until its kubelet deletes it with grace period 0.
    let t = Target::start().await;
    let pods: Api<Pod> = Api::default_namespaced(t.client());
    pods.create(&PostParams::default(), &pod("p1", &t.name("n1"), json!({})))
        .await
        .unwrap();
    let pending = pods
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("pod still present");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(30));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !gone(&pods, "p1").await,
        "nobody but the kubelet removes it"
    );

    // The kubelet's final delete. Pods answer a delete with the pod as it was deleted (not a
    // Status), so the proof that it went at once is that it is gone right after.
    pods.delete(
        "p1",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(gone(&pods, "p1").await, "grace period 0 removes it at once");
}

#[tokio::test]
async fn an_unscheduled_pod_is_deleted_immediately() {
    let t = Target::start().await;
    let pods: Api<Pod> = Api::default_namespaced(t.client());
    let mut p = pod("p1", "unused", json!({}));
    let spec = p.spec.as_mut().unwrap();
    spec.node_name = None;
    // A node selector no node matches, so a real scheduler cannot bind it in the meantime.
    spec.node_selector = Some([(RUN_LABEL.to_owned(), t.name("no-node"))].into());
    pods.create(&PostParams::default(), &p).await.unwrap();
    // The answer is the deleted pod (pods return the object, not a Status): gone right after.
    let deleted = pods
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("pods answer a delete with the pod");
    assert_eq!(deleted.metadata.deletion_grace_period_seconds, Some(0));
    assert!(gone(&pods, "p1").await);
}

#[tokio::test]
async fn finalizers_hold_a_deleted_object_until_removed_and_cannot_be_added_meanwhile() {
    let t = Target::start().await;
    let n1 = t.name("n1");
    let nodes: Api<Node> = Api::all(t.client());
    let mut n = t.node("n1", json!({}));
    n.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let held = nodes
        .delete(&n1, &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());

    let add =
        Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}}));
    let err = api_error(
        nodes
            .patch(&n1, &PatchParams::default(), &add)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message
            .contains("no new finalizers can be added if the object is being deleted"),
        "{}",
        err.message
    );

    let remove = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    nodes
        .patch(&n1, &PatchParams::default(), &remove)
        .await
        .unwrap();
    assert!(gone(&nodes, &n1).await);
}

#[tokio::test]
async fn background_deletion_collects_dependents_after_the_owner_is_gone() {
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    let owner = cms
        .create(&PostParams::default(), &configmap("owner", None))
        .await
        .unwrap();
    let uid = owner.metadata.uid.unwrap();
    cms.create(
        &PostParams::default(),
        &configmap("dep", Some(("owner", &uid, false))),
    )
    .await
    .unwrap();
    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    assert!(
        gone(&cms, "owner").await,
        "background: the owner goes first"
    );
    eventually(CONTROLLERS, || async {
        gone(&cms, "dep").await.then_some(())
    })
    .await;
}

#[tokio::test]
async fn foreground_deletion_keeps_the_owner_until_blocking_dependents_are_gone() {
    let t = Target::start().await;
    let client = t.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client);
    let owner = cms
        .create(&PostParams::default(), &configmap("owner", None))
        .await
        .unwrap();
    let uid = owner.metadata.uid.unwrap();
    let mut p = pod("dep", &t.name("n1"), json!({}));
    p.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid, "blockOwnerDeletion": true
    }))
    .unwrap()]);
    pods.create(&PostParams::default(), &p).await.unwrap();

    let held = cms
        .delete("owner", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(held.metadata.finalizers.unwrap(), ["foregroundDeletion"]);
    // The dependent pod is being deleted but is still terminating, so the owner stays.
    eventually(CONTROLLERS, || async {
        pods.get("dep")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
            .then_some(())
    })
    .await;
    assert!(!gone(&cms, "owner").await);
    // No kubelet serves the node: finish the pod's deletion as its kubelet would, with grace 0.
    pods.delete(
        "dep",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    eventually(CONTROLLERS, || async {
        gone(&cms, "owner").await.then_some(())
    })
    .await;
}

#[tokio::test]
async fn orphan_deletion_leaves_dependents_without_the_owner_reference() {
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    let owner = cms
        .create(&PostParams::default(), &configmap("owner", None))
        .await
        .unwrap();
    let uid = owner.metadata.uid.unwrap();
    cms.create(
        &PostParams::default(),
        &configmap("dep", Some(("owner", &uid, false))),
    )
    .await
    .unwrap();
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..Default::default()
    };
    cms.delete("owner", &dp).await.unwrap();
    eventually(CONTROLLERS, || async {
        gone(&cms, "owner").await.then_some(())
    })
    .await;
    let dep = cms.get("dep").await.unwrap();
    assert!(dep.metadata.owner_references.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_contents_then_the_namespace() {
    let t = Target::start().await;
    let client = t.client();
    let scratch = t.name("scratch");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": scratch}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &scratch);
    cms.create(&PostParams::default(), &configmap("c", None))
        .await
        .unwrap();
    let terminating = namespaces
        .delete(&scratch, &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    // Creating in a terminating namespace is forbidden (if it is still there).
    let e = api_error(
        cms.create(&PostParams::default(), &configmap("late", None))
            .await
            .unwrap_err(),
    );
    assert!(e.code == 403 || e.code == 404, "{e:?}");
    eventually(CONTROLLERS, || async {
        gone(&namespaces, &scratch).await.then_some(())
    })
    .await;
    assert!(gone(&cms, "c").await);
}
