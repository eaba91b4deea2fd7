//! The real DaemonSet controller with simulated nodes (the control plane of
//! `ttdp_testkit::launcher::test_kubeconfig`): placement by node affinity, taints and cordons,
//! update strategies, and eviction by the skip label. What the product relies on from it; the
//! in-process DaemonSet stand-in is exercised by the demo's fallback
//! (`crates/ttdp-programs/tests/demo.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
};
use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, Pod, PodSpec, PodTemplateSpec, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use ttdp_testkit::sim::{
    SCENARIO_LABEL, SimCluster, SimClusterOptions, TenstorrentNode, eventually,
};

const NFD: &str = "feature.node.kubernetes.io/pci-1200_1e52.present";
const SKIP: &str = "driver.tenstorrent.com/skip";
const WAIT: Duration = Duration::from_secs(20);

fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_owned(),
        operator: op.to_owned(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
    }
}

/// A DaemonSet kept to `cluster`'s own nodes (matters on a shared real cluster).
fn daemonset(
    cluster: &SimCluster,
    name: &str,
    terms: Vec<Vec<NodeSelectorRequirement>>,
    strategy: &str,
) -> DaemonSet {
    let labels = BTreeMap::from([("app".to_owned(), name.to_owned())]);
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    node_selector: Some(BTreeMap::from([(
                        SCENARIO_LABEL.to_owned(),
                        cluster.prefix().to_owned(),
                    )])),
                    containers: vec![Container {
                        name: "agent".to_owned(),
                        image: Some("sim.invalid/agent:1".to_owned()),
                        env: Some(vec![EnvVar {
                            name: "REVISION".to_owned(),
                            value: Some("1".to_owned()),
                            value_from: None,
                        }]),
                        ..Container::default()
                    }],
                    affinity: Some(Affinity {
                        node_affinity: Some(NodeAffinity {
                            required_during_scheduling_ignored_during_execution: Some(
                                NodeSelector {
                                    node_selector_terms: terms
                                        .into_iter()
                                        .map(|e| NodeSelectorTerm {
                                            match_expressions: Some(e),
                                            match_fields: None,
                                        })
                                        .collect(),
                                },
                            ),
                            ..NodeAffinity::default()
                        }),
                        ..Affinity::default()
                    }),
                    ..PodSpec::default()
                }),
            },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some(strategy.to_owned()),
                rolling_update: (strategy == "RollingUpdate").then_some(RollingUpdateDaemonSet {
                    max_unavailable: Some(IntOrString::Int(1)),
                    max_surge: None,
                }),
            }),
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

/// The spec's effective selector: Tenstorrent nodes that are not opted out.
fn installer_terms() -> Vec<Vec<NodeSelectorRequirement>> {
    vec![vec![
        req(NFD, "In", &["true"]),
        req(SKIP, "DoesNotExist", &[]),
    ]]
}

async fn create(cluster: &SimCluster, ds: DaemonSet) -> Api<DaemonSet> {
    let api: Api<DaemonSet> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(&PostParams::default(), &ds).await.unwrap();
    api
}

/// Live (not terminating) pods of the DaemonSet, by node.
async fn pods_by_node(client: &Client, ns: &str, app: &str) -> BTreeMap<String, Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            (
                p.spec
                    .as_ref()
                    .unwrap()
                    .node_name
                    .clone()
                    .unwrap_or_default(),
                p,
            )
        })
        .collect()
}

async fn wait_nodes(cluster: &SimCluster, app: &str, expected: &[String]) -> BTreeMap<String, Pod> {
    let expected: BTreeSet<String> = expected.iter().cloned().collect();
    let client = cluster.client();
    let ns = cluster.namespace().to_owned();
    eventually(
        &format!("daemon pods of {app} exactly on {expected:?}"),
        WAIT,
        || {
            let (client, ns, expected) = (client.clone(), ns.clone(), expected.clone());
            async move {
                let pods = pods_by_node(&client, &ns, app).await;
                (pods.keys().cloned().collect::<BTreeSet<_>>() == expected).then_some(pods)
            }
        },
    )
    .await
    .unwrap()
}

async fn patch_node(cluster: &SimCluster, node: &str, patch: serde_json::Value) {
    Api::<Node>::all(cluster.client())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn start(options: SimClusterOptions) -> SimCluster {
    SimCluster::start(options.time_scale(0.05)).await.unwrap()
}

#[tokio::test]
async fn one_bound_owned_pod_per_matching_node_and_ready_status() {
    let cluster = start(SimClusterOptions::new().tenstorrent_nodes(3).plain_nodes(1)).await;
    let tt = cluster.tenstorrent_node_names();
    let api = create(
        &cluster,
        daemonset(&cluster, "agent", installer_terms(), "OnDelete"),
    )
    .await;
    let pods = wait_nodes(&cluster, "agent", &tt).await;

    let ds = api.get("agent").await.unwrap();
    for (node, pod) in &pods {
        let owner = &pod.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("DaemonSet", ds.uid().unwrap().as_str())
        );
        assert_eq!(owner.controller, Some(true));
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some(node.as_str())
        );
        assert!(pod.labels().contains_key("controller-revision-hash"));
        assert_eq!(pod.labels()["pod-template-generation"], "1");
    }
    let status = eventually("daemonset status to count 3 ready pods", WAIT, || {
        let api = api.clone();
        async move {
            let status = api.get("agent").await.ok()?.status?;
            (status.number_ready == 3).then_some(status)
        }
    })
    .await
    .unwrap();
    assert_eq!(
        status.desired_number_scheduled, 3,
        "the plain node is not eligible"
    );
    assert_eq!(status.current_number_scheduled, 3);
    assert_eq!(status.updated_number_scheduled, Some(3));
    assert_eq!(status.number_available, Some(3));
    assert_eq!(status.observed_generation, ds.metadata.generation);
    cluster.shutdown().await.unwrap();
}

#[tokio::test]
async fn node_affinity_operators_select_nodes() {
    let cluster = start(
        SimClusterOptions::new()
            .node(
                TenstorrentNode::new()
                    .label("pool", "a")
                    .label("cores", "8"),
            )
            .node(
                TenstorrentNode::new()
                    .label("pool", "b")
                    .label("cores", "2"),
            )
            .node(TenstorrentNode::new().label("pool", "c"))
            .node(
                TenstorrentNode::new()
                    .label("pool", "a")
                    .label("cores", "1"),
            ),
    )
    .await;
    let tt = cluster.tenstorrent_node_names();
    let terms = vec![
        // tt-0 only: pool a or b with more than 4 cores.
        vec![req("pool", "In", &["a", "b"]), req("cores", "Gt", &["4"])],
        // tt-2 only: neither a nor b, no cores label.
        vec![
            req("pool", "NotIn", &["a", "b"]),
            req("cores", "DoesNotExist", &[]),
        ],
        // nothing: fewer than 1 core does not exist here.
        vec![req("cores", "Lt", &["1"]), req("pool", "Exists", &[])],
    ];
    create(&cluster, daemonset(&cluster, "picky", terms, "OnDelete")).await;
    wait_nodes(&cluster, "picky", &[tt[0].clone(), tt[2].clone()]).await;
    // Relabelling a node moves it in: tt-3 gets 16 cores.
    patch_node(
        &cluster,
        &tt[3],
        serde_json::json!({"metadata": {"labels": {"cores": "16"}}}),
    )
    .await;
    wait_nodes(
        &cluster,
        "picky",
        &[tt[0].clone(), tt[2].clone(), tt[3].clone()],
    )
    .await;
    cluster.shutdown().await.unwrap();
}

#[tokio::test]
async fn taints_need_tolerations_and_cordoned_nodes_keep_daemon_pods() {
    let cluster = start(
        SimClusterOptions::new()
            .node(TenstorrentNode::new())
            .node(TenstorrentNode::new().taint("dedicated", Some("ml"), "NoSchedule"))
            .node(TenstorrentNode::new()),
    )
    .await;
    let tt = cluster.tenstorrent_node_names();
    create(
        &cluster,
        daemonset(&cluster, "plain", installer_terms(), "OnDelete"),
    )
    .await;
    let mut tolerant = daemonset(&cluster, "tolerant", installer_terms(), "OnDelete");
    tolerant
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .tolerations = Some(vec![Toleration {
        key: Some("dedicated".to_owned()),
        operator: Some("Equal".to_owned()),
        value: Some("ml".to_owned()),
        effect: Some("NoSchedule".to_owned()),
        toleration_seconds: None,
    }]);
    create(&cluster, tolerant).await;
    wait_nodes(&cluster, "plain", &[tt[0].clone(), tt[2].clone()]).await;
    wait_nodes(&cluster, "tolerant", &tt).await;

    // Cordon tt-0 and delete its pod: the DaemonSet controller tolerates
    // node.kubernetes.io/unschedulable, so the pod comes back on the cordoned node (as in Kubernetes).
    patch_node(
        &cluster,
        &tt[0],
        serde_json::json!({"spec": {"unschedulable": true}}),
    )
    .await;
    let before = pods_by_node(&cluster.client(), cluster.namespace(), "plain").await;
    let old = before[&tt[0]].clone();
    Api::<Pod>::namespaced(cluster.client(), cluster.namespace())
        .delete(&old.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let after = wait_nodes(&cluster, "plain", &[tt[0].clone(), tt[2].clone()]).await;
    assert_ne!(
        after[&tt[0]].uid(),
        old.uid(),
        "a new pod on the cordoned node"
    );

    // A NoExecute taint the pods do not tolerate evicts them.
    patch_node(
        &cluster,
        &tt[2],
        serde_json::json!({"spec": {"taints": [{"key": "broken", "effect": "NoExecute"}]}}),
    )
    .await;
    wait_nodes(&cluster, "plain", &[tt[0].clone()]).await;
    wait_nodes(&cluster, "tolerant", &[tt[0].clone(), tt[1].clone()]).await;
    cluster.shutdown().await.unwrap();
}

/// A daemon pod deleted the moment it appears, before the controller's next pass can see it in
/// its cache, is replaced at once: the controller does not wait out its expectation of the
/// creation (30 s).
#[tokio::test]
async fn a_daemon_pod_deleted_as_soon_as_it_appears_is_replaced() {
    let cluster = start(SimClusterOptions::new().tenstorrent_nodes(1)).await;
    let tt = cluster.tenstorrent_node_names();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    let mut appeared = std::pin::pin!(
        watcher(pods.clone(), watcher::Config::default().labels("app=quick")).applied_objects()
    );
    create(
        &cluster,
        daemonset(&cluster, "quick", installer_terms(), "OnDelete"),
    )
    .await;
    let first = appeared.try_next().await.unwrap().unwrap();
    pods.delete(
        &first.name_any(),
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    let after = wait_nodes(&cluster, "quick", &tt).await;
    assert_ne!(after[&tt[0]].uid(), first.uid(), "a new pod");
    cluster.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_skip_label_evicts_the_installer_pod_at_once() {
    let cluster = start(SimClusterOptions::new().tenstorrent_nodes(2)).await;
    let tt = cluster.tenstorrent_node_names();
    create(
        &cluster,
        daemonset(&cluster, "agent", installer_terms(), "OnDelete"),
    )
    .await;
    let pods = wait_nodes(&cluster, "agent", &tt).await;
    let victim = pods[&tt[1]].clone();

    patch_node(
        &cluster,
        &tt[1],
        serde_json::json!({"metadata": {"labels": {SKIP: "true"}}}),
    )
    .await;
    let pods_api: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    eventually("the skipped node's pod to be gone", WAIT, || {
        let (api, name) = (pods_api.clone(), victim.name_any());
        async move { api.get_opt(&name).await.unwrap().is_none().then_some(()) }
    })
    .await
    .unwrap();
    let ds: Api<DaemonSet> = Api::namespaced(cluster.client(), cluster.namespace());
    eventually("desiredNumberScheduled to drop to 1", WAIT, || {
        let ds = ds.clone();
        async move { (ds.get("agent").await.ok()?.status?.desired_number_scheduled == 1).then_some(()) }
    })
    .await
    .unwrap();

    // Removing the label brings a pod back.
    patch_node(
        &cluster,
        &tt[1],
        serde_json::json!({"metadata": {"labels": {SKIP: null}}}),
    )
    .await;
    wait_nodes(&cluster, "agent", &tt).await;
    cluster.shutdown().await.unwrap();
}

async fn bump_template(api: &Api<DaemonSet>, name: &str) {
    let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [{
        "name": "agent", "image": "sim.invalid/agent:2",
        "env": [{"name": "REVISION", "value": "2"}]}]}}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn on_delete_replaces_only_deleted_pods_from_the_current_template() {
    let cluster = start(SimClusterOptions::new().tenstorrent_nodes(2)).await;
    let tt = cluster.tenstorrent_node_names();
    let api = create(
        &cluster,
        daemonset(&cluster, "agent", installer_terms(), "OnDelete"),
    )
    .await;
    let before = wait_nodes(&cluster, "agent", &tt).await;
    bump_template(&api, "agent").await;
    let generation = api.get("agent").await.unwrap().metadata.generation.unwrap();
    eventually("the controller to observe the new generation", WAIT, || {
        let api = api.clone();
        async move {
            (api.get("agent").await.ok()?.status?.observed_generation == Some(generation))
                .then_some(())
        }
    })
    .await
    .unwrap();
    // Give a wrongly eager controller time to replace something.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = pods_by_node(&cluster.client(), cluster.namespace(), "agent").await;
    for node in &tt {
        assert_eq!(
            now[node].uid(),
            before[node].uid(),
            "OnDelete must not replace the pod on {node}"
        );
    }
    // No pod runs the new template yet (0 is left out of the status: omitempty).
    assert_eq!(
        api.get("agent")
            .await
            .unwrap()
            .status
            .unwrap()
            .updated_number_scheduled
            .unwrap_or_default(),
        0
    );

    Api::<Pod>::namespaced(cluster.client(), cluster.namespace())
        .delete(&before[&tt[0]].name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let client = cluster.client();
    let ns = cluster.namespace().to_owned();
    let old_uid = before[&tt[0]].uid();
    let replaced = eventually("a replacement pod on the first node", WAIT, || {
        let (client, ns, node, old_uid) =
            (client.clone(), ns.clone(), tt[0].clone(), old_uid.clone());
        async move {
            pods_by_node(&client, &ns, "agent")
                .await
                .remove(&node)
                .filter(|p| p.uid() != old_uid)
        }
    })
    .await
    .unwrap();
    let container = &replaced.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("sim.invalid/agent:2"),
        "built from the current template"
    );
    assert_eq!(
        replaced.labels()["pod-template-generation"],
        generation.to_string()
    );
    assert_ne!(
        replaced.labels()["controller-revision-hash"],
        before[&tt[0]].labels()["controller-revision-hash"]
    );
    let untouched = pods_by_node(&cluster.client(), cluster.namespace(), "agent").await;
    assert_eq!(untouched[&tt[1]].uid(), before[&tt[1]].uid());
    cluster.shutdown().await.unwrap();
}

#[tokio::test]
async fn rolling_update_replaces_every_pod_one_at_a_time() {
    let cluster = start(SimClusterOptions::new().tenstorrent_nodes(3)).await;
    let tt = cluster.tenstorrent_node_names();
    let api = create(
        &cluster,
        daemonset(&cluster, "agent", installer_terms(), "RollingUpdate"),
    )
    .await;
    let before = wait_nodes(&cluster, "agent", &tt).await;
    eventually("all pods ready", WAIT, || {
        let api = api.clone();
        async move { (api.get("agent").await.ok()?.status?.number_ready == 3).then_some(()) }
    })
    .await
    .unwrap();

    // Watch the pods while the update runs: never more than one node without a live pod
    // (maxUnavailable 1; pods here are ready as soon as they exist). A pod the scheduler has
    // not bound yet (keyed "") serves no node.
    let client = cluster.client();
    let ns = cluster.namespace().to_owned();
    let watcher = tokio::spawn({
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            let mut worst = 0;
            for _ in 0..200 {
                let pods = pods_by_node(&client, &ns, "agent").await;
                let live = pods.keys().filter(|node| !node.is_empty()).count();
                worst = worst.max(3usize.saturating_sub(live));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            worst
        }
    });
    bump_template(&api, "agent").await;
    let after = eventually("every pod replaced by the new template", WAIT, || {
        let (client, ns, tt) = (client.clone(), ns.clone(), tt.clone());
        async move {
            let pods = pods_by_node(&client, &ns, "agent").await;
            let all_new = pods.len() == 3
                && tt.iter().all(|node| pods.contains_key(node))
                && pods.values().all(|p| {
                    p.spec.as_ref().unwrap().containers[0].image.as_deref()
                        == Some("sim.invalid/agent:2")
                });
            all_new.then_some(pods)
        }
    })
    .await
    .unwrap();
    for node in &tt {
        assert_ne!(after[node].uid(), before[node].uid());
    }
    assert!(
        watcher.await.unwrap() <= 1,
        "more than maxUnavailable nodes were without a pod"
    );
    eventually("updatedNumberScheduled 3", WAIT, || {
        let api = api.clone();
        async move {
            (api.get("agent")
                .await
                .ok()?
                .status?
                .updated_number_scheduled
                == Some(3))
            .then_some(())
        }
    })
    .await
    .unwrap();
    cluster.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_node_that_joins_later_gets_its_daemon_pod() {
    let mut cluster = start(SimClusterOptions::new().tenstorrent_nodes(1)).await;
    create(
        &cluster,
        daemonset(&cluster, "agent", installer_terms(), "OnDelete"),
    )
    .await;
    wait_nodes(&cluster, "agent", &cluster.tenstorrent_node_names()).await;

    let joined = cluster
        .add_tenstorrent_node(TenstorrentNode::new().loaded("2.5.0"))
        .await
        .unwrap();
    let plain = cluster.add_plain_node().await.unwrap();
    let tt = cluster.tenstorrent_node_names();
    assert_eq!(tt.len(), 2);
    assert!(tt.contains(&joined) && !tt.contains(&plain));
    wait_nodes(&cluster, "agent", &tt).await;
    let root = cluster
        .node(&joined)
        .unwrap()
        .host_root()
        .unwrap()
        .to_path_buf();
    let version = std::fs::read_to_string(root.join("sys/module/tenstorrent/version")).unwrap();
    assert_eq!(version.trim(), "2.5.0");
    let ds: Api<DaemonSet> = Api::namespaced(cluster.client(), cluster.namespace());
    eventually("two ready daemon pods", WAIT, || {
        let ds = ds.clone();
        async move { (ds.get("agent").await.ok()?.status?.number_ready == 2).then_some(()) }
    })
    .await
    .unwrap();
    cluster.shutdown().await.unwrap();
}
