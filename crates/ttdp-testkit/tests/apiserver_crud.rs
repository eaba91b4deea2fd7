//! Get, list (selectors, pagination), create, update and the status subresource, through kube-rs.
//!
//! Kubernetes behaviour only: every test runs against the real control plane of
//! `ttdp_testkit::launcher::test_kubeconfig` (`TTDP_TEST_KUBECONFIG`, else one started for the
//! test process; each test in a namespace of its own, with uniquely
//! named nodes that selectors restrict to the test's own).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use apiserver_support::target::RUN_LABEL;
use apiserver_support::{Target, pod};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, VersionMatch};
use serde_json::json;

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_stamps_metadata_and_a_second_create_is_already_exists() {
    let t = Target::start().await;
    let nodes: Api<Node> = Api::all(t.client());
    let created = nodes
        .create(&PostParams::default(), &t.node("n1", json!({})))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.uid.as_ref().unwrap().len(), 36);
    assert!(meta.creation_timestamp.is_some());
    assert!(!meta.resource_version.as_deref().unwrap().is_empty());

    let err = api_error(
        nodes
            .create(&PostParams::default(), &t.node("n1", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert_eq!(err.reason, "AlreadyExists");
    assert_eq!(
        err.message,
        format!("nodes \"{}\" already exists", t.name("n1"))
    );
}

#[tokio::test]
async fn generate_name_appends_a_random_suffix_and_generation_starts_at_one() {
    let t = Target::start().await;
    let pods: Api<Pod> = Api::default_namespaced(t.client());
    let mut p = pod("", &t.name("n1"), json!({}));
    p.metadata.name = None;
    p.metadata.generate_name = Some("work-".into());
    let created = pods.create(&PostParams::default(), &p).await.unwrap();
    let name = created.metadata.name.unwrap();
    assert!(name.starts_with("work-") && name.len() == 10, "got {name}");
    assert_eq!(created.metadata.generation, Some(1));
    // Pods are defaulted like the real server does.
    let spec = created.spec.unwrap();
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
}

#[tokio::test]
async fn get_of_a_missing_object_is_404_with_the_real_status_body() {
    let t = Target::start().await;
    let pods: Api<Pod> = Api::namespaced(t.client(), "kube-system");
    let err = api_error(pods.get("nope").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    assert_eq!(err.message, "pods \"nope\" not found");
    let details = err.details.unwrap();
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("nope", "pods")
    );
}

#[tokio::test]
async fn create_in_a_missing_namespace_is_404_namespace_not_found() {
    let t = Target::start().await;
    let ghost = t.name("ghost");
    let pods: Api<Pod> = Api::namespaced(t.client(), &ghost);
    let err = api_error(
        pods.create(&PostParams::default(), &pod("p", &t.name("n1"), json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);
    assert_eq!(err.message, format!("namespaces \"{ghost}\" not found"));
}

#[tokio::test]
async fn update_with_a_stale_resource_version_is_409_conflict() {
    // A ConfigMap, which no controller writes: on a real cluster controllers update new Node
    // objects (e.g. node IPAM sets spec.podCIDR), which would make the first update stale too.
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    let c1: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c1"}})).unwrap();
    let first = cms.create(&PostParams::default(), &c1).await.unwrap();
    let mut a = first.clone();
    a.metadata.labels = Some([("a".to_string(), "1".to_string())].into());
    cms.replace("c1", &PostParams::default(), &a).await.unwrap();
    let mut b = first;
    b.metadata.labels = Some([("b".to_string(), "1".to_string())].into());
    let err = api_error(
        cms.replace("c1", &PostParams::default(), &b)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        err.message,
        "Operation cannot be fulfilled on configmaps \"c1\": the object has been modified; please apply your changes to the latest version and try again"
    );
}

#[tokio::test]
async fn label_selectors_support_every_operator() {
    let t = Target::start().await;
    let nodes: Api<Node> = Api::all(t.client());
    for (name, labels) in [
        ("a", json!({"tier": "gpu", "zone": "1"})),
        ("b", json!({"tier": "cpu", "zone": "2"})),
        ("c", json!({"tier": "gpu", "skip": "true"})),
    ] {
        nodes
            .create(&PostParams::default(), &t.node(name, labels))
            .await
            .unwrap();
    }
    // Every selector also requires the test's run label, so only its own nodes can match.
    let names = |sel: &'static str| {
        let nodes = nodes.clone();
        let t = &t;
        async move {
            let list = nodes
                .list(&ListParams::default().labels(&t.own(sel)))
                .await
                .unwrap();
            list.items
                .into_iter()
                .map(|n| t.short(&n.metadata.name.unwrap()).to_owned())
                .collect::<Vec<_>>()
                .join(",")
        }
    };
    assert_eq!(names("tier=gpu").await, "a,c");
    assert_eq!(names("tier==gpu,!skip").await, "a");
    assert_eq!(names("tier!=gpu").await, "b");
    assert_eq!(names("zone in (1,2)").await, "a,b");
    assert_eq!(names("zone notin (1)").await, "b,c");
    assert_eq!(names("skip").await, "c");
    assert_eq!(names("zone>1").await, "b");
}

#[tokio::test]
async fn field_selectors_filter_pods_by_node_phase_and_name() {
    let t = Target::start().await;
    let client = t.client();
    let ns = t.namespace().to_owned();
    let (n1, n2) = (t.name("n1"), t.name("n2"));
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("p1", &n1, json!({})))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("p2", &n2, json!({})))
        .await
        .unwrap();
    pods.patch_status(
        "p2",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    // Across all namespaces where the selector is about the test's own objects (its node
    // names, its namespace), within its namespace otherwise: a shared cluster has other pods.
    let all: Api<Pod> = Api::all(client);
    let names = |api: &Api<Pod>, sel: String| {
        let api = api.clone();
        async move {
            let list = api.list(&ListParams::default().fields(&sel)).await.unwrap();
            list.items
                .into_iter()
                .map(|n| n.metadata.name.unwrap())
                .collect::<Vec<_>>()
                .join(",")
        }
    };
    assert_eq!(names(&all, format!("spec.nodeName={n1}")).await, "p1");
    assert_eq!(names(&pods, "status.phase=Running".into()).await, "p2");
    assert_eq!(
        names(
            &all,
            format!("status.phase!=Running,metadata.namespace={ns}")
        )
        .await,
        "p1"
    );
    assert_eq!(names(&pods, "metadata.name=p2".into()).await, "p2");
    // An unscheduled pod (no scheduler of that name picks it up) matches an empty nodeName;
    // once bound, it is listed with its node's pods.
    let mut p3 = pod("p3", &n1, json!({}));
    if let Some(spec) = p3.spec.as_mut() {
        spec.node_name = None;
        spec.scheduler_name = Some("tk-no-such-scheduler".into());
    }
    pods.create(&PostParams::default(), &p3).await.unwrap();
    assert_eq!(names(&pods, "spec.nodeName=".into()).await, "p3");
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p3"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": n1}
    });
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        "p3",
        &PostParams::default(),
        &binding,
    )
    .await
    .unwrap();
    assert_eq!(names(&all, format!("spec.nodeName={n1}")).await, "p1,p3");
    assert_eq!(names(&pods, "spec.nodeName=".into()).await, "");
    // The real server rejects field labels a resource does not support.
    let err = api_error(
        all.list(&ListParams::default().fields("spec.color=red"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
    assert!(
        err.message
            .contains("field label not supported: spec.color"),
        "{}",
        err.message
    );
}

fn lease(name: &str) -> Lease {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

fn names(list: &kube::core::ObjectList<Lease>) -> Vec<String> {
    list.items
        .iter()
        .map(|l| l.metadata.name.clone().unwrap())
        .collect()
}

#[tokio::test]
async fn a_list_at_an_exact_resource_version_shows_the_state_of_then() {
    // resourceVersionMatch=Exact serves the list as it was at that revision (the real server
    // reads it from etcd until compaction); NotOlderThan a revision the server does not have yet
    // is 504 "Too large resource version".
    let t = Target::start().await;
    let leases: Api<Lease> = Api::default_namespaced(t.client());
    leases
        .create(&PostParams::default(), &lease("a"))
        .await
        .unwrap();
    let then = leases.list(&ListParams::default()).await.unwrap();
    let rv = then.metadata.resource_version.clone().unwrap();
    leases
        .create(&PostParams::default(), &lease("b"))
        .await
        .unwrap();
    let relabel = json!({"metadata": {"labels": {"changed": "yes"}}});
    leases
        .patch("a", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .unwrap();
    leases.delete("a", &DeleteParams::default()).await.unwrap();

    let now = leases.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&now), ["b"]);
    let exact = leases
        .list(&ListParams::default().at(&rv).matching(VersionMatch::Exact))
        .await
        .unwrap();
    assert_eq!(names(&exact), ["a"], "the list as it was at {rv}");
    assert_eq!(
        exact.metadata.resource_version.as_deref(),
        Some(rv.as_str())
    );
    assert!(
        exact.items[0].metadata.labels.is_none(),
        "with a's labels of then"
    );

    let future = (rv.parse::<u64>().unwrap() + 1_000_000).to_string();
    let err = leases
        .list(
            &ListParams::default()
                .at(&future)
                .matching(VersionMatch::NotOlderThan),
        )
        .await
        .unwrap_err();
    let status = api_error(err);
    assert_eq!(status.code, 504, "{status:?}");
    assert!(
        status.message.contains("Too large resource version"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn continued_pages_show_the_list_as_it_was_at_the_first_page() {
    // A continue token carries the revision of the first page: objects created meanwhile do not
    // appear on later pages (a consistent snapshot, as the real server serves from etcd).
    let t = Target::start().await;
    let leases: Api<Lease> = Api::default_namespaced(t.client());
    for name in ["x1", "x2", "x3"] {
        leases
            .create(&PostParams::default(), &lease(name))
            .await
            .unwrap();
    }
    let first = leases.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&first), ["x1", "x2"]);
    leases
        .create(&PostParams::default(), &lease("x2a"))
        .await
        .unwrap();
    leases.delete("x3", &DeleteParams::default()).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    let rest = leases
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(
        names(&rest),
        ["x3"],
        "x2a was created and x3 deleted after the first page"
    );
    assert_eq!(
        rest.metadata.resource_version,
        first.metadata.resource_version
    );
}

#[tokio::test]
async fn limit_and_continue_page_through_a_list() {
    // Leases in the test's namespace: nothing else creates any there, so the unfiltered list is
    // exactly the test's (a real server sets remainingItemCount only for unfiltered lists).
    let t = Target::start().await;
    let leases: Api<Lease> = Api::default_namespaced(t.client());
    for i in 0..5 {
        let lease: Lease =
            serde_json::from_value(json!({"metadata": {"name": format!("n{i}")}})).unwrap();
        leases.create(&PostParams::default(), &lease).await.unwrap();
    }
    let first = leases.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let filtered = leases
        .list(&ListParams::default().fields("metadata.name!=n0").limit(2))
        .await
        .unwrap();
    assert_eq!(filtered.items.len(), 2);
    assert!(filtered.metadata.continue_.is_some());
    assert_eq!(
        filtered.metadata.remaining_item_count, None,
        "a filtered list does not count what is left"
    );
    let token = first.metadata.continue_.clone().unwrap();
    let second = leases
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    let third = leases
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(second.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    let names: Vec<String> = [first.items, second.items, third.items.clone()]
        .concat()
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert_eq!(names, ["n0", "n1", "n2", "n3", "n4"]);
    assert!(third.metadata.continue_.is_none());
}

#[tokio::test]
async fn a_write_asking_for_partial_object_metadata_is_answered_with_the_metadata_only() {
    // What a writer that does not need the object back asks for (the controller's status
    // writes): the server still applies the whole patch.
    let t = Target::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(t.client());
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "pom"}, "data": {"a": "1"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let request = http::Request::patch(format!(
        "/api/v1/namespaces/{}/configmaps/pom",
        t.namespace()
    ))
    .header(http::header::CONTENT_TYPE, "application/merge-patch+json")
    .header(
        http::header::ACCEPT,
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    )
    .body(br#"{"metadata":{"labels":{"l":"x"}},"data":{"b":"2"}}"#.to_vec())
    .unwrap();
    let reply: serde_json::Value =
        serde_json::from_str(&t.client().request_text(request).await.unwrap()).unwrap();
    assert_eq!(reply["kind"], "PartialObjectMetadata", "{reply}");
    assert_eq!(reply["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(reply["metadata"]["labels"]["l"], "x");
    assert!(reply.get("data").is_none(), "{reply}");
    let stored = cms.get("pom").await.unwrap();
    assert_eq!(stored.data.unwrap().get("b").map(String::as_str), Some("2"));
}

#[tokio::test]
async fn pages_across_namespaces_whose_names_prefix_each_other_miss_nothing() {
    // `x` and `x-b`: "x-b/..." sorts before "x/..." as a string but after it as (namespace,
    // name); a continue token must pick up where the page ended either way.
    let t = Target::start().await;
    let (a, b) = (t.name("pg"), t.name("pg-b"));
    let mut want = Vec::new();
    for ns in [&a, &b] {
        t.create_namespace(ns).await;
        let leases: Api<Lease> = Api::namespaced(t.client(), ns);
        for name in ["l1", "l2"] {
            let lease: Lease = serde_json::from_value(
                json!({"metadata": {"name": name, "labels": {RUN_LABEL: t.namespace()}}}),
            )
            .unwrap();
            leases.create(&PostParams::default(), &lease).await.unwrap();
            want.push(format!("{ns}/{name}"));
        }
    }
    let all: Api<Lease> = Api::all(t.client());
    let mut params = ListParams::default().labels(&t.run_selector()).limit(1);
    let mut seen = Vec::new();
    loop {
        let page = all.list(&params).await.unwrap();
        seen.extend(page.items.iter().map(|l| {
            format!(
                "{}/{}",
                l.metadata.namespace.as_deref().unwrap(),
                l.metadata.name.as_deref().unwrap()
            )
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    seen.sort();
    want.sort();
    assert_eq!(seen, want, "every lease once, over pages of one");
}

#[tokio::test]
async fn status_subresource_splits_spec_and_status_and_generation_tracks_spec_only() {
    let t = Target::start().await;
    let ds_api: Api<DaemonSet> = Api::default_namespaced(t.client());
    // A node selector no node matches keeps a real DaemonSet controller from placing pods.
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                         "spec": {"nodeSelector": {RUN_LABEL: t.name("no-node")},
                                  "containers": [{"name": "a", "image": "agent:1"}]}}
        }
    }))
    .unwrap();
    let created = ds_api.create(&PostParams::default(), &ds).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(
        created
            .spec
            .as_ref()
            .unwrap()
            .update_strategy
            .as_ref()
            .unwrap()
            .type_
            .as_deref(),
        Some("RollingUpdate")
    );

    // A status write through the main resource is ignored; metadata changes keep generation.
    let p = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}, "status": {"numberReady": 5}}));
    let after = ds_api
        .patch("agent", &PatchParams::default(), &p)
        .await
        .unwrap();
    assert_eq!(after.metadata.generation, Some(1));
    assert_eq!(after.status.unwrap().number_ready, 0);

    // The status subresource changes status only, and does not bump generation.
    let p = Patch::Merge(json!({"spec": {"minReadySeconds": 9}, "status": {"numberReady": 5}}));
    let after = ds_api
        .patch_status("agent", &PatchParams::default(), &p)
        .await
        .unwrap();
    assert_eq!(after.metadata.generation, Some(1));
    assert_eq!(after.status.unwrap().number_ready, 5);
    assert_eq!(after.spec.unwrap().min_ready_seconds, None);

    // A spec change bumps generation.
    let p = Patch::Merge(json!({"spec": {"minReadySeconds": 9}}));
    let after = ds_api
        .patch("agent", &PatchParams::default(), &p)
        .await
        .unwrap();
    assert_eq!(after.metadata.generation, Some(2));
}

#[tokio::test]
async fn default_namespaces_exist_and_are_active() {
    // Only that these exist: a shared cluster (`TTDP_TEST_KUBECONFIG`) may have more.
    let t = Target::start().await;
    let ns: Api<Namespace> = Api::all(t.client());
    let names: Vec<String> = ns
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    for expected in ["default", "kube-node-lease", "kube-public", "kube-system"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing: {names:?}"
        );
    }
    assert_eq!(
        ns.get("default")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Active")
    );
}

#[tokio::test]
async fn events_from_a_kube_recorder_are_visible_as_core_events() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use kube::Resource;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let t = Target::start().await;
    let client = t.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes
        .create(&PostParams::default(), &t.node("n1", json!({})))
        .await
        .unwrap();
    let reporter = Reporter {
        controller: "ttdp-controller".into(),
        instance: Some("pod-1".into()),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let ev = Event {
        type_: EventType::Normal,
        reason: "Cordoned".into(),
        note: Some("cordoned for the driver upgrade".into()),
        action: "Cordon".into(),
        secondary: None,
    };
    recorder.publish(&ev, &n.object_ref(&())).await.unwrap();
    // The second publish of the same event patches its series (events.k8s.io merge patch).
    recorder.publish(&ev, &n.object_ref(&())).await.unwrap();

    // Mirrors the real server: events.k8s.io/v1 and core/v1 Events are one object in two shapes.
    // Events about a cluster-scoped object go to `default`. (The node lifecycle controller
    // records its own RegisteredNode event about the new node.)
    let core: Api<CoreEvent> = Api::namespaced(client, "default");
    let list = core
        .list(&ListParams::default().fields(&format!(
            "involvedObject.name={},reason=Cordoned",
            t.name("n1")
        )))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let e = &list.items[0];
    assert_eq!(
        e.message.as_deref(),
        Some("cordoned for the driver upgrade")
    );
    assert_eq!(e.reason.as_deref(), Some("Cordoned"));
    assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(e.reporting_component.as_deref(), Some("ttdp-controller"));
    assert_eq!(e.series.as_ref().unwrap().count, Some(2));
}

#[tokio::test]
async fn pod_specs_are_immutable_except_images() {
    let t = Target::start().await;
    let pods: Api<Pod> = Api::default_namespaced(t.client());
    pods.create(&PostParams::default(), &pod("p1", &t.name("n1"), json!({})))
        .await
        .unwrap();
    // Strategic: the containers merge by name and keep what admission added (the
    // service-account token's volume mount); a JSON merge patch would replace the list and drop it.
    let image =
        Patch::Strategic(json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]}}));
    pods.patch("p1", &PatchParams::default(), &image)
        .await
        .unwrap();
    let moved = Patch::Merge(json!({"spec": {"nodeName": t.name("n2")}}));
    let err = api_error(
        pods.patch("p1", &PatchParams::default(), &moved)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    let cause = &err.details.unwrap().causes[0];
    assert_eq!(cause.field, "spec");
    assert!(
        cause
            .message
            .starts_with("Forbidden: pod updates may not change fields other than"),
        "{}",
        cause.message
    );
}

#[tokio::test]
async fn dry_run_create_answers_without_storing() {
    let t = Target::start().await;
    let nodes: Api<Node> = Api::all(t.client());
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let answered = nodes.create(&pp, &t.node("n1", json!({}))).await.unwrap();
    assert_eq!(answered.metadata.name, Some(t.name("n1")));
    assert!(nodes.get_opt(&t.name("n1")).await.unwrap().is_none());
}

#[tokio::test]
async fn delete_collection_removes_only_selected_objects() {
    let t = Target::start().await;
    let nodes: Api<Node> = Api::all(t.client());
    for (name, pool) in [("a", "x"), ("b", "x"), ("c", "y")] {
        nodes
            .create(&PostParams::default(), &t.node(name, json!({"pool": pool})))
            .await
            .unwrap();
    }
    nodes
        .delete_collection(
            &Default::default(),
            &ListParams::default().labels(&t.own("pool=x")),
        )
        .await
        .unwrap();
    let left: Vec<String> = nodes
        .list(&ListParams::default().labels(&t.run_selector()))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| t.short(&n.metadata.name.unwrap()).to_owned())
        .collect();
    assert_eq!(left, ["c"]);
}

#[tokio::test]
async fn the_default_namespace_cannot_be_deleted() {
    let t = Target::start().await;
    let ns: Api<Namespace> = Api::all(t.client());
    let err = api_error(ns.delete("default", &Default::default()).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (403, "Forbidden"));
}

#[tokio::test]
async fn built_in_objects_are_decoded_like_the_go_types() {
    use kube::api::DynamicObject;
    use kube::core::{ApiResource, GroupVersionKind};
    let t = Target::start().await;
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Node"), "nodes");
    let nodes: Api<DynamicObject> = Api::all_with(t.client(), &ar);
    let wrong: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": t.name("n1")}, "spec": {"unschedulable": "yes"}
    }))
    .unwrap();
    let err = api_error(
        nodes
            .create(&PostParams::default(), &wrong)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));
    assert!(
        err.message
            .starts_with("Node in version \"v1\" cannot be handled as a Node: "),
        "{}",
        err.message
    );

    // Unknown fields are dropped (the default fieldValidation is Warn); what the spec holds is
    // the taint the TaintNodesByCondition admission plugin puts on every new node.
    let odd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": t.name("n1")}, "spec": {"colour": "red"}
    }))
    .unwrap();
    let created = nodes.create(&PostParams::default(), &odd).await.unwrap();
    assert_eq!(
        created.data["spec"],
        json!({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]})
    );
}
