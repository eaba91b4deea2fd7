//! `spec.module.signing` end to end: the real controller, the real agent binary on simulated
//! nodes and a real control plane. A policy naming a signing Secret that does not exist in the
//! agents' namespace fails the node with `SigningKeyUnusable`, naming the Secret, and never
//! unloads its working driver (the controller reads no Secret; the agent finds nothing mounted).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use harness::{Harness, STEP, node_entry, tt_node};
use serde_json::json;
use ttdp_api::NodeState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_signing_secret_fails_the_node_naming_it_and_keeps_its_driver() {
    let h = Harness::start(|p| vec![tt_node(p).loaded("2.7.0")]).await;
    let node = h.nodes()[0].clone();
    let policy = h.create_policy("signed", "2.7.0", json!({})).await;
    h.wait_ready(&policy, STEP).await;

    h.patch_spec(
        &policy,
        json!({"version": "2.8.0", "module": {"signing": {"secretName": "no-such-signing-key"}}}),
    )
    .await;
    let p = h
        .wait_policy(
            &policy,
            "node failed with SigningKeyUnusable",
            STEP * 2,
            |p| {
                node_entry(p, &node).is_some_and(|e| {
                    e.state == NodeState::Failed
                        && e.reason.as_deref() == Some("SigningKeyUnusable")
                })
            },
        )
        .await;
    let message = node_entry(&p, &node).unwrap().message.clone().unwrap();
    assert!(
        message.contains(&format!(
            "Secret {}/no-such-signing-key",
            h.settings.namespace
        )) && message.contains("tls.crt"),
        "{message}"
    );
    assert_eq!(
        h.cluster.node(&node).unwrap().loaded_version().as_deref(),
        Some("2.7.0"),
        "the working driver stays loaded"
    );
    h.shutdown().await;
}
