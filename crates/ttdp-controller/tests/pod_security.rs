//! Pod Security admission and the agent, on a real control plane (its API server runs the
//! upstream admission chain, PodSecurity included): the agent is privileged and mounts host
//! paths, so in a namespace that enforces the `restricted` (or `baseline`) level its DaemonSet
//! cannot create a single pod, and says why in a `FailedCreate` Event; labelled
//! `pod-security.kubernetes.io/enforce: privileged`, the same DaemonSet's pod runs and the
//! rollout completes. docs/install.md tells an admin to label the namespace so, and the chart's
//! notes warn at `helm install` when the namespace enforces a lower level.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use harness::{Harness, STEP, helm_binary, tt_node};
use k8s_openapi::api::core::v1::{Event, Namespace};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use ttdp_api::NodeState;
use ttdp_api::names::daemonset_name;

const ENFORCE: &str = "pod-security.kubernetes.io/enforce";
const WARNING: &str = "WARNING: namespace";

/// What `helm install --dry-run=server` of the chart into the operator namespace prints (its
/// notes read the namespace from the cluster).
fn helm_install_notes(h: &Harness) -> String {
    let chart =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/tt-k8s-driver-manager");
    let out = Command::new(helm_binary())
        .args(["install", &h.prefix])
        .arg(chart)
        .args([
            "--namespace",
            &h.namespace,
            "--dry-run=server",
            "--kubeconfig",
        ])
        .arg(h.cluster.kubeconfig_path())
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("ttdp-helm-cache"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm install --dry-run=server: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn enforce(h: &Harness, level: &str) {
    Api::<Namespace>::all(h.client.clone())
        .patch(
            &h.namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {ENFORCE: level}}})),
        )
        .await
        .unwrap();
}

/// The messages of the `FailedCreate` Events of DaemonSet `name` in the operator namespace.
async fn failed_creates(h: &Harness, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(h.client.clone(), &h.namespace);
    let selector =
        format!("involvedObject.kind=DaemonSet,involvedObject.name={name},reason=FailedCreate");
    events
        .list(&ListParams::default().fields(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.message)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_pods_are_refused_in_a_restricted_namespace_and_run_once_it_is_privileged() {
    let mut h = Harness::start_idle(|p| vec![tt_node(p)], |_| {}).await;
    enforce(&h, "restricted").await;
    let notes = helm_install_notes(&h);
    assert!(
        notes.contains(&format!(
            "{WARNING} {} enforces Pod Security level \"restricted\"",
            h.namespace
        )),
        "helm install does not warn about the restricted namespace:\n{notes}"
    );
    h.start_controller();
    let policy = h.create_policy("psa", "2.7.0", json!({})).await;
    let daemonset = daemonset_name(&policy);

    // Refused, with the reason an admin sees in `kubectl describe daemonset`.
    let start = Instant::now();
    let refusal = loop {
        if let Some(m) = failed_creates(&h, &daemonset).await.into_iter().next() {
            break m;
        }
        assert!(
            start.elapsed() < STEP,
            "no FailedCreate Event on DaemonSet {daemonset} in a restricted namespace"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for part in [
        "violates PodSecurity \"restricted:latest\"",
        "privileged (container \"agent\" must not set securityContext.privileged=true)",
        "use restricted volume type \"hostPath\"",
    ] {
        assert!(refusal.contains(part), "{part:?} not in {refusal:?}");
    }
    assert!(
        harness::agent_pods(&h, &policy).await.is_empty(),
        "an agent pod exists in a restricted namespace"
    );
    // The node's status entry says why it waits.
    let nodes = h.nodes();
    h.wait_policy(&policy, "the node's reason FailedCreate", STEP, |p| {
        harness::node_entry(p, &nodes[0]).is_some_and(|n| {
            n.reason.as_deref() == Some("FailedCreate")
                && n.message
                    .as_deref()
                    .is_some_and(|m| m.contains("violates PodSecurity"))
        })
    })
    .await;

    // Labelled privileged: the DaemonSet controller's next try creates the pod.
    enforce(&h, "privileged").await;
    assert!(!helm_install_notes(&h).contains(WARNING));
    h.wait_nodes(&policy, &nodes, NodeState::Done, STEP).await;
    h.shutdown().await;
}
