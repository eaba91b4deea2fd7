//! `spec.source` end to end: the real controller, the real agent binary on simulated nodes and
//! a real control plane. A pinned commit whose release tag has since moved fails the node with
//! a message naming both commits and never unloads its working driver; pinning the commit the
//! tag points at now lets the upgrade through, and the node's status shows the commit built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use harness::{Harness, STEP, node_entry, tt_node};
use serde_json::json;
use ttdp_api::NodeState;
use ttdp_api::names::annotations;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_commit_that_moved_fails_the_node_and_keeps_its_driver() {
    let h = Harness::start(|p| vec![tt_node(p).loaded("2.7.0")]).await;
    let node = h.nodes()[0].clone();
    let repository = h.cluster.kmd_repo().url();
    let policy = h
        .create_policy(
            "pinned",
            "2.7.0",
            json!({"source": {"repository": repository}}),
        )
        .await;
    h.wait_ready(&policy, STEP).await;

    let repo = h.cluster.kmd_repo().clone();
    let original = repo.tag_commit("2.8.0").unwrap();
    let moved = repo.move_tag("2.8.0").unwrap();
    h.patch_spec(
        &policy,
        json!({"version": "2.8.0", "source": {"repository": repository, "commit": original}}),
    )
    .await;
    let p = h
        .wait_policy(
            &policy,
            "node failed with SourceCommitMoved",
            STEP * 2,
            |p| {
                node_entry(p, &node).is_some_and(|e| {
                    e.state == NodeState::Failed && e.reason.as_deref() == Some("SourceCommitMoved")
                })
            },
        )
        .await;
    let message = node_entry(&p, &node).unwrap().message.clone().unwrap();
    assert!(
        message.contains(&format!(
            "points at commit {moved}, not at the pinned commit {original}"
        )) && message.contains("set spec.source.commit"),
        "{message}"
    );
    assert_eq!(
        h.kmd_version(&node).await.as_deref(),
        Some("2.7.0"),
        "the working driver stays loaded"
    );
    assert_eq!(
        h.cluster.node(&node).unwrap().loaded_version().as_deref(),
        Some("2.7.0")
    );

    // the admin checks the new commit and pins it: the upgrade goes through
    h.patch_spec(
        &policy,
        json!({"source": {"repository": repository, "commit": moved}}),
    )
    .await;
    h.annotate_node(&node, annotations::RETRY, "now").await;
    let p = h.wait_ready(&policy, STEP * 2).await;
    assert_eq!(h.kmd_version(&node).await.as_deref(), Some("2.8.0"));
    assert_eq!(
        node_entry(&p, &node).unwrap().source_commit.as_deref(),
        Some(moved.as_str()),
        "the status shows the commit the loaded module was built from"
    );
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}
