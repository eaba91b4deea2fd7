//! `spec.module.parameters` end to end: the real controller, the real agent binary on simulated
//! nodes and a real control plane. A change of the parameters alone rolls the fleet through the
//! same cordon, drain and slot as a version change, and each node's module is reloaded with them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use harness::{Harness, STEP, node_entry, node_state, tt_node};
use serde_json::json;
use ttdp_api::NodeState::{self, *};

const UPGRADE_PATH: [NodeState; 5] = [Cordoning, Draining, Upgrading, Uncordoning, Done];

/// The module parameter `name` as the node's simulated sysfs shows it.
fn sysfs_parameter(h: &Harness, node: &str, name: &str) -> Option<String> {
    let root = h.cluster.node(node)?.host_root()?.to_path_buf();
    std::fs::read_to_string(root.join("sys/module/tenstorrent/parameters").join(name))
        .ok()
        .map(|v| v.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parameter_change_alone_rolls_the_fleet_through_the_drain() {
    let h = Harness::start(|p| (0..3).map(|_| tt_node(p).loaded("2.8.0")).collect()).await;
    let policy = h.create_policy("params", "2.8.0", json!({})).await;
    h.wait_ready(&policy, STEP).await;
    for (i, node) in h.nodes().iter().enumerate() {
        h.device_workload(&format!("inference-{i}"), node).await;
        assert_eq!(sysfs_parameter(&h, node, "reset_limit"), None, "{node}");
    }
    h.monitor.reset();

    h.patch_spec(
        &policy,
        json!({"module": {"parameters": ["reset_limit=5"]}}),
    )
    .await;
    let p = h.wait_ready(&policy, STEP * 3).await;
    assert_eq!(
        h.monitor.max_cordoned(),
        1,
        "one node at a time (maxUnavailable 1)"
    );
    for node in h.nodes() {
        assert_eq!(node_state(&p, &node), Some(Done), "{node}");
        assert_eq!(h.kmd_version(&node).await.as_deref(), Some("2.8.0"));
        assert_eq!(
            h.monitor
                .sequence(&policy, &node)
                .into_iter()
                .skip_while(|s| *s != Cordoning)
                .collect::<Vec<_>>(),
            UPGRADE_PATH,
            "{node} is reloaded through cordon and drain"
        );
        assert_eq!(
            sysfs_parameter(&h, &node, "reset_limit").as_deref(),
            Some("5"),
            "{node}: the module was loaded with the parameter"
        );
        let entry = node_entry(&p, &node).unwrap();
        assert_eq!(
            entry.loaded_parameters.as_deref(),
            Some("reset_limit=5"),
            "{node}: the status shows the parameters read back from sysfs"
        );
    }
    h.assert_nothing_left_behind().await;

    // Dropping the parameter reloads the module with its defaults, through the same path.
    h.monitor.reset();
    h.patch_spec(&policy, json!({"module": {"parameters": []}}))
        .await;
    let p = h.wait_ready(&policy, STEP * 3).await;
    for node in h.nodes() {
        assert!(
            h.monitor.sequence(&policy, &node).contains(&Draining),
            "{node} is drained before the reload"
        );
        assert_eq!(sysfs_parameter(&h, &node, "reset_limit"), None, "{node}");
        assert_eq!(node_entry(&p, &node).unwrap().loaded_parameters, None);
    }
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}
