//! The status of a fleet too large to simulate: the controller's own status builder
//! (`ttdp_controller::status_builder`) run on made-up node reports, without a cluster, and the
//! serialized size of what it would write.
//!
//! Three shapes of one fleet, each a state a real fleet can be in:
//! - `rollout`: half the nodes Done at the new version, `maxUnavailable` in flight, the rest
//!   waiting for a slot;
//! - `not_ready`: the same rollout with one node in ten not Ready (a rack that lost its
//!   network): those wait with a reason of their own, which the status lists;
//! - `host_managed`: every node's module managed by the host (DKMS), which the status lists.
//!
//! The largest of the three is the figure: the status must stay under its size limit in
//! every state, not only in the one a benchmark happens to drive.

use anyhow::Result;
use clap::Args;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use ttdp_api::{NodeState, TenstorrentDriverPolicyStatus};
use ttdp_controller::status_builder::{
    NodeEntries, NodeReport, NodeTransition, PolicyFacts, build_status,
};

use crate::figures::print_result;

const FROM: &str = "2.0.0";
const TO: &str = "2.1.0";

/// Flags of `ttdp-bench status-size`.
#[derive(Debug, Args)]
pub struct StatusSizeArgs {
    /// Tenstorrent nodes in the made-up fleet.
    #[arg(long, default_value_t = 50_000)]
    pub nodes: usize,
    /// The policy's maxUnavailable (nodes in flight during the rollout).
    #[arg(long, default_value_t = 50)]
    pub max_unavailable: usize,
}

/// One shape of the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Rollout,
    NotReady,
    HostManaged,
}

impl Shape {
    const ALL: [Shape; 3] = [Shape::Rollout, Shape::NotReady, Shape::HostManaged];

    fn name(self) -> &'static str {
        match self {
            Shape::Rollout => "rollout",
            Shape::NotReady => "not_ready",
            Shape::HostManaged => "host_managed",
        }
    }
}

/// Runs the suite and prints its result line.
pub fn run(args: &StatusSizeArgs) -> Result<()> {
    let mut shapes = serde_json::Map::new();
    let mut largest = 0;
    for shape in Shape::ALL {
        let bytes = status_bytes(args.nodes, args.max_unavailable, shape)?;
        eprintln!(
            "status-size: {} nodes, {}: {bytes} bytes",
            args.nodes,
            shape.name()
        );
        largest = largest.max(bytes);
        shapes.insert(shape.name().to_owned(), json!(bytes));
    }
    print_result(&json!({
        "suite": "status_size",
        "nodes": args.nodes,
        "max_unavailable": args.max_unavailable,
        "shapes": shapes,
        "status_max_bytes": largest,
    }));
    Ok(())
}

/// The serialized size of the status the controller builds for `nodes` nodes in `shape`.
pub fn status_bytes(nodes: usize, max_unavailable: usize, shape: Shape) -> Result<usize> {
    let facts = PolicyFacts {
        generation: Some(2),
        target_version: TO.to_owned(),
        paused: false,
        invalid_spec: None,
        max_unavailable,
        failure: None,
        canary_halt: None,
    };
    let now = Time("2026-12-07T03:00:00Z".parse()?);
    let reports = (0..nodes)
        .map(|i| report(i, nodes, max_unavailable, shape))
        .collect();
    let previous = TenstorrentDriverPolicyStatus::default();
    let built = build_status(&facts, &previous, &NodeEntries::new(), reports, &now);
    Ok(serde_json::to_vec(&built.whole())?.len())
}

/// Node `i`'s report in `shape`.
fn report(i: usize, nodes: usize, in_flight: usize, shape: Shape) -> NodeReport {
    let half = nodes / 2;
    let (state, reason, message) = match shape {
        Shape::HostManaged => (
            NodeState::HostManaged,
            Some("HostManaged"),
            "the host manages tt-kmd (DKMS); ttdp only observes. Remove the host's DKMS install to hand the node to ttdp".to_owned(),
        ),
        Shape::NotReady if i.is_multiple_of(10) => (
            NodeState::Pending,
            Some("NodeNotReady"),
            "the node is not Ready (Ready condition is Unknown); it takes no slot and starts once it is Ready again".to_owned(),
        ),
        _ if i < half => (NodeState::Done, None, String::new()),
        _ if i < half + in_flight => (
            NodeState::Draining,
            Some("EvictingPods"),
            "evicting 2 pods that use the device".to_owned(),
        ),
        _ => (NodeState::Pending, Some("WaitingForSlot"), String::new()),
    };
    let upgraded = state == NodeState::Done;
    NodeReport {
        name: format!("tt-{i:05}"),
        transition: NodeTransition {
            state,
            reason: reason.map(str::to_owned),
            message: (!message.is_empty()).then_some(message),
            actions: Vec::new(),
        },
        current_version: Some(if upgraded { TO } else { FROM }.to_owned()),
        loaded_parameters: None,
        source_commit: None,
        udev_rule: None,
        next_kernels: None,
        module_signer: None,
        start_load: None,
        install_mode: Some(
            if shape == Shape::HostManaged {
                "host"
            } else {
                "container"
            }
            .to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_fleet_lists_every_node_and_a_large_one_only_what_is_happening() {
        // Up to the controller's threshold every node is listed: the size grows with the fleet.
        let small = status_bytes(100, 10, Shape::Rollout).unwrap();
        let bigger = status_bytes(1_000, 10, Shape::Rollout).unwrap();
        assert!(bigger > 5 * small, "{small} then {bigger}");
        // Past it, a rollout lists the nodes in flight only.
        let large = status_bytes(50_000, 10, Shape::Rollout).unwrap();
        assert!(
            large < bigger,
            "{large} at 50,000 against {bigger} at 1,000"
        );
        // Host-managed nodes are listed however many there are, up to the controller's cap.
        let host = status_bytes(50_000, 10, Shape::HostManaged).unwrap();
        assert!(host > 10 * large, "{host} against {large}");
    }
}
