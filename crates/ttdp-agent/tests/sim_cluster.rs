//! The real agent binary as the DaemonSet pods of a simulated cluster joined to the real
//! control plane (the real DaemonSet controller and scheduler, simulated kubelets running the
//! binary with the downward-API env and its exec readiness probe): `--report kube` end to end.
//! The DaemonSet selects only this scenario's nodes (`SCENARIO_LABEL`), so other tests sharing
//! the cluster are untouched. No controller runs: the test grants the loaded node its upgrade
//! as the controller would once the node is cordoned and drained.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use ttdp_api::agent_report::{AgentPhase, AgentReport};
use ttdp_api::names::{annotations, labels, upgrade_grant};
use ttdp_testkit::sim::{
    SCENARIO_LABEL, SimCluster, SimClusterOptions, TenstorrentNode, eventually,
};

const AGENT: &str = env!("CARGO_BIN_EXE_ttdp-agent");
const IMAGE: &str = "sim.test/ttdp-agent";
const WAIT: Duration = Duration::from_secs(120);
const POLICY: &str = "sim";

fn daemonset(version: &str, scenario: &str) -> DaemonSet {
    let field = |name: &str, path: &str| serde_json::json!({ "name": name, "valueFrom": { "fieldRef": { "fieldPath": path } } });
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": { "name": "ttdrv-sim" },
        "spec": {
            "selector": { "matchLabels": { "app": "ttdp-agent" } },
            "updateStrategy": { "type": "OnDelete" },
            "template": {
                "metadata": { "labels": { "app": "ttdp-agent", labels::POLICY: POLICY } },
                "spec": {
                    "nodeSelector": { labels::NFD_TENSTORRENT: "true", SCENARIO_LABEL: scenario },
                    "containers": [{
                        "name": "agent",
                        "image": format!("{IMAGE}:dev"),
                        "command": ["ttdp-agent", "run"],
                        "env": [
                            { "name": "TT_KMD_VERSION", "value": version },
                            field("NODE_NAME", "spec.nodeName"),
                            field("POD_NAME", "metadata.name"),
                            field("POD_NAMESPACE", "metadata.namespace"),
                        ],
                        "readinessProbe": {
                            "exec": { "command": ["ttdp-agent", "probe"] },
                            "periodSeconds": 10,
                            "failureThreshold": 1,
                        },
                    }],
                },
            },
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn agents_install_label_and_report_across_a_simulated_cluster() {
    let cluster = SimCluster::start(
        SimClusterOptions::new()
            .node(TenstorrentNode::new().loaded("2.7.0"))
            .node(TenstorrentNode::new())
            .node(TenstorrentNode::new().host_managed("1.34.0"))
            .plain_nodes(1)
            .kmd_versions(&["2.8.0"])
            .image(IMAGE, AGENT)
            .env("TTDP_PROBE_PERIOD", "200ms")
            .env("TTDP_RETRY_INITIAL", "100ms")
            .env("TTDP_BUILD_JOBS", "1")
            .time_scale(0.1),
    )
    .await
    .unwrap();
    let client = cluster.client();
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), cluster.namespace());
    daemonsets
        .create(
            &PostParams::default(),
            &daemonset("2.8.0", cluster.prefix()),
        )
        .await
        .unwrap();

    let names = cluster.tenstorrent_node_names();
    assert_eq!(names.len(), 3);

    // The node with 2.7.0 loaded waits for its grant, module and all.
    let loaded_node = names[0].clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), cluster.namespace());
    eventually("the loaded node's agent waits for its grant", WAIT, || {
        let pods = pods.clone();
        let node = loaded_node.clone();
        async move {
            let pod = pods
                .list(&ListParams::default().labels("app=ttdp-agent"))
                .await
                .ok()?
                .items
                .into_iter()
                .find(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
                })?;
            let json = pod
                .metadata
                .annotations?
                .remove(annotations::AGENT_REPORT)?;
            let report: AgentReport = serde_json::from_str(&json).ok()?;
            (report.phase == AgentPhase::WaitingForGrant).then_some(())
        }
    })
    .await
    .unwrap();
    let sysfs_version = |name: &str| {
        std::fs::read_to_string(
            cluster
                .node(name)
                .unwrap()
                .host_root()
                .unwrap()
                .join("sys/module/tenstorrent/version"),
        )
        .unwrap()
    };
    assert_eq!(sysfs_version(&loaded_node).trim(), "2.7.0");
    Api::<Node>::all(client.clone())
        .patch(
            &loaded_node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                annotations::UPGRADE_GRANT: upgrade_grant(POLICY, "2.8.0")
            }}})),
        )
        .await
        .unwrap();
    let result = eventually("every agent pod ready", WAIT, || {
        let daemonsets = daemonsets.clone();
        async move {
            let status = daemonsets.get("ttdrv-sim").await.ok()?.status?;
            (status.desired_number_scheduled == 3 && status.number_ready == 3).then_some(())
        }
    })
    .await;
    if result.is_err() {
        for entry in std::fs::read_dir(cluster.log_dir()).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(10).collect();
            eprintln!("== {}\n{}", path.display(), tail.join("\n"));
        }
    }
    result.unwrap();

    let mut by_mode = BTreeMap::new();
    for name in &names {
        let node = cluster.get_node(name).await.unwrap();
        let node_labels = node.metadata.labels.unwrap_or_default();
        let mode = node_labels[labels::INSTALL_MODE].clone();
        let kmd = node_labels.get(labels::KMD_VERSION).cloned();
        let loaded = sysfs_version(name);
        assert_eq!(kmd.as_deref(), Some(loaded.trim()), "{name}: label = sysfs");
        by_mode
            .entry(mode)
            .or_insert_with(Vec::new)
            .push(loaded.trim().to_string());
    }
    assert_eq!(by_mode["container"], vec!["2.8.0", "2.8.0"]);
    assert_eq!(
        by_mode["host"],
        vec!["1.34.0"],
        "the host-managed node is untouched"
    );
    for plain in cluster.plain_node_names() {
        let node = cluster.get_node(&plain).await.unwrap();
        assert!(
            !node
                .metadata
                .labels
                .unwrap_or_default()
                .contains_key(labels::INSTALL_MODE)
        );
    }

    let reports: Vec<AgentReport> = pods
        .list(&ListParams::default().labels("app=ttdp-agent"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| {
            let json = p
                .metadata
                .annotations?
                .get(annotations::AGENT_REPORT)?
                .clone();
            Some(serde_json::from_str(&json).unwrap())
        })
        .collect();
    let mut phases: Vec<AgentPhase> = reports.iter().map(|r| r.phase).collect();
    phases.sort_by_key(|p| format!("{p:?}"));
    assert_eq!(
        phases,
        vec![
            AgentPhase::HostManaged,
            AgentPhase::Ready,
            AgentPhase::Ready
        ]
    );
    cluster.shutdown().await.unwrap();
}
