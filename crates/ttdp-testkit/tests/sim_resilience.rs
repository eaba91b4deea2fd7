//! The stand-ins are ordinary API clients, so they must survive what a real API server does to
//! clients: dropped watches, compacted history (410 Gone on resume) and failing requests.
//! Simulation only (it injects faults into the test API server).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use ttdp_testkit::apiserver::Fault;
use ttdp_testkit::sim::{
    DeviceUse, SCENARIO_LABEL, SimCluster, SimClusterOptions, TenstorrentNode, Workload, eventually,
};

const WAIT: Duration = Duration::from_secs(30);

fn daemonset(cluster: &SimCluster) -> DaemonSet {
    let labels = BTreeMap::from([("app".to_owned(), "agent".to_owned())]);
    DaemonSet {
        metadata: ObjectMeta {
            name: Some("agent".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                rolling_update: None,
            }),
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
    }
}

async fn ready_count(api: &Api<DaemonSet>) -> Option<i32> {
    Some(api.get("agent").await.ok()?.status?.number_ready)
}

#[tokio::test]
async fn stand_ins_recover_from_dropped_watches_compaction_and_errors() {
    let cluster = SimCluster::start(
        SimClusterOptions::new()
            .node(TenstorrentNode::new().loaded("2.0.0"))
            .tenstorrent_nodes(1)
            .time_scale(0.05)
            // Faults are injected into the test API server, so this test always runs on its own
            // one, also when TTDP_TEST_KUBECONFIG names a real cluster.
            .in_process(),
    )
    .await
    .unwrap();
    let server = cluster
        .api_server()
        .expect("an in-process cluster has its test API server");
    let ds: Api<DaemonSet> = Api::namespaced(cluster.client(), cluster.namespace());
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    ds.create(&PostParams::default(), &daemonset(&cluster))
        .await
        .unwrap();
    eventually("two ready daemon pods", WAIT, || {
        let ds = ds.clone();
        async move { (ready_count(&ds).await? == 2).then_some(()) }
    })
    .await
    .unwrap();

    // Every watch breaks and cannot resume where it was; pod creations and half the status
    // writes fail for a while.
    server.faults().drop_watches();
    server.compact_history();
    server
        .faults()
        .inject(Fault::error(500).verb("create").resource("pods").times(3));
    server.faults().inject(
        Fault::error(503)
            .resource("pods")
            .subresource("status")
            .probability(0.5)
            .times(10),
    );

    let victim = pods
        .list(&ListParams::default().labels("app=agent"))
        .await
        .unwrap()
        .items
        .remove(0);
    pods.delete(&victim.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    eventually("a replacement daemon pod, ready", WAIT, || {
        let (ds, pods, uid) = (ds.clone(), pods.clone(), victim.uid());
        async move {
            let list = pods
                .list(&ListParams::default().labels("app=agent"))
                .await
                .ok()?;
            let replaced = list.items.iter().all(|p| p.uid() != uid) && list.items.len() == 2;
            (replaced && ready_count(&ds).await? == 2).then_some(())
        }
    })
    .await
    .unwrap();

    // The kubelet still sees new pods: a device workload starts and holds the device.
    let node = cluster.tenstorrent_node_names().remove(0);
    cluster
        .add_workload(&Workload::new("late", &node).device(DeviceUse::HostPath))
        .await
        .unwrap();
    let root = cluster
        .node(&node)
        .unwrap()
        .host_root()
        .unwrap()
        .to_path_buf();
    eventually("the late workload to hold the device", WAIT, || {
        let path = root.join("sys/module/tenstorrent/refcnt");
        async move { (std::fs::read_to_string(path).ok()?.trim() == "1").then_some(()) }
    })
    .await
    .unwrap();
    cluster.shutdown().await.unwrap();
}
