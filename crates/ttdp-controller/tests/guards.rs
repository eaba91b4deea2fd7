//! Rollouts that protect the fleet, end to end on the real control plane: a canary that passes
//! and the fleet follows after its soak; a canary that goes unready during its soak, halts the
//! rollout and rolls back; jobs that finish before their node is drained; a maintenance window
//! that opens mid-test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::{Duration, Instant};

use harness::{Harness, SLEEP_IMAGE, STEP, condition, node_entry, node_state, tt_node};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff;
use kube::api::{Api, PostParams};
use serde_json::json;
use ttdp_api::NodeState::{self, *};
use ttdp_api::driver::v1alpha1::rollout_phase as phase;

fn loaded(n: usize) -> impl Fn(&str) -> Vec<ttdp_testkit::sim::TenstorrentNode> {
    move |prefix| (0..n).map(|_| tt_node(prefix).loaded("2.7.0")).collect()
}

fn rollout_phase(p: &ttdp_api::TenstorrentDriverPolicy) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.rollout.as_ref())
        .map(|r| r.phase.clone())
        .unwrap_or_default()
}

/// The canary of the rollout to `version` soaks.
fn soaking_towards(p: &ttdp_api::TenstorrentDriverPolicy, version: &str) -> bool {
    let rollout = p.status.as_ref().and_then(|s| s.rollout.as_ref());
    rollout.is_some_and(|r| r.target_version == version && r.phase == phase::SOAKING)
}

/// When `node` first entered `state`, as the monitor saw it.
fn first(h: &Harness, node: &str, state: NodeState) -> Option<Instant> {
    let timeline = h.monitor.timeline.lock().unwrap();
    timeline
        .iter()
        .find(|(n, s, _)| n == node && *s == state)
        .map(|(_, _, at)| *at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_passes_its_soak_lets_the_fleet_follow() {
    let h = Harness::start(loaded(3)).await;
    let canary = json!({"upgradePolicy": {"canary": {"nodes": 1, "soakSeconds": 4}}});
    let policy = h.create_policy("fleet", "2.7.0", canary).await;
    h.wait_ready(&policy, STEP).await;
    h.monitor.reset();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    let nodes = h.nodes();
    let soaking = h
        .wait_policy(&policy, "the canary soaking", STEP, |p| {
            soaking_towards(p, "2.8.0")
        })
        .await;
    let rollout = soaking.status.unwrap().rollout.unwrap();
    assert_eq!(
        rollout.canary_nodes,
        [nodes[0].clone()],
        "the first node by name"
    );
    assert_eq!(rollout.from_version.as_deref(), Some("2.7.0"));
    let p = h.wait_ready(&policy, STEP * 3).await;
    assert_eq!(rollout_phase(&p), phase::ROLLING);
    for node in &nodes {
        assert_eq!(node_state(&p, node), Some(Done), "{node}");
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.8.0"));
    }
    let canary_done = first(&h, &nodes[0], Done).expect("the canary went Done");
    for node in &nodes[1..] {
        let started = first(&h, node, Cordoning).expect("the others were upgraded too");
        let gap = started.duration_since(canary_done);
        assert!(
            gap >= Duration::from_secs(3),
            "{node} started {gap:?} after the canary was Done, within its 4 s soak"
        );
    }
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_unready_during_its_soak_halts_and_rolls_back() {
    let h = Harness::start(loaded(3)).await;
    let canary = json!({"upgradePolicy": {"canary": {"nodes": 1, "soakSeconds": 600, "autoRollback": true}}});
    let policy = h.create_policy("fleet", "2.7.0", canary).await;
    h.wait_ready(&policy, STEP).await;
    h.monitor.reset();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    let nodes = h.nodes();
    h.wait_policy(&policy, "the canary soaking", STEP * 2, |p| {
        soaking_towards(p, "2.8.0")
    })
    .await;
    // The driver on the canary goes bad: something else loads another version (one the agent
    // can still build, so the way back stays open), and the readiness probe fails.
    let root = h
        .cluster
        .node(&nodes[0])
        .unwrap()
        .host_root()
        .unwrap()
        .to_path_buf();
    std::fs::write(root.join("sys/module/tenstorrent/version"), "2.6.0\n").unwrap();
    let p = h
        .wait_policy(&policy, "the canary rolled back", STEP * 3, |p| {
            rollout_phase(p) == phase::ROLLED_BACK
        })
        .await;
    let rollout = p.status.as_ref().unwrap().rollout.clone().unwrap();
    let halted_by = rollout.halted_by.unwrap_or_default();
    assert!(
        halted_by.starts_with(&format!(
            "canary node {} went unready during the soak",
            nodes[0]
        )),
        "{halted_by}"
    );
    let (status, reason, message) = condition(&p, "Degraded").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "RolloutHalted"),
        "{message}"
    );
    assert_eq!(
        h.kmd_version(&nodes[0]).await.as_deref(),
        Some("2.7.0"),
        "rolled back"
    );
    assert_eq!(node_state(&p, &nodes[0]), Some(Done));
    for node in &nodes[1..] {
        assert_eq!(
            h.kmd_version(node).await.as_deref(),
            Some("2.7.0"),
            "{node}"
        );
        assert!(
            !h.monitor.sequence(&policy, node).contains(&Cordoning),
            "{node} was never touched"
        );
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.client.clone());
    let halted_event = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some("RolloutHalted")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(policy.as_str())
                && e.note.as_deref().is_some_and(|n| n.contains(&nodes[0]))
        });
    assert!(halted_event, "a RolloutHalted Event names the canary node");
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_finish_before_their_node_is_drained() {
    let h = Harness::start(loaded(1)).await;
    let wait = json!({"upgradePolicy": {"waitForCompletion": {"podSelector": "job-name"}}});
    let policy = h.create_policy("fleet", "2.7.0", wait).await;
    h.wait_ready(&policy, STEP).await;
    let node = h.nodes().remove(0);
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), h.cluster.namespace());
    let job: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train", "labels": {"job-name": "train"}},
        "spec": {"nodeName": node, "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": SLEEP_IMAGE, "args": ["8"]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &job).await.unwrap();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    let p = h
        .wait_policy(&policy, "the node waiting for its job", STEP, |p| {
            node_entry(p, &node)
                .and_then(|e| e.message.as_deref())
                .is_some_and(|m| m.contains("waiting for 1 pods to finish before draining"))
        })
        .await;
    assert_eq!(node_state(&p, &node), Some(Draining));
    // While the job runs, it is not evicted.
    let running = pods.get("train").await.unwrap();
    assert!(
        running.metadata.deletion_timestamp.is_none(),
        "the running job was not evicted"
    );
    let mut finished = false;
    let started = Instant::now();
    while started.elapsed() < STEP {
        match pods.get_opt("train").await.unwrap() {
            Some(pod)
                if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded") =>
            {
                finished = true;
                break;
            }
            Some(pod) => assert!(
                pod.metadata.deletion_timestamp.is_none(),
                "evicted while running"
            ),
            None => break,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(finished, "the job ran to its end");
    let p = h.wait_ready(&policy, STEP * 2).await;
    assert_eq!(node_state(&p, &node), Some(Done));
    assert_eq!(h.kmd_version(&node).await.as_deref(), Some("2.8.0"));
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_starts_before_the_maintenance_window_opens() {
    let h = Harness::start(loaded(2)).await;
    // A window opening at the next full minute, at least 20 s from now, for an hour.
    let now = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC);
    let opens = (now.clone() + jiff::SignedDuration::from_secs(80))
        .round(
            jiff::ZonedRound::new()
                .smallest(jiff::Unit::Minute)
                .mode(jiff::RoundMode::Trunc),
        )
        .unwrap();
    let day = opens.strftime("%a").to_string();
    let schedule = json!({"upgradePolicy": {"schedule": {"timeZone": "UTC", "windows": [
        {"days": [day], "start": opens.strftime("%H:%M").to_string(), "duration": "1h"}]}}});
    let policy = h.create_policy("fleet", "2.7.0", schedule).await;
    h.wait_ready(&policy, STEP).await;
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    let nodes = h.nodes();
    let p = h
        .wait_policy(&policy, "held outside the window", STEP, |p| {
            nodes.iter().all(|n| {
                node_entry(p, n).and_then(|e| e.reason.as_deref())
                    == Some("OutsideMaintenanceWindow")
            })
        })
        .await;
    let next = p
        .status
        .as_ref()
        .unwrap()
        .rollout
        .as_ref()
        .unwrap()
        .next_window
        .clone();
    assert_eq!(next.map(|t| t.0), Some(opens.timestamp()));
    assert!(nodes.iter().all(|n| node_state(&p, n) == Some(Pending)));
    h.wait_policy(&policy, "the first node started", STEP * 3, |p| {
        nodes.iter().any(|n| node_state(p, n) != Some(Pending))
    })
    .await;
    let started = jiff::Timestamp::now();
    assert!(
        started >= opens.timestamp(),
        "a node started at {started}, before the window opened at {}",
        opens.timestamp()
    );
    let p = h.wait_ready(&policy, STEP * 2).await;
    for node in &nodes {
        assert_eq!(node_state(&p, node), Some(Done));
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.8.0"));
    }
    h.shutdown().await;
}

/// Makes the readiness probe of `node`'s agent fail: something else loads 2.6.0 (a version the
/// agent can still build, so the way back stays open).
fn break_the_driver(h: &Harness, node: &str) {
    let root = h
        .cluster
        .node(node)
        .unwrap()
        .host_root()
        .unwrap()
        .to_path_buf();
    std::fs::write(root.join("sys/module/tenstorrent/version"), "2.6.0\n").unwrap();
}

/// Two failed canaries in a row: 2.8.0 goes unready during its soak and is rolled back to
/// 2.7.0; then 2.9.0 fails on the canary (its tag cannot be fetched) and is rolled back to
/// 2.7.0 again, what the fleet runs, never to 2.8.0, the version that failed before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_failed_canary_rolls_back_to_what_the_fleet_runs() {
    let h = Harness::start(loaded(2)).await;
    let canary = json!({"upgradePolicy": {"canary": {"nodes": 1, "soakSeconds": 600, "autoRollback": true}}});
    let policy = h.create_policy("fleet", "2.7.0", canary).await;
    h.wait_ready(&policy, STEP).await;
    let nodes = h.nodes();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    h.wait_policy(&policy, "the canary soaking", STEP * 2, |p| {
        soaking_towards(p, "2.8.0")
    })
    .await;
    break_the_driver(&h, &nodes[0]);
    for version in ["2.8.0", "2.9.0"] {
        if version == "2.9.0" {
            h.patch_spec(&policy, json!({"version": version})).await;
        }
        let p = h
            .wait_policy(&policy, "the canary rolled back", STEP * 3, |p| {
                let rollout = p.status.as_ref().and_then(|s| s.rollout.as_ref());
                rollout.is_some_and(|r| r.target_version == version)
                    && rollout_phase(p) == phase::ROLLED_BACK
                    && node_state(p, &nodes[0]) == Some(Done)
            })
            .await;
        let rollout = p.status.as_ref().unwrap().rollout.clone().unwrap();
        assert_eq!(
            rollout.from_version.as_deref(),
            Some("2.7.0"),
            "{rollout:?}"
        );
        for node in &nodes {
            assert_eq!(
                h.kmd_version(node).await.as_deref(),
                Some("2.7.0"),
                "{node} after the {version} canary failed"
            );
        }
    }
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

/// `waitForCompletion.onTimeout: Fail`: the job outlasts its wait, the node fails with
/// `WaitForCompletionTimeout` and stays cordoned with its gates closed (the job still runs
/// there and nothing new may land), it keeps its slot so the next node does not start beside
/// it, and the job is not evicted. Once the job is gone a retry takes the node on to Done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_outlasting_their_wait_fail_the_node_and_keep_it_cordoned() {
    let h = Harness::start(loaded(2)).await;
    let wait = json!({"upgradePolicy": {"waitForCompletion": {
        "podSelector": "job-name", "timeoutSeconds": 2, "onTimeout": "Fail"}}});
    let policy = h.create_policy("fleet", "2.7.0", wait).await;
    h.wait_ready(&policy, STEP).await;
    let nodes = h.nodes();
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), h.cluster.namespace());
    let job: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train", "labels": {"job-name": "train"}},
        "spec": {"nodeName": nodes[0], "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": SLEEP_IMAGE, "args": ["3600"]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &job).await.unwrap();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    h.wait_policy(&policy, "the node failed waiting for its job", STEP, |p| {
        node_entry(p, &nodes[0]).is_some_and(|e| {
            e.state == Failed && e.reason.as_deref() == Some("WaitForCompletionTimeout")
        })
    })
    .await;
    // Given time, a released node or a started neighbour would show.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let p = h.policies().get(&policy).await.unwrap();
    let failed = node_entry(&p, &nodes[0]).unwrap();
    assert_eq!(failed.state, Failed, "{failed:?}");
    let node = h.node_api().get(&nodes[0]).await.unwrap();
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "the node stays cordoned while its job runs"
    );
    assert!(
        node.metadata.annotations.as_ref().is_some_and(|a| a
            .contains_key(ttdp_api::names::annotations::CORDONED_BY)
            && a.contains_key(ttdp_api::names::annotations::DEPLOY_GATES)),
        "our cordon and closed gates stay"
    );
    assert_eq!(
        node_state(&p, &nodes[1]),
        Some(Pending),
        "the failed node keeps its slot"
    );
    assert!(!h.monitor.sequence(&policy, &nodes[1]).contains(&Cordoning));
    let job = pods.get("train").await.unwrap();
    assert!(
        job.metadata.deletion_timestamp.is_none(),
        "the job was not evicted"
    );
    // The job ends; a retry takes the node through.
    pods.delete("train", &Default::default()).await.unwrap();
    h.annotate_node(&nodes[0], ttdp_api::names::annotations::RETRY, "now")
        .await;
    let p = h.wait_ready(&policy, STEP * 3).await;
    for node in &nodes {
        assert_eq!(node_state(&p, node), Some(Done), "{node}");
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.8.0"));
    }
    assert_eq!(h.monitor.max_cordoned(), 1);
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}
