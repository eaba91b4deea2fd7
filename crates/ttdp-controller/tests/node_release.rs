//! Lifting a cordon from a cached copy of the node: a stale copy never leaves the cordon or a
//! deploy gate in place. Runs against the test API server, or the cluster of
//! `TTDP_TEST_KUBECONFIG`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use ttdp_api::names::annotations;
use ttdp_controller::node_actions::{RecordOnRelease, cordon_and_close_gates, release};
use ttdp_drain::UncordonOutcome;
use ttdp_testkit::sim::{SimCluster, SimClusterOptions};

const GATE: &str = "tenstorrent.com/deploy.tt-telemetry";

fn held(node: &Node) -> (bool, Option<&str>, Option<&str>) {
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let gate = node.metadata.labels.as_ref().and_then(|l| l.get(GATE));
    let by = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::CORDONED_BY));
    (
        unschedulable,
        gate.map(String::as_str),
        by.map(String::as_str),
    )
}

#[tokio::test]
async fn a_stale_cached_copy_still_lifts_the_cordon_and_reopens_the_gates() {
    let options = SimClusterOptions {
        plain_nodes: 1,
        ..SimClusterOptions::default()
    };
    let cluster = SimCluster::start(options).await.expect("simulated cluster");
    let client = cluster.client();
    let name = cluster.nodes()[0].name.clone();
    let nodes: Api<Node> = Api::all(client.clone());
    let gates = vec![GATE.to_owned()];

    // A copy from before the cordon says there is nothing to lift: a fresh read decides.
    let before = nodes.get(&name).await.unwrap();
    cordon_and_close_gates(&client, "p", &name, &gates, None, None)
        .await
        .unwrap();
    assert_eq!(
        held(&nodes.get(&name).await.unwrap()),
        (true, Some("false"), Some("ttdp/p"))
    );
    let outcome = release(&client, "p", &name, Some(before), RecordOnRelease::Keep)
        .await
        .unwrap();
    assert!(
        matches!(outcome, UncordonOutcome::Uncordoned),
        "{outcome:?}"
    );
    assert_eq!(held(&nodes.get(&name).await.unwrap()), (false, None, None));

    // A copy of the cordoned node whose resourceVersion someone else's write has moved on:
    // the patch's precondition fails and the release is decided again, keeping their write.
    cordon_and_close_gates(&client, "p", &name, &gates, None, None)
        .await
        .unwrap();
    let cordoned = nodes.get(&name).await.unwrap();
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"example.com/other": "x"}}})),
        )
        .await
        .unwrap();
    let outcome = release(&client, "p", &name, Some(cordoned), RecordOnRelease::Keep)
        .await
        .unwrap();
    assert!(
        matches!(outcome, UncordonOutcome::Uncordoned),
        "{outcome:?}"
    );
    let after = nodes.get(&name).await.unwrap();
    assert_eq!(held(&after), (false, None, None));
    assert_eq!(
        after
            .metadata
            .labels
            .unwrap()
            .get("example.com/other")
            .map(String::as_str),
        Some("x")
    );
    cluster.shutdown().await.unwrap();
}
