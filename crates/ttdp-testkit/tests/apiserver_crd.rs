//! CustomResourceDefinitions: dynamic discovery, custom resources (cluster-scoped and
//! namespaced), schema defaults and pruning, structural validation and CEL rules with the real
//! 422 shape, status subresource, and CRD deletion removing its objects.
//!
//! Kubernetes behaviour only: every test runs against the real control plane of
//! `ttdp_testkit::launcher::test_kubeconfig` (`TTDP_TEST_KUBECONFIG`, else one started for the
//! test process; each test's CRDs live in a group of its own).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use apiserver_support::{Target, eventually, gadget_crd, install_crd, widget_crd};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};

fn widget(t: &Target, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": format!("{}/v1", t.group()), "kind": "Widget", "metadata": {"name": name}, "spec": spec})).unwrap()
}

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_created_crd_is_established_and_served_in_discovery() {
    let t = Target::start().await;
    let client = t.client();
    install_crd(&client, widget_crd(&t)).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        await_condition(
            crds,
            &format!("widgets.{}", t.group()),
            conditions::is_crd_established(),
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let group = t.group();
    let discovery = Discovery::new(client)
        .filter(&[&group])
        .run()
        .await
        .unwrap();
    let (ar, caps) = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| ar.kind == "Widget" && ar.group == group)
        .expect("Widget discovered");
    assert_eq!(
        (ar.group.as_str(), ar.version.as_str(), ar.plural.as_str()),
        (group.as_str(), "v1", "widgets")
    );
    assert_eq!(caps.scope, Scope::Cluster);
    assert!(
        caps.subresources.iter().any(|(s, _)| s.plural == "status"),
        "{:?}",
        caps.subresources
    );
}

#[tokio::test]
async fn schema_defaults_are_applied_and_unknown_fields_pruned() {
    let t = Target::start().await;
    let client = t.client();
    let ar = install_crd(&client, widget_crd(&t)).await;
    let widgets: Api<DynamicObject> = Api::all_with(client, &ar);
    let created = widgets
        .create(
            &PostParams::default(),
            &widget(&t, "w", json!({"version": "1.2.3", "bogus": true})),
        )
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"],
        json!({"version": "1.2.3", "maxUnavailable": 1, "mode": "auto"})
    );
    assert_eq!(created.metadata.generation, Some(1));
}

#[tokio::test]
async fn schema_violations_are_422_invalid_with_causes_per_field() {
    let t = Target::start().await;
    let client = t.client();
    let ar = install_crd(&client, widget_crd(&t)).await;
    let widgets: Api<DynamicObject> = Api::all_with(client, &ar);
    let err = api_error(
        widgets
            .create(
                &PostParams::default(),
                &widget(
                    &t,
                    "w",
                    json!({"version": "v1", "mode": "fast", "maxUnavailable": -1}),
                ),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message
            .starts_with(&format!("Widget.{} \"w\" is invalid: [", t.group())),
        "{}",
        err.message
    );
    let details = err.details.unwrap();
    assert_eq!(
        (
            details.name.as_str(),
            details.group.as_str(),
            details.kind.as_str()
        ),
        ("w", t.group().as_str(), "Widget")
    );
    let causes: Vec<(String, String, String)> = details
        .causes
        .into_iter()
        .map(|c| (c.reason, c.field, c.message))
        .collect();
    assert!(
        causes.contains(&(
            "FieldValueInvalid".into(),
            "spec.version".into(),
            "Invalid value: \"v1\": spec.version in body should match '^[0-9]+[.][0-9]+[.][0-9]+$'"
                .into()
        )),
        "{causes:?}"
    );
    assert!(
        causes.contains(&(
            "FieldValueNotSupported".into(),
            "spec.mode".into(),
            "Unsupported value: \"fast\": supported values: \"auto\", \"manual\", \"locked\""
                .into()
        )),
        "{causes:?}"
    );
    assert!(causes.iter().any(|(_, f, m)| f == "spec.maxUnavailable" && m.contains("greater than or equal to 0")), "{causes:?}");

    let missing = api_error(
        widgets
            .create(&PostParams::default(), &widget(&t, "w", json!({})))
            .await
            .unwrap_err(),
    );
    let cause = &missing.details.unwrap().causes[0];
    assert_eq!(
        (
            cause.reason.as_str(),
            cause.field.as_str(),
            cause.message.as_str()
        ),
        ("FieldValueRequired", "spec.version", "Required value")
    );
}

#[tokio::test]
async fn cel_rules_reject_invalid_objects_and_transition_rules_see_old_self() {
    let t = Target::start().await;
    let client = t.client();
    let ar = install_crd(&client, widget_crd(&t)).await;
    let widgets: Api<DynamicObject> = Api::all_with(client, &ar);
    let err = api_error(
        widgets
            .create(
                &PostParams::default(),
                &widget(&t, "w", json!({"version": "1.0.0", "maxUnavailable": 11})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    let cause = &err.details.unwrap().causes[0];
    assert_eq!(cause.field, "spec");
    assert_eq!(
        cause.message,
        "Invalid value: maxUnavailable must be at most 10"
    );

    // Transition rule: a locked widget cannot change mode; creating it locked is fine.
    widgets
        .create(
            &PostParams::default(),
            &widget(&t, "w", json!({"version": "1.0.0", "mode": "locked"})),
        )
        .await
        .unwrap();
    let err = api_error(
        widgets
            .patch(
                "w",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"mode": "auto"}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("a locked widget cannot change mode"),
        "{}",
        err.message
    );
    // Other changes pass and bump generation.
    let ok = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": "1.0.1"}})),
        )
        .await
        .unwrap();
    assert_eq!(ok.metadata.generation, Some(2));
}

#[tokio::test]
async fn custom_resource_updates_need_a_resource_version() {
    let t = Target::start().await;
    let client = t.client();
    let ar = install_crd(&client, widget_crd(&t)).await;
    let widgets: Api<DynamicObject> = Api::all_with(client, &ar);
    widgets
        .create(
            &PostParams::default(),
            &widget(&t, "w", json!({"version": "1.0.0"})),
        )
        .await
        .unwrap();
    let err = api_error(
        widgets
            .replace(
                "w",
                &PostParams::default(),
                &widget(&t, "w", json!({"version": "1.0.1"})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains(
            "metadata.resourceVersion: Invalid value: 0: must be specified for an update"
        ),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn namespaced_custom_resources_without_status_subresource_keep_status_on_the_main_resource() {
    let t = Target::start().await;
    let client = t.client();
    let ar = install_crd(&client, gadget_crd(&t)).await;
    let gadgets: Api<DynamicObject> = Api::default_namespaced_with(client.clone(), &ar);
    let g: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{}/v1", t.group()), "kind": "Gadget", "metadata": {"name": "g"},
        "spec": {"anything": {"goes": 1}}, "status": {"phase": "New"}
    }))
    .unwrap();
    let created = gadgets.create(&PostParams::default(), &g).await.unwrap();
    assert_eq!(created.data["status"]["phase"], "New");
    assert_eq!(created.metadata.namespace.as_deref(), Some(t.namespace()));
    // Without a status subresource, a status change is a spec-like change: generation moves.
    let after = gadgets
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Old"}})),
        )
        .await
        .unwrap();
    assert_eq!(after.metadata.generation, Some(2));
    let other_ns: Api<DynamicObject> = Api::namespaced_with(client, "kube-system", &ar);
    assert!(other_ns.get_opt("g").await.unwrap().is_none());
}

#[tokio::test]
async fn deleting_a_crd_removes_its_custom_resources_and_its_discovery_entry() {
    let t = Target::start().await;
    let client = t.client();
    let ar = install_crd(&client, widget_crd(&t)).await;
    let widgets: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    widgets
        .create(
            &PostParams::default(),
            &widget(&t, "w", json!({"version": "1.0.0"})),
        )
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_name = format!("widgets.{}", t.group());
    crds.delete(&crd_name, &DeleteParams::default())
        .await
        .unwrap();
    // A real server first deletes the custom resources (its customresourcecleanup finalizer).
    eventually(30, || async {
        crds.get_opt(&crd_name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let err = api_error(widgets.get("w").await.unwrap_err());
    assert_eq!(err.code, 404);
    // Discovery catches up asynchronously: for a moment the group may still be listed while
    // its version already answers 404 (which fails a discovery run).
    let group = t.group();
    eventually(30, || async {
        let discovery = Discovery::new(client.clone())
            .filter(&[&group])
            .run()
            .await
            .ok()?;
        (!discovery
            .groups()
            .flat_map(|g| g.recommended_resources())
            .any(|(ar, _)| ar.kind == "Widget" && ar.group == group))
        .then_some(())
    })
    .await;
}
