//! Workload pods that use the Tenstorrent device hold `/dev/tenstorrent` in their node's simulated
//! kernel while they run: the module's refcnt rises, the holders are visible in the host's
//! `/proc`, and eviction (respecting PodDisruptionBudgets) or deletion releases them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, EvictParams};
use ttdp_kmod::{DEVICE_DIR, HostRoot, Kernel, find_device_holders};
use ttdp_testkit::sim::workload::WORKLOAD_LABEL;
use ttdp_testkit::sim::{
    DeviceUse, DisruptionLimit, SimCluster, SimClusterOptions, TenstorrentNode, Workload,
    WorkloadOwner, eventually,
};

const WAIT: Duration = Duration::from_secs(20);

fn refcnt(root: &Path) -> Option<u32> {
    std::fs::read_to_string(root.join("sys/module/tenstorrent/refcnt"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

async fn wait_refcnt(root: &Path, expected: u32) {
    let root: PathBuf = root.to_path_buf();
    eventually(&format!("refcnt {expected}"), WAIT, || {
        let root = root.clone();
        async move { (refcnt(&root) == Some(expected)).then_some(()) }
    })
    .await
    .unwrap();
}

async fn wait_ready(api: &Api<Pod>, name: &str) {
    eventually(&format!("pod {name} ready"), WAIT, || {
        let api = api.clone();
        let name = name.to_owned();
        async move {
            let pod = api.get(&name).await.ok()?;
            let ready = pod
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(())
        }
    })
    .await
    .unwrap();
}

async fn wait_gone(api: &Api<Pod>, name: &str) {
    eventually(&format!("pod {name} gone"), WAIT, || {
        let api = api.clone();
        let name = name.to_owned();
        async move { api.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn device_workloads_hold_the_device_until_evicted_or_deleted() {
    let cluster = SimCluster::start(
        SimClusterOptions::new()
            .node(TenstorrentNode::new().loaded("2.0.0"))
            .time_scale(0.05),
    )
    .await
    .unwrap();
    let node = cluster.tenstorrent_node_names().remove(0);
    let root = cluster
        .node(&node)
        .unwrap()
        .host_root()
        .unwrap()
        .to_path_buf();
    assert_eq!(refcnt(&root), Some(0), "module preloaded, unused");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());

    let mounted = cluster
        .add_workload(
            &Workload::new("mounted", &node)
                .device(DeviceUse::HostPath)
                .owner(WorkloadOwner::ReplicaSet),
        )
        .await
        .unwrap();
    wait_refcnt(&root, 1).await;
    let requested = cluster
        .add_workload(&Workload::new("requested", &node).device(DeviceUse::Resource))
        .await
        .unwrap();
    wait_refcnt(&root, 2).await;
    let idle = cluster
        .add_workload(&Workload::new("idle", &node))
        .await
        .unwrap();
    wait_ready(&pods, &idle.name_any()).await;
    wait_ready(&pods, &mounted.name_any()).await;
    assert_eq!(
        refcnt(&root),
        Some(2),
        "a pod without the device holds nothing"
    );
    let holders = find_device_holders(&HostRoot::new(&root), Path::new(DEVICE_DIR), "tenstorrent");
    assert_eq!(holders.len(), 2);
    assert!(holders.iter().all(|h| h.comm == "work"), "{holders:?}");

    // A budget that allows no disruption blocks the eviction: the device stays held.
    let labels = BTreeMap::from([(WORKLOAD_LABEL.to_owned(), "mounted".to_owned())]);
    cluster
        .add_disruption_budget(
            "keep-mounted",
            labels,
            DisruptionLimit::MinAvailable(IntOrString::Int(1)),
        )
        .await
        .unwrap();
    let blocked = eventually("the budget to block the eviction", WAIT, || {
        let (pods, name) = (pods.clone(), mounted.name_any());
        async move {
            match pods.evict(&name, &EvictParams::default()).await {
                Err(kube::Error::Api(status)) if status.code == 429 => Some(status),
                _ => None,
            }
        }
    })
    .await
    .unwrap();
    assert!(
        blocked.message.contains("disruption budget"),
        "{}",
        blocked.message
    );
    assert_eq!(refcnt(&root), Some(2));

    // Without the budget the eviction goes through and the holder lets go. The node is cordoned
    // first, as a drain does: on a real cluster the ReplicaSet controller replaces the evicted pod
    // at once, and its replacement (pinned to this node) must stay Pending instead of taking the
    // device again.
    let cordon = serde_json::json!({"spec": {"unschedulable": true}});
    Api::<k8s_openapi::api::core::v1::Node>::all(cluster.client())
        .patch(
            &node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&cordon),
        )
        .await
        .unwrap();
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        cluster.client(),
        cluster.namespace(),
    )
    .delete("keep-mounted", &DeleteParams::default())
    .await
    .unwrap();
    eventually("the eviction to be accepted", WAIT, || {
        let (pods, name) = (pods.clone(), mounted.name_any());
        async move { pods.evict(&name, &EvictParams::default()).await.ok() }
    })
    .await
    .unwrap();
    wait_gone(&pods, &mounted.name_any()).await;
    assert_eq!(refcnt(&root), Some(1));

    pods.delete(&requested.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&pods, &requested.name_any()).await;
    assert_eq!(refcnt(&root), Some(0));
    cluster.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_holder_killed_on_the_host_restarts_and_holds_again() {
    let cluster = SimCluster::start(
        SimClusterOptions::new()
            .node(TenstorrentNode::new().loaded("2.0.0"))
            .time_scale(0.05),
    )
    .await
    .unwrap();
    let node = cluster.tenstorrent_node_names().remove(0);
    let sim = cluster.node(&node).unwrap().clone();
    let root = sim.host_root().unwrap().to_path_buf();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    let pod = cluster
        .add_workload(&Workload::new("victim", &node).device(DeviceUse::HostPath))
        .await
        .unwrap();
    wait_refcnt(&root, 1).await;
    let holders = find_device_holders(&HostRoot::new(&root), Path::new(DEVICE_DIR), "tenstorrent");
    // What the agent's forceUnload does: SIGKILL the holder.
    sim.kernel().unwrap().kill(holders[0].pid).unwrap();
    assert_eq!(refcnt(&root), Some(0));
    let status = eventually("the container to restart", WAIT, || {
        let (pods, name) = (pods.clone(), pod.name_any());
        async move {
            let s = pods
                .get(&name)
                .await
                .ok()?
                .status?
                .container_statuses?
                .remove(0);
            (s.restart_count >= 1).then_some(s)
        }
    })
    .await
    .unwrap();
    assert_eq!(
        status.last_state.unwrap().terminated.unwrap().exit_code,
        137
    );
    wait_refcnt(&root, 1).await;
    cluster.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_a_loaded_module_device_workloads_crash_loop() {
    let cluster = SimCluster::start(
        SimClusterOptions::new()
            .tenstorrent_nodes(1)
            .time_scale(0.05),
    )
    .await
    .unwrap();
    let node = cluster.tenstorrent_node_names().remove(0);
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    let pod = cluster
        .add_workload(&Workload::new("early", &node).device(DeviceUse::HostPath))
        .await
        .unwrap();
    let status = eventually("a failed start", WAIT, || {
        let (pods, name) = (pods.clone(), pod.name_any());
        async move {
            let s = pods
                .get(&name)
                .await
                .ok()?
                .status?
                .container_statuses?
                .remove(0);
            s.last_state.as_ref()?.terminated.as_ref()?;
            Some(s)
        }
    })
    .await
    .unwrap();
    let terminated = status.last_state.unwrap().terminated.unwrap();
    assert_eq!(terminated.exit_code, 1);
    assert!(
        terminated
            .message
            .unwrap()
            .contains("cannot open /dev/tenstorrent/0")
    );
    assert!(!status.ready);
    cluster.shutdown().await.unwrap();
}
