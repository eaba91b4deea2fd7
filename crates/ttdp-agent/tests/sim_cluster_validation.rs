//! Post-load validation end to end: the real agent binary as the DaemonSet pods of a simulated
//! cluster joined to the real control plane (real DaemonSet controller and scheduler, simulated
//! kubelets running the binary and its exec readiness probe). Three nodes: one with four cards
//! whose upgrade binds only two of them (rolled back, Failed, never Ready), one without cards
//! (Ready, saying there is nothing to validate) and one with three cards (Ready). No controller
//! runs: the test grants the loaded node its upgrade as the controller would after the drain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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

/// The agent report on `node`'s agent pod.
async fn report_on(pods: &Api<Pod>, node: &str) -> Option<(AgentReport, bool)> {
    let pod = pods
        .list(&ListParams::default().labels("app=ttdp-agent"))
        .await
        .ok()?
        .items
        .into_iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))?;
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let json = pod
        .metadata
        .annotations?
        .remove(annotations::AGENT_REPORT)?;
    Some((serde_json::from_str(&json).ok()?, ready))
}

#[tokio::test]
async fn an_upgrade_that_cannot_see_every_card_is_rolled_back_and_never_ready() {
    let cluster = SimCluster::start(
        SimClusterOptions::new()
            .node(TenstorrentNode::new().loaded("2.7.0"))
            .node(TenstorrentNode::new())
            .node(TenstorrentNode::new())
            .kmd_versions(&["2.8.0"])
            .image(IMAGE, AGENT)
            .env("TTDP_PROBE_PERIOD", "200ms")
            // one attempt per node within the test: the failed one is not retried meanwhile
            .env("TTDP_RETRY_INITIAL", "10m")
            .env("TTDP_RETRY_MAX", "10m")
            .env("TTDP_VALIDATION_DEVICE_WAIT", "500ms")
            .env("TTDP_BUILD_JOBS", "1")
            .time_scale(0.1),
    )
    .await
    .unwrap();
    let names = cluster.tenstorrent_node_names();
    let (four_cards, no_cards, three_cards) = (&names[0], &names[1], &names[2]);
    let host = |name: &str| cluster.node(name).unwrap().host.clone().unwrap();
    // the simulated hosts start with one card at 0000:01:00.0
    for address in ["0000:02:00.0", "0000:03:00.0", "0000:04:00.0"] {
        host(four_cards).add_pci_device(address, 0x401e).unwrap();
    }
    host(four_cards)
        .kernel()
        .limit_binding("2.8.0", Some(2))
        .unwrap();
    std::fs::remove_dir_all(host(no_cards).host().path("/sys/bus/pci/devices")).unwrap();
    for address in ["0000:02:00.0", "0000:03:00.0"] {
        host(three_cards).add_pci_device(address, 0xb140).unwrap();
    }

    let client = cluster.client();
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), cluster.namespace());
    daemonsets
        .create(
            &PostParams::default(),
            &daemonset("2.8.0", cluster.prefix()),
        )
        .await
        .unwrap();
    Api::<Node>::all(client.clone())
        .patch(
            four_cards,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                annotations::UPGRADE_GRANT: upgrade_grant(POLICY, "2.8.0")
            }}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), cluster.namespace());

    for (name, expected) in [
        (
            no_cards,
            "no Tenstorrent PCI device (vendor 1e52) on this node",
        ),
        (three_cards, "3 of 3 devices bound to tenstorrent"),
    ] {
        let found = eventually(&format!("{name} ready"), WAIT, || {
            let pods = pods.clone();
            async move {
                let (report, ready) = report_on(&pods, name).await?;
                (ready && report.phase == AgentPhase::Ready).then_some(report)
            }
        })
        .await
        .unwrap();
        let message = found.message.unwrap_or_default();
        assert!(message.contains(expected), "{name}: {message}");
        assert_eq!(
            cluster.node(name).unwrap().loaded_version().as_deref(),
            Some("2.8.0")
        );
    }

    let failed = eventually("the four-card node fails validation", WAIT, || {
        let pods = pods.clone();
        async move {
            let (report, _) = report_on(&pods, four_cards).await?;
            (report.phase == AgentPhase::Failed).then_some(report)
        }
    })
    .await
    .unwrap();
    assert_eq!(failed.reason.as_deref(), Some("ValidationFailedRolledBack"));
    assert_eq!(failed.loaded_version.as_deref(), Some("2.7.0"));
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains("2 of 4 devices bound to tenstorrent")
            && message.contains("tenstorrent 2.7.0 was loaded back"),
        "{message}"
    );
    let node = cluster.node(four_cards).unwrap();
    assert_eq!(node.loaded_version().as_deref(), Some("2.7.0"));
    // several probe periods later the node still runs 2.7.0 and its agent is not ready
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, ready) = report_on(&pods, four_cards).await.unwrap();
    assert!(
        !ready,
        "a node whose driver failed validation is never Ready"
    );
    let labelled = cluster.get_node(four_cards).await.unwrap();
    assert_eq!(
        labelled
            .metadata
            .labels
            .unwrap_or_default()
            .get(labels::KMD_VERSION)
            .map(String::as_str),
        Some("2.7.0"),
        "the label tells what is loaded"
    );
    let status = daemonsets.get("ttdrv-sim").await.unwrap().status.unwrap();
    assert_eq!(
        (status.desired_number_scheduled, status.number_ready),
        (3, 2)
    );
    cluster.shutdown().await.unwrap();
}
