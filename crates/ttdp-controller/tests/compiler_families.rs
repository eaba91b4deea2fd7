//! Each node's agent runs the builder image of the compiler that built its kernel: on the real
//! control plane, with simulated nodes whose kernels gcc 11, gcc 13 and clang built. The move
//! from the default DaemonSet to a family's drains nothing; the clang node, which no image
//! serves, waits with `UnsupportedCompiler` and is never cordoned while the others upgrade.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::{Duration, Instant};

use harness::{Harness, IMAGE_REPOSITORY, STEP, agent_pods, node_entry, node_state, tt_node};
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;
use serde_json::json;
use ttdp_api::NodeState;
use ttdp_api::names::compiler::{KERNEL_COMPILER_LABEL, family_daemonset_name};
use ttdp_api::names::daemonset_name;

/// The `/proc/version` of each node, in node order.
const BANNERS: [&str; 3] = [
    "Linux version 6.8.0-sim (buildd@ttdp) (gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #1 SMP\n",
    "Linux version 6.8.0-sim (buildd@ttdp) (x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0, GNU ld (GNU Binutils for Ubuntu) 2.42) #1 SMP\n",
    "Linux version 6.8.0-sim (builder@ttdp) (Ubuntu clang version 18.1.3 (1ubuntu1), Ubuntu LLD 18.1.3) #1 SMP\n",
];

fn gcc_image(major: u32) -> String {
    format!("{IMAGE_REPOSITORY}:test-gcc{major}")
}

/// Waits until the agent pod on `node` (the only one not terminating) runs `image`.
async fn wait_for_image(h: &Harness, policy: &str, node: &str, image: &str) {
    let start = Instant::now();
    let mut seen = None;
    while start.elapsed() < STEP {
        let pods = agent_pods(h, policy).await;
        seen = pods
            .get(node)
            .and_then(|p| p.spec.as_ref()?.containers[0].image.clone());
        if seen.as_deref() == Some(image) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the agent on {node} runs {seen:?}, not {image}");
}

#[tokio::test]
async fn each_node_runs_its_compilers_image_and_an_unserved_one_waits() {
    let default_image = format!("{IMAGE_REPOSITORY}:test");
    let mut h = Harness::start_idle(
        |prefix| (0..3).map(|_| tt_node(prefix).loaded("2.7.0")).collect(),
        |s| {
            s.builder_images = [
                (11, gcc_image(11)),
                (12, format!("{IMAGE_REPOSITORY}:test")),
                (13, gcc_image(13)),
            ]
            .into();
        },
    )
    .await;
    let nodes = h.nodes();
    for (node, banner) in nodes.iter().zip(BANNERS) {
        let root = h
            .cluster
            .node(node)
            .unwrap()
            .host_root()
            .unwrap()
            .to_owned();
        std::fs::write(root.join("proc/version"), banner).unwrap();
    }
    h.start_controller();
    let (gcc11, gcc13, clang) = (&nodes[0], &nodes[1], &nodes[2]);

    // Each agent labels its node; the two served nodes move to their family's DaemonSet with
    // their module loaded all along: no node is cordoned for the move.
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    for (node, family) in [(gcc11, "gcc-11"), (gcc13, "gcc-13"), (clang, "clang-18")] {
        h.wait_node(node, family, STEP, |n| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(KERNEL_COMPILER_LABEL))
                == Some(&family.to_owned())
        })
        .await;
    }
    wait_for_image(&h, &policy, gcc11, &gcc_image(11)).await;
    wait_for_image(&h, &policy, gcc13, &gcc_image(13)).await;
    wait_for_image(&h, &policy, clang, &default_image).await;
    h.wait_nodes(&policy, &nodes, NodeState::Done, STEP).await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(h.client.clone(), &h.namespace);
    for name in [
        daemonset_name(&policy),
        family_daemonset_name(&policy, 11),
        family_daemonset_name(&policy, 13),
    ] {
        assert!(daemonsets.get_opt(&name).await.unwrap().is_some(), "{name}");
    }
    let gcc12 = family_daemonset_name(&policy, 12);
    assert!(
        daemonsets.get_opt(&gcc12).await.unwrap().is_none(),
        "gcc 12's image is the default one: no DaemonSet of its own"
    );
    for node in &nodes {
        let path = h.monitor.sequence(&policy, node);
        assert!(
            !path.contains(&NodeState::Cordoning),
            "{node} moved between DaemonSets through {path:?}"
        );
    }

    // A rollout completes on the served nodes; the clang node waits, saying what to do.
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    let served = vec![gcc11.clone(), gcc13.clone()];
    let p = h
        .wait_policy(
            &policy,
            "served nodes Done, clang node unsupported",
            STEP * 3,
            |p| {
                served.iter().all(|n| {
                    node_state(p, n) == Some(NodeState::Done)
                        && node_entry(p, n).and_then(|e| e.current_version.as_deref())
                            == Some("2.8.0")
                }) && node_entry(p, clang).and_then(|e| e.reason.as_deref())
                    == Some("UnsupportedCompiler")
            },
        )
        .await;
    for node in &served {
        assert_eq!(
            h.kmd_version(node).await.as_deref(),
            Some("2.8.0"),
            "{node}"
        );
    }
    let entry = node_entry(&p, clang).unwrap();
    assert_eq!(entry.state, NodeState::Pending);
    let message = entry.message.clone().unwrap_or_default();
    assert!(
        message.contains("clang-18") && message.contains("driver.builderImages"),
        "{message}"
    );
    assert_eq!(h.kmd_version(clang).await.as_deref(), Some("2.7.0"));
    assert!(
        !h.monitor
            .sequence(&policy, clang)
            .contains(&NodeState::Cordoning),
        "the unsupported node is never cordoned"
    );
    wait_for_image(&h, &policy, gcc13, &gcc_image(13)).await;
    h.shutdown().await;
}
