//! A rollout through injected faults, on the real control plane: the controller binary talks to
//! the API server through a [`FaultProxy`] that fails about 5 % of its writes with a 500, 503 or
//! 409 conflict, cuts its watches mid-rollout and answers their resumption with 410 Expired. The
//! rollout must still end as a clean one does: every node Done once, nothing left cordoned. A
//! grant held up in flight while its node leaves the policy must not outlive the release. A
//! rollout whose status cannot be written goes on from the nodes' records, and a controller
//! killed then loses nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::{Duration, Instant};

use harness::{ControllerProcess, Harness, STEP, node_state, tt_node};
use kube::ResourceExt;
use serde_json::json;
use ttdp_api::NodeState::{self, *};
use ttdp_api::names::annotations;
use ttdp_testkit::fault_proxy::FaultProxy;
use ttdp_testkit::faults::Fault;

const WRITES: [&str; 4] = ["create", "update", "patch", "delete"];

/// About 5 % of the controller's writes fail: 2 % with 500, 2 % with 503, 1 % with a conflict.
/// Besides, the first status write fails with 500 and the first node patch with a conflict, so
/// that every run meets both however few writes the rollout needs.
fn inject_write_faults(proxy: &FaultProxy) {
    proxy.faults().inject(
        Fault::error(500)
            .verb("patch")
            .resource("tenstorrentdriverpolicies")
            .subresource("status")
            .times(1),
    );
    proxy
        .faults()
        .inject(Fault::conflict().verb("patch").resource("nodes").times(1));
    for verb in WRITES {
        proxy
            .faults()
            .inject(Fault::error(500).verb(verb).probability(0.02));
        proxy
            .faults()
            .inject(Fault::error(503).verb(verb).probability(0.02));
        proxy
            .faults()
            .inject(Fault::conflict().verb(verb).probability(0.01));
    }
}

/// A fault proxy in front of the API server, and the controller binary talking through it,
/// ready.
async fn controller_through_a_proxy(h: &Harness) -> (FaultProxy, ControllerProcess) {
    let proxy = FaultProxy::start(h.client.clone()).await.unwrap();
    let logs = std::env::temp_dir().join(format!("ttdp-faults-{}", h.prefix));
    std::fs::create_dir_all(&logs).unwrap();
    let mut controller =
        h.spawn_controller_process_via(proxy.kubeconfig(), &logs.join("controller.log"));
    controller.wait_ready(STEP).await;
    (proxy, controller)
}

/// The watches of nodes and of policies started through the proxy so far.
fn watches_of(proxy: &FaultProxy) -> (usize, usize) {
    let requests = proxy.recorder().requests();
    let count = |resource: &str| {
        requests
            .iter()
            .filter(|r| r.verb == "watch" && r.resource == resource)
            .count()
    };
    (count("nodes"), count("tenstorrentdriverpolicies"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_completes_under_injected_errors_conflicts_and_dropped_watches() {
    let h = Harness::start_idle(
        |p| (0..3).map(|_| tt_node(p).loaded("2.7.0")).collect(),
        |_| {},
    )
    .await;
    let (proxy, mut controller) = controller_through_a_proxy(&h).await;
    let (policy, nodes, removals) = h.nodes_holding_their_devices().await;
    inject_write_faults(&proxy);
    h.monitor.reset();
    let started = Instant::now();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    // Mid-rollout, once a node is on its way: every watch is cut, and the first resumptions of
    // the node and policy watches find their resourceVersion expired.
    h.wait_policy(&policy, "a node upgrading", STEP, |p| {
        nodes
            .iter()
            .any(|n| matches!(node_state(p, n), Some(Cordoning | Draining | Upgrading)))
    })
    .await;
    let watches_before = watches_of(&proxy);
    proxy
        .faults()
        .inject(Fault::expired_watch("", "nodes").times(1));
    proxy.faults().inject(
        Fault::expired_watch("driver.tenstorrent.com", "tenstorrentdriverpolicies").times(1),
    );
    proxy.faults().drop_watches();

    let p = h.wait_ready(&policy, STEP * 3).await;
    let took = started.elapsed();
    controller.assert_running();
    h.assert_upgraded_once(&p, &nodes, &removals).await;
    // The faults did reach the controller.
    let requests = proxy.recorder().requests();
    let failed = requests
        .iter()
        .filter(|r| matches!(r.status, 409 | 500 | 503))
        .count();
    let writes = requests.iter().filter(|r| r.is_write()).count();
    assert!(failed > 0, "no injected fault fired in {writes} writes");
    // Each cut watch met its expiry, listed again and watched again.
    let watches_after = watches_of(&proxy);
    for (kind, before, after) in [
        ("nodes", watches_before.0, watches_after.0),
        ("policies", watches_before.1, watches_after.1),
    ] {
        assert!(
            after >= before + 2,
            "{kind} watches: {before} before the cut, {after} after"
        );
    }
    eprintln!("rollout under faults: {took:?}, {failed} of {writes} writes failed by injection");
    drop(controller);
    h.shutdown().await;
}

/// A node that leaves the selection (the skip label) just as it is granted its upgrade: the
/// grant's write is held up 3 s by the proxy, and the skip label lands meanwhile. The node must
/// end released, carrying no grant of ours, although the grant reached the server after the
/// node left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_skipped_while_its_grant_is_on_the_way_ends_without_it() {
    let h = Harness::start_idle(|p| vec![tt_node(p).loaded("2.7.0")], |_| {}).await;
    let (proxy, controller) = controller_through_a_proxy(&h).await;
    // Without the drain the grant is the first write to the node the rollout makes.
    let no_drain = json!({"upgradePolicy": {"drain": {"enable": false}}});
    let policy = h.create_policy("fleet", "2.7.0", no_drain).await;
    h.wait_ready(&policy, STEP).await;
    let node = h.nodes().remove(0);
    proxy.faults().inject(
        Fault::latency(Duration::from_secs(3))
            .verb("patch")
            .resource("nodes")
            .name(&node)
            .times(1),
    );
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    h.wait_policy(&policy, "the node granted", STEP, |p| {
        node_state(p, &node) == Some(Upgrading)
    })
    .await;
    h.label_node(&node, ttdp_api::names::labels::SKIP, Some("true"))
        .await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let n = h.node_api().get(&node).await.unwrap();
    let grant = n
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ttdp_api::names::annotations::UPGRADE_GRANT));
    assert_eq!(grant, None, "a node that left the policy carries its grant");
    h.label_node(&node, ttdp_api::names::labels::SKIP, None)
        .await;
    drop(controller);
    h.shutdown().await;
}

/// A Failed node whose release the API server refuses keeps our cordon, and so keeps its
/// slot: the next node does not start beside it until the release goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_whose_release_is_refused_keeps_its_slot() {
    let h = Harness::start_idle(
        |p| (0..2).map(|_| tt_node(p).loaded("2.7.0")).collect(),
        |_| {},
    )
    .await;
    let (proxy, controller) = controller_through_a_proxy(&h).await;
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    h.wait_ready(&policy, STEP).await;
    let nodes = h.nodes();
    // 2.9.0 cannot be fetched: the first node fails once it is granted.
    h.patch_spec(&policy, json!({"version": "2.9.0"})).await;
    // On the node: the status, a coalesced view, may skip a step this short.
    h.wait_node(&nodes[0], "the first node granted", STEP, |n| {
        n.annotations().contains_key(annotations::UPGRADE_GRANT)
    })
    .await;
    proxy.faults().inject(
        Fault::error(500)
            .verb("patch")
            .resource("nodes")
            .name(&nodes[0]),
    );
    h.wait_policy(&policy, "the first node failed", STEP, |p| {
        node_state(p, &nodes[0]) == Some(Failed)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cordoned = h.node_api().get(&nodes[0]).await.unwrap();
    assert_eq!(
        cordoned.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "the refused release left the node cordoned"
    );
    assert!(
        !h.monitor.sequence(&policy, &nodes[1]).contains(&Cordoning),
        "the next node started while the failed one still held its cordon: {:?}",
        h.monitor.sequence(&policy, &nodes[1])
    );
    assert!(h.monitor.max_cordoned() <= 1, "maxUnavailable 1");
    proxy.faults().clear();
    h.wait_policy(&policy, "the slot handed on once released", STEP * 2, |p| {
        node_state(p, &nodes[1]).is_some_and(|s| s != Pending)
    })
    .await;
    assert!(h.monitor.max_cordoned() <= 1, "maxUnavailable 1");
    drop(controller);
    h.shutdown().await;
}

/// Every write of the policy's status fails (500) from the moment a node is in flight: the
/// rollout goes on from the nodes' records, and a controller SIGKILLed then, its status writes
/// still pending, is replaced by one that takes up every node where its record says, losing
/// nothing: each node drained and upgraded once, in order, never two cordoned at once, and the
/// status written in full once the API server takes it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_failed_status_writes_resumes_from_the_nodes() {
    let h = Harness::start_idle(
        |p| (0..3).map(|_| tt_node(p).loaded("2.7.0")).collect(),
        |_| {},
    )
    .await;
    let (proxy, mut controller) = controller_through_a_proxy(&h).await;
    let (policy, nodes, removals) = h.nodes_holding_their_devices().await;
    h.monitor.reset();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    let in_flight = |states: &std::collections::BTreeMap<String, NodeState>| {
        states.values().filter(|s| s.is_in_flight()).count()
    };
    let deadline = Instant::now() + STEP;
    while in_flight(&h.node_states(&policy).await) == 0 {
        assert!(Instant::now() < deadline, "no node started within {STEP:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.faults().inject(
        Fault::error(500)
            .verb("patch")
            .resource("tenstorrentdriverpolicies")
            .subresource("status"),
    );
    let failing_since = h.policies().get(&policy).await.unwrap().status;
    // The first node finishes and the second starts on the records alone.
    let deadline = Instant::now() + STEP * 2;
    let (done, second) = loop {
        let states = h.node_states(&policy).await;
        let mut done = Vec::new();
        for n in &nodes {
            if h.kmd_version(n).await.as_deref() == Some("2.8.0") && !states[n].is_in_flight() {
                done.push(n.clone());
            }
        }
        let second = states
            .iter()
            .find(|(n, s)| s.is_in_flight() && !done.contains(n));
        if let (false, Some((n, _))) = (done.is_empty(), second) {
            break (done, n.clone());
        }
        assert!(
            Instant::now() < deadline,
            "the rollout did not go on without its status: {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let p = h.policies().get(&policy).await.unwrap();
    assert_eq!(
        p.status, failing_since,
        "no status write went through while they failed"
    );
    let refused = proxy
        .recorder()
        .requests()
        .iter()
        .filter(|r| r.status == 500 && r.subresource == "status")
        .count();
    assert!(
        refused > 0,
        "the controller never tried to write its status"
    );
    controller.kill();
    eprintln!(
        "SIGKILLed with {done:?} done and {second} in flight; {refused} status writes refused"
    );
    proxy.faults().clear();
    let logs = std::env::temp_dir().join(format!("ttdp-faults-{}", h.prefix));
    let mut controller =
        h.spawn_controller_process_via(proxy.kubeconfig(), &logs.join("controller-2.log"));
    controller.wait_ready(STEP).await;
    let p = h.wait_ready(&policy, STEP * 3).await;
    controller.assert_running();
    assert_eq!(
        h.monitor.max_cordoned(),
        1,
        "never two nodes cordoned at once"
    );
    h.assert_upgraded_once(&p, &nodes, &removals).await;
    drop(controller);
    h.shutdown().await;
}
