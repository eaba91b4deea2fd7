//! Dead nodes never stall the fleet, on a real control plane: Tenstorrent nodes without a
//! kubelet (Node objects no simulated kubelet serves, so they never turn Ready and the real node
//! lifecycle controller treats them as it treats a dead server) stay Pending with `NodeNotReady`
//! and take no slot, while the healthy nodes beside them are upgraded; a node whose step makes
//! no progress fails at `upgradePolicy.nodeTimeoutSeconds`, visibly, and counts against the
//! failure budget.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::Duration;

use harness::{Harness, RUN_LABEL, STEP, condition, node_entry, node_state, tt_node};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use ttdp_api::NodeState::{self, *};
use ttdp_api::names::{annotations, labels};
use ttdp_testkit::sim::{DeviceUse, SCENARIO_LABEL, Workload};

/// Registers `count` Tenstorrent nodes that no kubelet serves: selected by the scenario's
/// policies, never Ready.
async fn dead_nodes(h: &Harness, count: usize) -> Vec<String> {
    let api = h.node_api();
    let mut names = Vec::new();
    for i in 0..count {
        let name = format!("{}-dead-{i}", h.prefix);
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                RUN_LABEL: h.prefix,
                SCENARIO_LABEL: h.prefix,
                labels::NFD_TENSTORRENT: labels::NFD_PRESENT,
                "kubernetes.io/hostname": name,
            }},
        }))
        .unwrap();
        api.create(&PostParams::default(), &node).await.unwrap();
        names.push(name);
    }
    names
}

/// Removes the dead nodes, then the agent pods bound to them (no kubelet finishes their
/// deletion, so they are forced), so the scenario's namespaces can go.
async fn remove_dead_nodes(h: &Harness, dead: &[String]) {
    for name in dead {
        let _ = h.node_api().delete(name, &DeleteParams::default()).await;
    }
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), &h.namespace);
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for name in dead {
        let on_node = ListParams::default().fields(&format!("spec.nodeName={name}"));
        for pod in pods.list(&on_node).await.unwrap().items {
            let _ = pods.delete(&pod.name_any(), &force).await;
        }
    }
}

/// The notes of the Events of `reason` about `policy`.
async fn event_notes(h: &Harness, policy: &str, reason: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.client.clone());
    let list = events.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(policy))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

fn is_in_flight(states: &[NodeState]) -> bool {
    states.iter().any(|s| s.is_in_flight())
}

/// The incident: three Tenstorrent nodes without a kubelet next to three healthy ones running
/// 2.7.0, one slot. Every healthy node is upgraded to 2.8.0 one at a time; the dead ones stay
/// Pending with `NodeNotReady` in the node's own words, never enter a step and fail nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_nodes_take_no_slot_and_every_healthy_node_ends_done() {
    let h = Harness::start(|p| (0..3).map(|_| tt_node(p).loaded("2.7.0")).collect()).await;
    let dead = dead_nodes(&h, 3).await;
    let healthy = h.nodes();
    let policy = h.create_policy("fleet", "2.8.0", json!({})).await;
    let p = h
        .wait_policy(
            &policy,
            "healthy nodes Done, dead ones Pending NodeNotReady",
            STEP * 3,
            |p| {
                healthy.iter().all(|n| node_state(p, n) == Some(Done))
                    && dead.iter().all(|n| {
                        node_entry(p, n).is_some_and(|e| {
                            e.state == Pending && e.reason.as_deref() == Some("NodeNotReady")
                        })
                    })
            },
        )
        .await;
    for node in &healthy {
        assert_eq!(
            h.kmd_version(node).await.as_deref(),
            Some("2.8.0"),
            "{node}"
        );
    }
    for node in &dead {
        let message = node_entry(&p, node).unwrap().message.clone().unwrap();
        assert!(
            message.contains("not Ready") && message.contains("takes no slot"),
            "{node}: {message}"
        );
        let seen = h.monitor.sequence(&policy, node);
        assert!(
            !is_in_flight(&seen),
            "{node} never entered a step: {seen:?}"
        );
    }
    let summary = p.status.as_ref().unwrap().summary.clone().unwrap();
    assert_eq!(
        (
            summary.matched,
            summary.up_to_date,
            summary.pending,
            summary.failed
        ),
        (6, 3, 3, 0)
    );
    assert!(h.monitor.max_cordoned() <= 1, "one slot");
    let (degraded, _, _) = condition(&p, "Degraded").unwrap();
    assert_eq!(degraded, "False", "nothing failed");
    // Deleting the dead nodes takes them out of the status at once.
    remove_dead_nodes(&h, &dead).await;
    let p = h.wait_ready(&policy, STEP).await;
    assert_eq!(p.status.unwrap().summary.unwrap().matched, 3);
    h.shutdown().await;
}

/// Fresh installs on dead nodes do not hold the slots either: a new policy over two dead nodes
/// and two fresh healthy ones installs the healthy ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_installs_beside_dead_nodes_finish() {
    let h = Harness::start(|p| (0..2).map(|_| tt_node(p)).collect()).await;
    let dead = dead_nodes(&h, 2).await;
    let healthy = h.nodes();
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    let p = h
        .wait_policy(&policy, "healthy nodes Done", STEP * 2, |p| {
            healthy.iter().all(|n| node_state(p, n) == Some(Done))
                && dead.iter().all(|n| node_state(p, n) == Some(Pending))
        })
        .await;
    for node in &dead {
        assert_eq!(
            node_entry(&p, node).unwrap().reason.as_deref(),
            Some("NodeNotReady")
        );
        assert!(!is_in_flight(&h.monitor.sequence(&policy, node)));
    }
    remove_dead_nodes(&h, &dead).await;
    h.shutdown().await;
}

/// Two nodes whose module swap makes no progress (a bare pod holds the device, drain is off,
/// so nothing frees it): each fails at `nodeTimeoutSeconds` with `NodeTimeout`, a message that
/// says what it waited on and for how long, and a Warning Event. After the first failure the
/// rollout continues with the next node; after the second (more than `maxUnavailable`) it
/// halts, saying so. Once the holders are gone, a retry finishes the rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_without_progress_fail_at_the_node_timeout_and_count_against_the_budget() {
    // A back-off longer than the test: only a requested retry brings a Failed node back.
    let h = Harness::start_with(
        |p| (0..3).map(|_| tt_node(p).loaded("2.7.0")).collect(),
        |s| {
            s.retry_base = Duration::from_secs(600);
            s.retry_max = Duration::from_secs(600);
        },
    )
    .await;
    let nodes = h.nodes();
    let policy = h
        .create_policy(
            "fleet",
            "2.7.0",
            json!({"upgradePolicy": {"drain": {"enable": false}, "nodeTimeoutSeconds": 10}}),
        )
        .await;
    h.wait_ready(&policy, STEP).await;
    let mut holders = Vec::new();
    for node in &nodes[..2] {
        let pod = h
            .cluster
            .add_workload(
                &Workload::new(format!("holder-{}", holders.len()), node)
                    .device(DeviceUse::HostPath),
            )
            .await
            .unwrap();
        holders.push(pod.name_any());
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.monitor.reset();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    let timed_out = |p: &ttdp_api::TenstorrentDriverPolicy, node: &str| {
        node_entry(p, node)
            .is_some_and(|e| e.state == Failed && e.reason.as_deref() == Some("NodeTimeout"))
    };
    let p = h
        .wait_policy(&policy, "two NodeTimeouts, then halted", STEP, |p| {
            timed_out(p, &nodes[0])
                && timed_out(p, &nodes[1])
                && node_entry(p, &nodes[2])
                    .is_some_and(|e| e.reason.as_deref() == Some("RolloutHalted"))
        })
        .await;
    for node in &nodes[..2] {
        let e = node_entry(&p, node).unwrap();
        let message = e.message.clone().unwrap();
        assert!(
            message.contains("no progress in Upgrading for")
                && message.contains("upgradePolicy.nodeTimeoutSeconds (10s)")
                && message.contains("held by pid")
                && message.contains("(DeviceHeld)"),
            "{node}: {message}"
        );
        assert_eq!(e.attempts, Some(1));
        assert_eq!(
            h.kmd_version(node).await.as_deref(),
            Some("2.7.0"),
            "nothing swapped under a holder"
        );
        let seen = h.monitor.sequence(&policy, node);
        assert!(seen.ends_with(&[Upgrading, Failed]), "{node}: {seen:?}");
    }
    // The rollout went on after the first failure: the second node started only then.
    let timeline = h.monitor.timeline.lock().unwrap().clone();
    let at = |node: &str, state: NodeState| {
        timeline
            .iter()
            .find(|(n, s, _)| n == node && *s == state)
            .map(|(_, _, at)| *at)
            .unwrap()
    };
    assert!(
        at(&nodes[0], Failed) <= at(&nodes[1], Upgrading),
        "the second node started before the first failed: {timeline:?}"
    );
    let summary = p.status.as_ref().unwrap().summary.clone().unwrap();
    assert_eq!((summary.failed, summary.in_progress), (2, 0), "slots freed");
    let (degraded, reason, message) = condition(&p, "Degraded").unwrap();
    assert_eq!(
        (degraded.as_str(), reason.as_str()),
        ("True", "RolloutHalted")
    );
    assert!(message.contains("NodeTimeout"), "{message}");
    let notes = tokio::time::timeout(STEP, async {
        loop {
            let notes = event_notes(&h, &policy, "NodeFailed").await;
            if notes.len() >= 2 {
                return notes;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("a Warning Event per failed node");
    assert!(
        notes
            .iter()
            .all(|n| n.contains("Upgrading -> Failed") && n.contains("no progress in Upgrading")),
        "{notes:?}"
    );
    // Free the devices and retry: the rollout finishes.
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), h.cluster.namespace());
    for holder in &holders {
        pods.delete(holder, &DeleteParams::default()).await.unwrap();
    }
    for node in &nodes[..2] {
        h.annotate_node(node, annotations::RETRY, "now").await;
    }
    h.wait_ready(&policy, STEP * 2).await;
    for node in &nodes {
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.8.0"));
    }
    h.shutdown().await;
}

/// A node that loses its NFD Tenstorrent label is no Tenstorrent node any more: it leaves the
/// policy's status, as a deleted node does (the controller keeps no copy of nodes no policy can
/// select), while the others stay Done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_loses_its_nfd_label_leaves_the_status() {
    let h = Harness::start(|p| (0..2).map(|_| tt_node(p)).collect()).await;
    let nodes = h.nodes();
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    h.wait_policy(&policy, "both nodes Done", STEP * 2, |p| {
        nodes.iter().all(|n| node_state(p, n) == Some(Done))
    })
    .await;
    let unlabel = json!({"metadata": {"labels": {labels::NFD_TENSTORRENT: null}}});
    h.node_api()
        .patch(&nodes[1], &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .unwrap();
    h.wait_policy(&policy, "the unlabelled node gone", STEP, |p| {
        node_state(p, &nodes[1]).is_none() && node_state(p, &nodes[0]) == Some(Done)
    })
    .await;
    h.shutdown().await;
}

/// A dead node first in name order, running the old version, is never made the canary: the
/// canary is the first Ready node behind, it upgrades and soaks, and the healthy fleet follows
/// while the dead node waits `NodeNotReady`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_is_never_the_canary() {
    let h = Harness::start(|p| (0..2).map(|_| tt_node(p).loaded("2.7.0")).collect()).await;
    let dead = dead_nodes(&h, 1).await;
    h.label_node(&dead[0], labels::KMD_VERSION, Some("2.7.0"))
        .await;
    let healthy = h.nodes();
    let canary = json!({"upgradePolicy": {"canary": {"nodes": 1, "soakSeconds": 1}}});
    let policy = h.create_policy("fleet", "2.7.0", canary).await;
    h.wait_policy(&policy, "healthy nodes Done", STEP, |p| {
        healthy.iter().all(|n| node_state(p, n) == Some(Done))
    })
    .await;
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    let p = h
        .wait_policy(
            &policy,
            "healthy nodes upgraded past the canary",
            STEP * 3,
            |p| {
                healthy.iter().all(|n| {
                    node_entry(p, n).is_some_and(|e| {
                        e.state == Done && e.current_version.as_deref() == Some("2.8.0")
                    })
                })
            },
        )
        .await;
    let rollout = p.status.as_ref().unwrap().rollout.clone().unwrap();
    assert_eq!(rollout.canary_nodes, [healthy[0].clone()], "{rollout:?}");
    let entry = node_entry(&p, &dead[0]).unwrap();
    assert_eq!(entry.state, Pending, "{entry:?}");
    assert_eq!(entry.reason.as_deref(), Some("NodeNotReady"), "{entry:?}");
    remove_dead_nodes(&h, &dead).await;
    h.shutdown().await;
}

/// A node that failed (`NodeTimeout`, decided by the controller, so no agent reports it) stays
/// Failed when the controller restarts and finds the policy's status wiped: its record on the
/// node says so, with its attempts, reason and message, and its back-off is honoured (it is not
/// retried at once, the device still held). `kubectl get nodes -L` shows the state label. A
/// requested retry then finishes the rollout and leaves no record behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_stays_failed_after_a_restart_with_the_status_wiped() {
    let mut h = Harness::start_with(
        |p| (0..2).map(|_| tt_node(p).loaded("2.7.0")).collect(),
        |s| {
            s.retry_base = Duration::from_secs(600);
            s.retry_max = Duration::from_secs(600);
        },
    )
    .await;
    let nodes = h.nodes();
    let policy = h
        .create_policy(
            "fleet",
            "2.7.0",
            json!({"upgradePolicy": {"drain": {"enable": false}, "nodeTimeoutSeconds": 5}}),
        )
        .await;
    h.wait_ready(&policy, STEP).await;
    let holder = h
        .cluster
        .add_workload(&Workload::new("holder", &nodes[0]).device(DeviceUse::HostPath))
        .await
        .unwrap();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    let failed = |p: &ttdp_api::TenstorrentDriverPolicy| {
        node_entry(p, &nodes[0])
            .is_some_and(|e| e.state == Failed && e.reason.as_deref() == Some("NodeTimeout"))
    };
    let before = h
        .wait_policy(&policy, "n0 Failed, n1 Done", STEP * 2, |p| {
            failed(p) && node_state(p, &nodes[1]) == Some(Done)
        })
        .await;
    let before = node_entry(&before, &nodes[0]).unwrap().clone();
    let n0 = h.node_api().get(&nodes[0]).await.unwrap();
    assert_eq!(
        n0.labels().get(labels::UPGRADE_STATE).map(String::as_str),
        Some("Failed"),
        "the state label for kubectl get nodes -L"
    );
    assert!(n0.annotations().contains_key(annotations::UPGRADE_RECORD));

    h.stop_controller().await;
    h.wipe_status(&policy).await;
    h.monitor.reset();
    h.start_controller();
    let after = h
        .wait_policy(&policy, "n0 Failed again from its record", STEP, |p| {
            failed(p) && node_state(p, &nodes[1]) == Some(Done)
        })
        .await;
    let after = node_entry(&after, &nodes[0]).unwrap().clone();
    assert_eq!(after.attempts, before.attempts, "attempts survive");
    assert_eq!(after.message, before.message, "so does what went wrong");
    assert_eq!(after.last_transition_time, before.last_transition_time);
    // Its back-off (600 s) still runs: no new attempt starts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = h.monitor.sequence(&policy, &nodes[0]);
    assert!(
        seen.iter().all(|s| *s == Failed),
        "n0 retried before its back-off after the restart: {seen:?}"
    );
    assert_eq!(h.kmd_version(&nodes[0]).await.as_deref(), Some("2.7.0"));

    let pods: Api<Pod> = Api::namespaced(h.client.clone(), h.cluster.namespace());
    pods.delete(&holder.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    h.annotate_node(&nodes[0], annotations::RETRY, "now").await;
    h.wait_ready(&policy, STEP * 2).await;
    assert_eq!(h.kmd_version(&nodes[0]).await.as_deref(), Some("2.8.0"));
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}
