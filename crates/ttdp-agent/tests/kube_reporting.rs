//! The agent against the real API server (`ttdp_testkit::launcher::test_kubeconfig`): labels on
//! its own node only (minimal merge patches), its report in its own pod's annotation, node
//! Events for holders and installs. The agent talks through a recording proxy, so the test sees
//! exactly what it wrote; each test has its own namespace and `<prefix>-node-N` nodes, removed
//! when it ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Node, wait_until};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use tokio_util::sync::CancellationToken;
use ttdp_agent::{KubeReporter, NodeAgent, NodeKernel, PodRef};
use ttdp_api::agent_report::{AgentPhase, AgentReport};
use ttdp_api::names::{annotations, labels};
use ttdp_kmod::Kernel;

use ttdp_testkit::fault_proxy::FaultProxy;
use ttdp_testkit::scratch::Scratch;

const WAIT: Duration = Duration::from_secs(30);
/// Where a cluster-scoped object's Events go.
const EVENTS_NAMESPACE: &str = "default";
const POD: &str = "ttdrv-default-abcde";

async fn create_node(client: &kube::Client, name: &str) {
    let node: KubeNode = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": name, "labels": { "team": "ml", labels::NFD_TENSTORRENT: "true" } },
    }))
    .unwrap();
    Api::<KubeNode>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

async fn create_pod(client: &kube::Client, namespace: &str, node: &str) {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": POD, "namespace": namespace },
        "spec": {
            "nodeName": node,
            "containers": [{ "name": "agent", "image": "ghcr.io/tenstorrent/ttdp-agent:dev" }]
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

async fn node_labels(
    client: &kube::Client,
    name: &str,
) -> std::collections::BTreeMap<String, String> {
    Api::<KubeNode>::all(client.clone())
        .get(name)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default()
}

async fn pod_report(client: &kube::Client, namespace: &str) -> Option<AgentReport> {
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get(POD)
        .await
        .unwrap();
    let json = pod
        .metadata
        .annotations?
        .get(annotations::AGENT_REPORT)?
        .clone();
    Some(serde_json::from_str(&json).unwrap())
}

async fn node_events(client: &kube::Client, node: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), EVENTS_NAMESPACE)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Node")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
        })
        .collect()
}

/// Polls an async condition every 50 ms until it holds.
macro_rules! eventually {
    ($what:expr, $cond:expr) => {{
        let started = std::time::Instant::now();
        loop {
            if $cond {
                break;
            }
            assert!(started.elapsed() < WAIT, "timed out waiting for {}", $what);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }};
}

#[tokio::test]
async fn labels_report_and_events_reach_the_api_for_its_own_node_only() {
    let scratch = Scratch::new("ag")
        .await
        .expect("a scratch namespace on the test cluster");
    let client = scratch.client();
    let ns = scratch.namespace().to_owned();
    let (node1, node2) = (scratch.name("node-1"), scratch.name("node-2"));
    create_node(&client, &node1).await;
    create_node(&client, &node2).await;
    create_pod(&client, &ns, &node1).await;
    let proxy = FaultProxy::start(client.clone())
        .await
        .expect("the fault proxy starts");

    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    let kernel = node.kernel();
    kernel.hold(1234, "python3").unwrap();
    kernel.hold(1240, "tt-smi").unwrap();

    let config = node.config("2.0.0");
    let reporter = KubeReporter::new(
        proxy.client(&ns).expect("a client of the fault proxy"),
        &node1,
        PodRef {
            namespace: ns.clone(),
            name: POD.into(),
        },
    );
    let agent = NodeAgent::new(
        config.clone(),
        NodeKernel::new(config.kernel, &config.host),
        reporter,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(agent.run(shutdown.clone()));

    // another version loaded and no grant: the agent waits for its turn, touching nothing
    eventually!("a WaitingForGrant report on the pod", {
        pod_report(&client, &ns)
            .await
            .is_some_and(|r| r.phase == AgentPhase::WaitingForGrant)
    });
    let report = pod_report(&client, &ns).await.unwrap();
    assert_eq!(report.reason.as_deref(), Some("WaitingForGrant"));
    assert!(
        report
            .message
            .as_deref()
            .unwrap()
            .contains(annotations::UPGRADE_GRANT),
        "{report:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(node.loaded().as_deref(), Some("1.0.0"), "nothing unloaded");
    assert!(
        kernel.process_alive(1234) && kernel.process_alive(1240),
        "every holder alive"
    );
    // the controller's grant (the test pod carries no policy label: the version must match)
    Api::<KubeNode>::all(client.clone())
        .patch(
            &node1,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                annotations::UPGRADE_GRANT: ttdp_api::names::upgrade_grant("default", "2.0.0")
            }}})),
        )
        .await
        .unwrap();

    // held: the pod says who holds the device, the node gets a Warning Event, labels tell the truth
    eventually!("a WaitingForHolders report on the pod", {
        pod_report(&client, &ns)
            .await
            .is_some_and(|r| r.phase == AgentPhase::WaitingForHolders)
    });
    let report = pod_report(&client, &ns).await.unwrap();
    assert_eq!(
        report.holders_text().as_deref(),
        Some("held by pid 1234 (python3), pid 1240 (tt-smi)")
    );
    assert_eq!(report.reason.as_deref(), Some("DeviceHeld"));
    eventually!(
        "a DeviceHeld event",
        !node_events(&client, &node1, "DeviceHeld").await.is_empty()
    );
    let held = node_events(&client, &node1, "DeviceHeld").await;
    assert_eq!(held[0].type_.as_deref(), Some("Warning"));
    assert!(
        held[0]
            .note
            .as_deref()
            .unwrap()
            .contains("held by pid 1234 (python3), pid 1240 (tt-smi)"),
        "{:?}",
        held[0].note
    );
    assert_eq!(held[0].reporting_controller.as_deref(), Some("ttdp-agent"));
    let labels_now = node_labels(&client, &node1).await;
    assert_eq!(labels_now[labels::KMD_VERSION], "1.0.0");
    assert_eq!(labels_now[labels::INSTALL_MODE], "container");
    assert_eq!(
        labels_now["team"], "ml",
        "labels the agent does not manage are kept"
    );

    // the holders leave: upgrade, labels, Ready, a Normal Event
    kernel.release(1234).unwrap();
    kernel.release(1240).unwrap();
    eventually!("kmd-version 2.0.0 on the node", {
        node_labels(&client, &node1)
            .await
            .get(labels::KMD_VERSION)
            .map(String::as_str)
            == Some("2.0.0")
    });
    eventually!("tt-smi labelled", {
        node_labels(&client, &node1)
            .await
            .get(labels::TT_SMI_VERSION)
            .map(String::as_str)
            == Some(common::TT_SMI_VERSION)
    });
    eventually!("a Ready report", {
        pod_report(&client, &ns)
            .await
            .is_some_and(|r| r.phase == AgentPhase::Ready)
    });
    let replaced = node_events(&client, &node1, "ModuleReplaced").await;
    assert_eq!(replaced.len(), 1);
    assert_eq!(replaced[0].type_.as_deref(), Some("Normal"));

    // rmmod behind its back: the label goes away, then comes back after the reinstall
    node.kernel().unload("tenstorrent").unwrap();
    eventually!("reinstalled and relabelled", {
        node.loaded().as_deref() == Some("2.0.0")
            && !node_events(&client, &node1, "ModuleChangedExternally")
                .await
                .is_empty()
            && node_labels(&client, &node1)
                .await
                .get(labels::KMD_VERSION)
                .map(String::as_str)
                == Some("2.0.0")
    });
    let removal = proxy.recorder().writes().into_iter().any(|r| {
        r.resource == "nodes"
            && r.body.as_ref().is_some_and(|b| {
                b["metadata"]["labels"][labels::KMD_VERSION].is_null()
                    && b["metadata"]["labels"].get(labels::KMD_VERSION).is_some()
            })
    });
    assert!(
        removal,
        "the kmd-version label was removed while no module was loaded"
    );

    shutdown.cancel();
    running.await.unwrap().unwrap();

    // only its own node and pod were written, with merge patches; node-2 is untouched
    let writes = proxy.recorder().writes();
    for w in writes
        .iter()
        .filter(|w| w.resource == "nodes" || w.resource == "pods")
    {
        assert_eq!(w.verb, "patch", "{w:?}");
        assert!(
            w.content_type.starts_with("application/merge-patch+json"),
            "{w:?}"
        );
        assert!(
            w.name == node1 || w.name == POD,
            "wrote another object: {w:?}"
        );
        let body = w.body.as_ref().unwrap();
        let meta = body["metadata"].as_object().unwrap();
        assert_eq!(body.as_object().unwrap().len(), 1, "only metadata: {body}");
        assert!(
            meta.keys().all(|k| k == "labels" || k == "annotations"),
            "only labels or annotations: {body}"
        );
    }
    let node2 = node_labels(&client, &node2).await;
    assert!(!node2.contains_key(labels::KMD_VERSION) && !node2.contains_key(labels::INSTALL_MODE));
}

#[tokio::test]
async fn an_unreachable_api_never_stops_the_node_flow() {
    // the API server exists but the node and pod do not: every publication fails
    let scratch = Scratch::new("ag")
        .await
        .expect("a scratch namespace on the test cluster");
    let node = Node::new(&["2.0.0"]);
    let config = node.config("2.0.0");
    let reporter = KubeReporter::new(
        scratch.client(),
        &scratch.name("node-1"),
        PodRef {
            namespace: scratch.namespace().into(),
            name: POD.into(),
        },
    );
    let agent = NodeAgent::new(
        config.clone(),
        NodeKernel::new(config.kernel, &config.host),
        reporter,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(agent.run(shutdown.clone()));
    wait_until("the module installed despite the API errors", WAIT, || {
        node.loaded().as_deref() == Some("2.0.0")
    })
    .await;
    assert!(!running.is_finished());
    shutdown.cancel();
    running.await.unwrap().unwrap();
}
