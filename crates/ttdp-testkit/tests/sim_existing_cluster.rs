//! `SimCluster` joining an existing cluster given by its kubeconfig (what `TTDP_TEST_KUBECONFIG`
//! does), here the real control plane of the test process, which already holds a node of
//! someone else's: the simulated nodes join it, its DaemonSet controller places daemon pods on
//! them, the simulated kubelet runs them, and shutdown removes everything the scenario created
//! and nothing else.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use std::collections::BTreeMap;
use std::time::Duration;

use apiserver_support::Target;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Namespace, Node, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use serde_json::json;
use ttdp_testkit::sim::{
    DeviceUse, SCENARIO_LABEL, SimCluster, SimClusterOptions, TenstorrentNode, Workload, eventually,
};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn joins_an_existing_cluster_and_cleans_up_after_itself() {
    // Someone else on the existing cluster: a namespace and a node the scenario must not touch
    // (removed when `other` drops).
    let other = Target::start().await;
    let admin = other.client();
    let nodes: Api<Node> = Api::all(admin.clone());
    let bystander = nodes
        .create(&PostParams::default(), &other.node("bystander", json!({})))
        .await
        .unwrap()
        .name_any();

    let cluster = SimCluster::start(
        SimClusterOptions::new()
            .node(TenstorrentNode::new().loaded("2.0.0"))
            .tenstorrent_nodes(1)
            .time_scale(0.05)
            .existing_cluster(other.kubeconfig()),
    )
    .await
    .unwrap();
    assert!(cluster.is_real());
    assert!(cluster.api_server().is_none());
    let tt = cluster.tenstorrent_node_names();

    let labels = BTreeMap::from([("app".to_owned(), "agent".to_owned())]);
    let ds = DaemonSet {
        metadata: ObjectMeta {
            name: Some("agent".to_owned()),
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
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        }),
        status: None,
    };
    let daemonsets: Api<DaemonSet> = Api::namespaced(cluster.client(), cluster.namespace());
    daemonsets
        .create(&PostParams::default(), &ds)
        .await
        .unwrap();
    eventually(
        "the cluster's controller to run ready pods on our nodes",
        WAIT,
        || {
            let daemonsets = daemonsets.clone();
            async move {
                let status = daemonsets.get("agent").await.ok()?.status?;
                (status.desired_number_scheduled == 2 && status.number_ready == 2).then_some(())
            }
        },
    )
    .await
    .unwrap();
    cluster
        .add_workload(&Workload::new("holder", &tt[0]).device(DeviceUse::HostPath))
        .await
        .unwrap();
    let root = cluster
        .node(&tt[0])
        .unwrap()
        .host_root()
        .unwrap()
        .to_path_buf();
    eventually("the workload to hold the device", WAIT, || {
        let path = root.join("sys/module/tenstorrent/refcnt");
        async move { (std::fs::read_to_string(path).ok()?.trim() == "1").then_some(()) }
    })
    .await
    .unwrap();

    let namespace = cluster.namespace().to_owned();
    let prefix = cluster.prefix().to_owned();
    cluster.shutdown().await.unwrap();
    let both = format!("{SCENARIO_LABEL} in ({prefix},{})", other.namespace());
    let names: Vec<String> = nodes
        .list(&ListParams::default().labels(&both))
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(names, [bystander], "only the scenario's nodes are gone");
    // Their Leases follow them (the garbage collector, through the Leases' owner references).
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    eventually("the scenario's node leases to be gone", WAIT, || {
        let (leases, tt) = (leases.clone(), tt.clone());
        async move {
            let left = leases.list(&ListParams::default()).await.ok()?.items;
            (!left.iter().any(|l| tt.contains(&l.name_any()))).then_some(())
        }
    })
    .await
    .unwrap();
    let namespaces: Api<Namespace> = Api::all(admin);
    assert!(
        namespaces
            .get_opt(other.namespace())
            .await
            .unwrap()
            .is_some(),
        "the other namespace stays"
    );
    eventually("the scenario namespace to be gone", WAIT, || {
        let (namespaces, namespace) = (namespaces.clone(), namespace.clone());
        async move {
            namespaces
                .get_opt(&namespace)
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await
    .unwrap();
}
