//! The simulated nodes are ordinary API clients, so they must survive what a real API server
//! does to clients: dropped watches, compacted history (410 Expired on resume) and failing
//! requests. They run on the real control plane (`TTDP_TEST_KUBECONFIG`), every request of
//! theirs through a [`FaultProxy`] that injects the faults; the real kube-controller-manager
//! replaces the deleted daemon pod, and the real scheduler places it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use ttdp_testkit::fault_proxy::{FaultProxy, Recorder};
use ttdp_testkit::faults::Fault;
use ttdp_testkit::launcher;
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

/// Pod watches started, and pod lists answered 200, through the proxy so far.
fn pod_reads(requests: &Recorder) -> (usize, usize) {
    let pods = requests.for_resource("pods");
    let watches = pods.iter().filter(|r| r.verb == "watch").count();
    let lists = pods
        .iter()
        .filter(|r| r.verb == "list" && r.status == 200)
        .count();
    (watches, lists)
}

async fn ready_count(api: &Api<DaemonSet>) -> Option<i32> {
    Some(api.get("agent").await.ok()?.status?.number_ready)
}

#[tokio::test]
async fn simulated_nodes_recover_from_dropped_watches_expiry_and_errors() {
    let kubeconfig = Kubeconfig::read_from(launcher::test_kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let admin = kube::Client::try_from(config).unwrap();
    let proxy = FaultProxy::start(admin.clone()).await.unwrap();
    let cluster = SimCluster::start(
        SimClusterOptions::new()
            .node(TenstorrentNode::new().loaded("2.0.0"))
            .tenstorrent_nodes(1)
            .time_scale(0.05)
            .existing_cluster(proxy.kubeconfig()),
    )
    .await
    .unwrap();
    // The test's own reads and writes go to the server directly, not through the faults.
    let ds: Api<DaemonSet> = Api::namespaced(admin.clone(), cluster.namespace());
    let pods: Api<Pod> = Api::namespaced(admin, cluster.namespace());
    ds.create(&PostParams::default(), &daemonset(&cluster))
        .await
        .unwrap();
    eventually("two ready daemon pods", WAIT, || {
        let ds = ds.clone();
        async move { (ready_count(&ds).await? == 2).then_some(()) }
    })
    .await
    .unwrap();

    // Every watch breaks and cannot resume where it was; pod reads and the next pod status
    // writes fail for a while (certainly: a fault left to chance may meet no write at all).
    let requests = proxy.recorder();
    let (watches_before, lists_before) = pod_reads(&requests);
    proxy
        .faults()
        .inject(Fault::expired_watch("", "pods").times(2));
    proxy
        .faults()
        .inject(Fault::expired_watch("", "nodes").times(1));
    proxy.faults().drop_watches();
    proxy
        .faults()
        .inject(Fault::error(500).verb("list").resource("pods").times(2));
    proxy.faults().inject(
        Fault::error(503)
            .resource("pods")
            .subresource("status")
            .times(2),
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
    // The faults reached the simulated nodes: their pod watches were cut, met the expiry twice
    // and came back after listing again.
    let (watches, lists) = pod_reads(&requests);
    assert!(
        watches >= watches_before + 3,
        "pod watches: {watches_before} before the faults, {watches} after"
    );
    assert!(
        lists > lists_before,
        "no pod list answered after the expiry"
    );
    assert!(
        requests
            .requests()
            .iter()
            .any(|r| r.resource == "pods" && r.subresource == "status" && r.status == 503),
        "no pod status write met an injected 503"
    );

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
    proxy.faults().clear();
    cluster.shutdown().await.unwrap();
}
