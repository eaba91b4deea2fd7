//! The controller's upgrade grant end to end (real control plane, simulated kubelets and hosts,
//! the real agent binary): an agent pod on the current template never swaps a loaded module,
//! nor kills a holder, before the controller grants the node its turn, which comes within
//! `maxUnavailable` and after the node's cordon and drain. Every scenario runs with
//! `forceUnload: true`, where a swap without the drain would SIGKILL the device's holders.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use harness::{Harness, STEP, agent_pods, node_state, tt_node};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::task::JoinHandle;
use ttdp_api::NodeState::{self, *};
use ttdp_api::agent_report::{AgentPhase, AgentReport};
use ttdp_api::names::annotations;

const UPGRADE_PATH: [NodeState; 5] = [Cordoning, Draining, Upgrading, Uncordoning, Done];
/// What the simulated kubelet says of a workload whose process the host SIGKILLed.
const KILLED: &str = "was killed (SIGKILL) on the host";

/// Device holders the host killed, as their pods' container statuses tell: (node, pod, when
/// first seen).
struct Kills {
    seen: Arc<Mutex<Vec<(String, String, Instant)>>>,
    task: JoinHandle<()>,
}

impl Kills {
    fn watch(h: &Harness) -> Kills {
        let pods: Api<Pod> = Api::namespaced(h.client.clone(), h.cluster.namespace());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let out = seen.clone();
        let task = tokio::spawn(async move {
            let mut known = BTreeSet::new();
            let mut stream = watcher::watcher(pods, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(pod) = stream.next().await {
                let Ok(pod) = pod else { continue };
                if killed(&pod) && known.insert(pod.uid().unwrap_or_default()) {
                    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                    out.lock().unwrap().push((
                        node.unwrap_or_default(),
                        pod.name_any(),
                        Instant::now(),
                    ));
                }
            }
        });
        Kills { seen, task }
    }

    fn on(&self, node: &str) -> Vec<(String, Instant)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _, _)| n == node)
            .map(|(_, pod, at)| (pod.clone(), *at))
            .collect()
    }
}

impl Drop for Kills {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn killed(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .flat_map(|c| [c.state.as_ref(), c.last_state.as_ref()])
        .flatten()
        .filter_map(|s| s.terminated.as_ref())
        .any(|t| t.message.as_deref().is_some_and(|m| m.contains(KILLED)))
}

/// A ReplicaSet-owned pod on `node` holding /dev/tenstorrent; waits until it holds it.
async fn holder(h: &Harness, name: &str, node: &str) -> String {
    let name = h.device_workload(name, node).await;
    let sim = h.cluster.node(node).unwrap().clone();
    tokio::time::timeout(STEP, async {
        while sim.device_refcnt().unwrap_or(0) == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the workload holds the device");
    name
}

/// The report of the agent pod on `node`, if any.
async fn report_on(h: &Harness, policy: &str, node: &str) -> Option<AgentReport> {
    let pods = agent_pods(h, policy).await;
    let json = pods
        .get(node)?
        .annotations()
        .get(annotations::AGENT_REPORT)?;
    serde_json::from_str(json).ok()
}

/// Waits until the (current) agent on `node` reports that it waits for its grant.
async fn wait_for_grant_report(h: &Harness, policy: &str, node: &str) -> AgentReport {
    tokio::time::timeout(STEP, async {
        loop {
            if let Some(r) = report_on(h, policy, node).await
                && r.phase == AgentPhase::WaitingForGrant
            {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the agent reports WaitingForGrant")
}

/// The most of `nodes` that were in flight at once, from the monitor's timeline: Cordoning to
/// Upgrading. An Uncordoning node's slot ends when its cordon is lifted, before its Uncordoning
/// is written with the next node's Cordoning; that the cordons never overlap beyond the limit
/// is checked on the nodes themselves (`max_cordoned`). The changes of one status
/// (one instant) count together.
fn max_in_flight(h: &Harness, nodes: &[String]) -> usize {
    let timeline = h.monitor.timeline.lock().unwrap().clone();
    let mut now: BTreeSet<String> = BTreeSet::new();
    let mut max = 0;
    let ours: Vec<_> = timeline
        .iter()
        .filter(|(n, _, _)| nodes.contains(n))
        .collect();
    for write in ours.chunk_by(|a, b| a.2 == b.2) {
        for (node, state, _) in write {
            if state.is_in_flight() && *state != Uncordoning {
                now.insert(node.clone());
            } else {
                now.remove(node);
            }
        }
        max = max.max(now.len());
    }
    max
}

/// When the monitor saw `node` enter `state` after it was Draining (its drain finished).
fn drained_at(h: &Harness, node: &str) -> Option<Instant> {
    let timeline = h.monitor.timeline.lock().unwrap().clone();
    let mut draining = false;
    timeline
        .iter()
        .filter(|(n, _, _)| n == node)
        .find_map(|(_, state, at)| {
            draining |= *state == Draining;
            (draining && *state == Upgrading).then_some(*at)
        })
}

/// Every node of `nodes` went the whole path, no holder was killed before its node was
/// cordoned and drained, and at most `max` were in flight or cordoned at once.
fn assert_safe_rollout(h: &Harness, policy: &str, nodes: &[String], kills: &Kills, max: usize) {
    for node in nodes {
        let seq = h.monitor.sequence(policy, node);
        let from: Vec<NodeState> = seq
            .iter()
            .skip_while(|s| **s != Cordoning)
            .copied()
            .collect();
        assert_eq!(from, UPGRADE_PATH, "{node}: {seq:?}");
        let drained = drained_at(h, node);
        for (pod, at) in kills.on(node) {
            assert!(
                drained.is_some_and(|d| d <= at),
                "{pod} on {node} was killed before its node was drained"
            );
        }
    }
    let in_flight = max_in_flight(h, nodes);
    assert!(
        in_flight <= max,
        "{in_flight} nodes in flight at once, allowed {max}; timeline: {:?}",
        h.monitor.timeline.lock().unwrap()
    );
    let cordoned = h.monitor.max_cordoned();
    assert!(
        cordoned <= max,
        "{cordoned} nodes cordoned at once, allowed {max}"
    );
}

/// Mid-rollout, a waiting node's agent pod is deleted: its replacement runs the current template
/// but waits for the grant, the old module loaded and its holder alive, until its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_agent_pod_waits_for_its_grant() {
    let h = Harness::start(|p| (0..3).map(|_| tt_node(p).loaded("2.7.0")).collect()).await;
    let policy = h
        .create_policy(
            "fleet",
            "2.7.0",
            json!({"upgradePolicy": {"forceUnload": true}}),
        )
        .await;
    h.wait_ready(&policy, STEP).await;
    let nodes = h.nodes();
    let kills = Kills::watch(&h);
    for (i, node) in nodes.iter().enumerate() {
        holder(&h, &format!("inference-{i}"), node).await;
    }
    h.blocking_budget().await;
    h.monitor.reset();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    h.wait_nodes(&policy, &nodes[..1], Draining, STEP).await;
    let waiting = &nodes[2];
    let old = agent_pods(&h, &policy).await.remove(waiting).unwrap();
    Api::<Pod>::namespaced(h.client.clone(), &h.namespace)
        .delete(&old.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let report = wait_for_grant_report(&h, &policy, waiting).await;
    assert_eq!(
        report.reason.as_deref(),
        Some("WaitingForGrant"),
        "{report:?}"
    );
    let fresh = agent_pods(&h, &policy).await.remove(waiting).unwrap();
    assert_ne!(fresh.uid(), old.uid(), "a replacement pod");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = h.policies().get(&policy).await.unwrap();
    assert_eq!(
        node_state(&p, waiting),
        Some(Pending),
        "it waits for a slot"
    );
    assert_eq!(h.kmd_version(waiting).await.as_deref(), Some("2.7.0"));
    assert!(kills.on(waiting).is_empty(), "its holder is alive");
    assert_eq!(
        h.cluster.node(waiting).unwrap().device_refcnt(),
        Some(1),
        "still held"
    );
    h.delete_budget().await;
    h.wait_ready(&policy, STEP * 3).await;
    for node in &nodes {
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.8.0"));
    }
    assert_safe_rollout(&h, &policy, &nodes, &kills, 1);
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

/// A node joins with an old module loaded and a workload holding it: its agent (current
/// template from the start) waits for the grant while the policy is paused, then the node
/// takes the normal path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_with_a_loaded_module_waits_for_its_turn() {
    let mut h = Harness::start(|p| vec![tt_node(p)]).await;
    let policy = h
        .create_policy(
            "fleet",
            "2.8.0",
            json!({"upgradePolicy": {"forceUnload": true}}),
        )
        .await;
    h.wait_ready(&policy, STEP).await;
    let kills = Kills::watch(&h);
    h.patch_spec(&policy, json!({"paused": true})).await;
    let prefix = h.prefix.clone();
    let joined = h
        .cluster
        .add_tenstorrent_node(tt_node(&prefix).loaded("2.7.0"))
        .await
        .unwrap();
    holder(&h, "inference-joined", &joined).await;
    let report = wait_for_grant_report(&h, &policy, &joined).await;
    assert_eq!(report.loaded_version.as_deref(), Some("2.7.0"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = h.policies().get(&policy).await.unwrap();
    assert_eq!(node_state(&p, &joined), Some(Pending), "paused: it waits");
    assert_eq!(h.kmd_version(&joined).await.as_deref(), Some("2.7.0"));
    assert!(kills.on(&joined).is_empty(), "its holder is alive");
    h.monitor.reset();
    h.patch_spec(&policy, json!({"paused": false})).await;
    h.wait_ready(&policy, STEP * 2).await;
    assert_eq!(h.kmd_version(&joined).await.as_deref(), Some("2.8.0"));
    assert_safe_rollout(&h, &policy, std::slice::from_ref(&joined), &kills, 1);
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

/// The report: a new policy over nodes already running 2.7.0 (their agents start on the
/// current template) with a fresh node beside them. The fresh node installs at once; the
/// loaded ones go one at a time through cordon and drain before any swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_policy_over_loaded_nodes_drains_before_any_swap() {
    let h = Harness::start(|p| {
        let mut nodes: Vec<_> = (0..3).map(|_| tt_node(p).loaded("2.7.0")).collect();
        nodes.push(tt_node(p));
        nodes
    })
    .await;
    let nodes = h.nodes();
    let (loaded, fresh) = (&nodes[..3], &nodes[3]);
    let kills = Kills::watch(&h);
    for (i, node) in loaded.iter().enumerate() {
        holder(&h, &format!("inference-{i}"), node).await;
    }
    let policy = h
        .create_policy(
            "fleet",
            "2.8.0",
            json!({"upgradePolicy": {"forceUnload": true}}),
        )
        .await;
    h.wait_ready(&policy, STEP * 3).await;
    for node in &nodes {
        assert_eq!(
            h.kmd_version(node).await.as_deref(),
            Some("2.8.0"),
            "{node}"
        );
    }
    assert!(
        !h.monitor.sequence(&policy, fresh).contains(&Cordoning),
        "a fresh install drains nothing"
    );
    assert_safe_rollout(&h, &policy, loaded, &kills, 1);
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

/// A module that declares no version, on a node that opted to replace it without a rollback
/// path (`allow-no-rollback=true`): the agent waits for a grant, and the controller takes the
/// node through cordon and drain and grants it, instead of taking it for a first install that
/// needs none and leaving it waiting for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_without_a_version_is_granted_its_replacement() {
    let h = Harness::start(|p| {
        vec![tt_node(p).loaded("2.7.0").label(
            ttdp_api::names::labels::ALLOW_NO_ROLLBACK,
            ttdp_api::names::labels::ALLOW_NO_ROLLBACK_ENABLED,
        )]
    })
    .await;
    let node = h.nodes().remove(0);
    let root = h
        .cluster
        .node(&node)
        .unwrap()
        .host_root()
        .unwrap()
        .to_path_buf();
    std::fs::remove_file(root.join("sys/module/tenstorrent/version")).unwrap();
    let policy = h
        .create_policy(
            "fleet",
            "2.8.0",
            json!({"upgradePolicy": {"forceUnload": true}}),
        )
        .await;
    let p = h.wait_ready(&policy, STEP * 2).await;
    assert_eq!(node_state(&p, &node), Some(Done));
    assert_eq!(h.kmd_version(&node).await.as_deref(), Some("2.8.0"));
    assert_eq!(
        h.monitor
            .sequence(&policy, &node)
            .into_iter()
            .skip_while(|s| *s != Cordoning)
            .collect::<Vec<_>>(),
        UPGRADE_PATH,
        "the loaded module is replaced through the drain"
    );
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}
