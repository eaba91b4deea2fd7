//! Patches: JSON merge, JSON patch, strategic merge, and server-side apply with managed fields,
//! conflicts, force and list-map merging, through kube-rs.
//!
//! Kubernetes behaviour only: every test runs against the real control plane of
//! `ttdp_testkit::launcher::test_kubeconfig` (`TTDP_TEST_KUBECONFIG`, else one started for the
//! test process). Server-side apply's managed fields are checked on
//! ConfigMaps in the test's namespace, which no controller writes (on a real cluster
//! controllers add their own managers to new Node objects).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use apiserver_support::target::RUN_LABEL;
use apiserver_support::{Target, install_crd, node, widget_crd};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn merge_patch_sets_and_null_removes_fields() {
    let t = Target::start().await;
    let n1 = t.name("n1");
    let nodes: Api<Node> = Api::all(t.client());
    nodes
        .create(
            &PostParams::default(),
            &node(&n1, json!({"keep": "1", "drop": "2"})),
        )
        .await
        .unwrap();
    let p = Patch::Merge(
        json!({"metadata": {"labels": {"drop": null, "new": "3"}}, "spec": {"unschedulable": true}}),
    );
    let n = nodes.patch(&n1, &PatchParams::default(), &p).await.unwrap();
    let labels = n.metadata.labels.unwrap();
    assert_eq!(labels.len(), 2);
    assert_eq!(
        (labels["keep"].as_str(), labels["new"].as_str()),
        ("1", "3")
    );
    assert_eq!(n.spec.unwrap().unschedulable, Some(true));
}

#[tokio::test]
async fn json_patch_applies_operations_and_a_failed_test_is_422() {
    let t = Target::start().await;
    let n1 = t.name("n1");
    let n1 = n1.as_str();
    let nodes: Api<Node> = Api::all(t.client());
    nodes
        .create(&PostParams::default(), &node(n1, json!({"a": "1"})))
        .await
        .unwrap();
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "replace", "path": "/metadata/labels/a", "value": "2"},
        {"op": "add", "path": "/spec/taints", "value": [{"key": "k", "effect": "NoSchedule"}]}
    ]))
    .unwrap();
    let n = nodes
        .patch(n1, &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert_eq!(n.metadata.labels.unwrap()["a"], "2");
    assert_eq!(n.spec.unwrap().taints.unwrap()[0].key, "k");

    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/labels/a", "value": "1"}]))
            .unwrap();
    let err = api_error(
        nodes
            .patch(n1, &PatchParams::default(), &Patch::<()>::Json(failing))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);

    // A missing path tests equal to null (evanphx/json-patch, as the real server uses): this is
    // what kube-runtime's finalizer helper sends for an object without finalizers.
    let absent: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/f"]}
    ]))
    .unwrap();
    let n = nodes
        .patch(n1, &PatchParams::default(), &Patch::<()>::Json(absent))
        .await
        .unwrap();
    assert_eq!(n.metadata.finalizers.unwrap(), ["example.com/f"]);
}

#[tokio::test]
async fn strategic_merge_merges_containers_and_env_by_name_and_honours_patch_delete() {
    // A DaemonSet template, since pod specs themselves are immutable. A node selector no node
    // matches keeps a real DaemonSet controller from placing pods.
    let t = Target::start().await;
    let ds_api: Api<DaemonSet> = Api::default_namespaced(t.client());
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {
                "nodeSelector": {RUN_LABEL: t.name("no-node")},
                "containers": [
                {"name": "c", "image": "agent:1", "env": [{"name": "A", "value": "1"}]},
                {"name": "side", "image": "side:1"}
            ]}}
        }
    }))
    .unwrap();
    ds_api.create(&PostParams::default(), &ds).await.unwrap();

    let patch = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "c", "env": [{"name": "B", "value": "2"}]},
        {"name": "side", "$patch": "delete"}
    ]}}}, "metadata": {"finalizers": ["example.com/x"]}});
    let after = ds_api
        .patch("agent", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    let containers = after.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(containers.len(), 1);
    let env: Vec<String> = containers[0]
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    // The patch's entries come first, then those only the object had (no $setElementOrder).
    assert_eq!(env, ["B", "A"]);
    assert_eq!(containers[0].image.as_deref(), Some("agent:1"));
    assert_eq!(after.metadata.finalizers.unwrap(), ["example.com/x"]);
    assert_eq!(
        after.metadata.generation,
        Some(2),
        "a template change is a spec change"
    );
}

#[tokio::test]
async fn strategic_merge_patch_on_a_custom_resource_is_415() {
    let t = Target::start().await;
    let client = t.client();
    let ar = install_crd(&client, widget_crd(&t)).await;
    let widgets: Api<DynamicObject> = Api::all_with(client, &ar);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{}/v1", t.group()), "kind": "Widget", "metadata": {"name": "w"}, "spec": {"version": "1.2.3"}
    }))
    .unwrap();
    widgets.create(&PostParams::default(), &obj).await.unwrap();
    let err = api_error(
        widgets
            .patch(
                "w",
                &PatchParams::default(),
                &Patch::Strategic(json!({"spec": {"mode": "manual"}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (err.code, err.reason.as_str()),
        (415, "UnsupportedMediaType")
    );
}

fn apply(manager: &str) -> PatchParams {
    PatchParams::apply(manager)
}

fn configmap(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

#[tokio::test]
async fn apply_creates_then_conflicts_with_another_manager_unless_forced() {
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    let mine = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n1", "labels": {"owner": "a"}}});
    let created = cms
        .patch("n1", &apply("alpha"), &Patch::Apply(&mine))
        .await
        .unwrap();
    assert_eq!(created.metadata.labels.as_ref().unwrap()["owner"], "a");
    let mf = created.metadata.managed_fields.unwrap();
    assert_eq!(mf.len(), 1);
    assert_eq!(
        (mf[0].manager.as_deref(), mf[0].operation.as_deref()),
        (Some("alpha"), Some("Apply"))
    );
    assert_eq!(
        mf[0].fields_v1.as_ref().unwrap().0,
        json!({"f:metadata": {"f:labels": {"f:owner": {}}}})
    );

    // Same value from another manager: shared ownership, no conflict.
    let theirs_same = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n1", "labels": {"owner": "a"}}});
    cms.patch("n1", &apply("beta"), &Patch::Apply(&theirs_same))
        .await
        .unwrap();

    let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n1", "labels": {"owner": "b"}}});
    let err = api_error(
        cms.patch("n1", &apply("gamma"), &Patch::Apply(&theirs))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        err.message,
        "Apply failed with 2 conflicts: conflicts with \"alpha\":\n- .metadata.labels.owner\nconflicts with \"beta\":\n- .metadata.labels.owner"
    );
    // One cause per conflicting manager, in no promised order.
    let mut causes: Vec<(String, String, String)> = err
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| (c.reason, c.message, c.field))
        .collect();
    causes.sort();
    let cause = |manager: &str| {
        (
            "FieldManagerConflict".to_owned(),
            format!("conflict with \"{manager}\""),
            ".metadata.labels.owner".to_owned(),
        )
    };
    assert_eq!(causes, [cause("alpha"), cause("beta")]);

    let forced = cms
        .patch("n1", &apply("gamma").force(), &Patch::Apply(&theirs))
        .await
        .unwrap();
    assert_eq!(forced.metadata.labels.as_ref().unwrap()["owner"], "b");
    let managers: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(
        managers,
        ["gamma"],
        "forcing took the field from both other managers"
    );
}

#[tokio::test]
async fn fields_dropped_from_an_applied_config_are_removed_unless_someone_else_owns_them() {
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    let v1 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}}});
    cms.patch("n1", &apply("alpha"), &Patch::Apply(&v1))
        .await
        .unwrap();
    // Another manager also sets "b" through an update: it co-owns the field now.
    cms.patch(
        "n1",
        &PatchParams {
            field_manager: Some("editor".into()),
            ..Default::default()
        },
        &Patch::Merge(json!({"metadata": {"labels": {"c": "3"}}})),
    )
    .await
    .unwrap();
    let v2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n1", "labels": {"b": "2"}}});
    let after = cms
        .patch("n1", &apply("alpha"), &Patch::Apply(&v2))
        .await
        .unwrap();
    let labels = after.metadata.labels.unwrap();
    assert!(
        !labels.contains_key("a"),
        "a was only alpha's and alpha stopped applying it"
    );
    assert_eq!(labels["b"], "2");
    assert_eq!(labels["c"], "3", "fields of other managers stay");
}

#[tokio::test]
async fn update_takes_ownership_from_an_applier_without_conflict() {
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    let cfg = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n1", "labels": {"a": "1"}}});
    cms.patch("n1", &apply("alpha"), &Patch::Apply(&cfg))
        .await
        .unwrap();
    let pp = PatchParams {
        field_manager: Some("editor".into()),
        ..Default::default()
    };
    let after = cms
        .patch(
            "n1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "2"}}})),
        )
        .await
        .unwrap();
    let mf = after.metadata.managed_fields.unwrap();
    let editor = mf
        .iter()
        .find(|m| m.manager.as_deref() == Some("editor"))
        .unwrap();
    assert_eq!(editor.operation.as_deref(), Some("Update"));
    assert!(
        mf.iter().all(|m| m.manager.as_deref() != Some("alpha")),
        "alpha lost its only field: {mf:?}"
    );
    // Re-applying the old value now conflicts with the editor (an Update manager is named with
    // its apiVersion).
    let err = api_error(
        cms.patch("n1", &apply("alpha"), &Patch::Apply(&cfg))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"editor\" using v1: .metadata.labels.a"
    );
}

async fn widget_api(t: &Target) -> Api<DynamicObject> {
    let client = t.client();
    let ar = install_crd(&client, widget_crd(t)).await;
    Api::all_with(client, &ar)
}

fn status_apply(t: &Target, nodes: Value) -> Value {
    json!({"apiVersion": format!("{}/v1", t.group()), "kind": "Widget", "metadata": {"name": "w"}, "status": {"nodes": nodes}})
}

#[tokio::test]
async fn status_apply_without_a_name_takes_it_from_the_url() {
    let t = Target::start().await;
    let widgets = widget_api(&t).await;
    let w = json!({"apiVersion": format!("{}/v1", t.group()), "kind": "Widget", "metadata": {"name": "w"}, "spec": {"version": "1.0.0"}});
    widgets
        .patch("w", &apply("ctl"), &Patch::Apply(&w))
        .await
        .unwrap();
    let nameless = json!({"apiVersion": format!("{}/v1", t.group()), "kind": "Widget", "status": {"nodes": [{"name": "n1", "state": "Done"}]}});
    let after = widgets
        .patch_status("w", &apply("ctl").force(), &Patch::Apply(&nameless))
        .await
        .unwrap();
    assert_eq!(after.metadata.name.as_deref(), Some("w"));
    assert_eq!(after.data["status"]["nodes"][0]["name"], "n1");
}

#[tokio::test]
async fn status_apply_merges_list_map_entries_by_key_across_managers() {
    let t = Target::start().await;
    let widgets = widget_api(&t).await;
    let w = json!({"apiVersion": format!("{}/v1", t.group()), "kind": "Widget", "metadata": {"name": "w"}, "spec": {"version": "1.0.0"}});
    widgets
        .patch("w", &apply("ctl"), &Patch::Apply(&w))
        .await
        .unwrap();

    let a = status_apply(&t, json!([{"name": "n1", "state": "Done"}]));
    widgets
        .patch_status("w", &apply("agent-n1").force(), &Patch::Apply(&a))
        .await
        .unwrap();
    let b = status_apply(&t, json!([{"name": "n2", "state": "Upgrading"}]));
    let after = widgets
        .patch_status("w", &apply("agent-n2").force(), &Patch::Apply(&b))
        .await
        .unwrap();
    assert_eq!(
        after.data["status"]["nodes"],
        json!([{"name": "n1", "state": "Done"}, {"name": "n2", "state": "Upgrading"}])
    );
    // The owner of n1 changing its entry leaves n2 alone; dropping a key removes only its item.
    let a2 = status_apply(&t, json!([]));
    let after = widgets
        .patch_status("w", &apply("agent-n1").force(), &Patch::Apply(&a2))
        .await
        .unwrap();
    assert_eq!(
        after.data["status"]["nodes"],
        json!([{"name": "n2", "state": "Upgrading"}])
    );
    // Status applies never touch spec, and do not bump generation.
    assert_eq!(after.data["spec"]["version"], "1.0.0");
    assert_eq!(after.metadata.generation, Some(1));
    let status_entry = after
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .find(|m| m.manager.as_deref() == Some("agent-n2"))
        .unwrap();
    assert_eq!(status_entry.subresource.as_deref(), Some("status"));
}

#[tokio::test]
async fn conditions_apply_merges_by_type() {
    let t = Target::start().await;
    let widgets = widget_api(&t).await;
    let w = json!({"apiVersion": format!("{}/v1", t.group()), "kind": "Widget", "metadata": {"name": "w"}, "spec": {"version": "1.0.0"}});
    widgets
        .patch("w", &apply("ctl"), &Patch::Apply(&w))
        .await
        .unwrap();
    let c1 = json!({"apiVersion": format!("{}/v1", t.group()), "kind": "Widget", "metadata": {"name": "w"},
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Upgrading"}]}});
    widgets
        .patch_status("w", &apply("ctl").force(), &Patch::Apply(&c1))
        .await
        .unwrap();
    let c2 = json!({"apiVersion": format!("{}/v1", t.group()), "kind": "Widget", "metadata": {"name": "w"},
        "status": {"conditions": [{"type": "Degraded", "status": "False", "reason": "AsExpected"}]}});
    let after = widgets
        .patch_status("w", &apply("other").force(), &Patch::Apply(&c2))
        .await
        .unwrap();
    let types: Vec<&str> = after.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["Ready", "Degraded"]);
}

#[tokio::test]
async fn managed_fields_sent_in_an_update_replace_the_stored_ones() {
    // How kubectl migrates client-side-apply ownership to its server-side apply manager.
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    let pp = PatchParams {
        field_manager: Some("old-tool".into()),
        ..Default::default()
    };
    cms.create(
        &PostParams {
            field_manager: Some("old-tool".into()),
            ..Default::default()
        },
        &configmap("n1", json!({"a": "1"})),
    )
    .await
    .unwrap();
    let current = cms.get("n1").await.unwrap();
    let mut entries = current.metadata.managed_fields.clone().unwrap();
    assert_eq!(entries[0].manager.as_deref(), Some("old-tool"));
    entries[0].manager = Some("new-tool".into());
    entries[0].operation = Some("Apply".into());
    let patch = Patch::Merge(json!({"metadata": {"managedFields": entries}}));
    cms.patch("n1", &pp, &patch).await.unwrap();
    // new-tool now owns the label: applying a new value as new-tool does not conflict.
    let cfg = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n1", "labels": {"a": "2"}}});
    let after = cms
        .patch("n1", &apply("new-tool"), &Patch::Apply(&cfg))
        .await
        .unwrap();
    assert_eq!(after.metadata.labels.unwrap()["a"], "2");
}
