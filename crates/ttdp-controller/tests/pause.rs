//! Pausing, on the real control plane: nothing changes state while a policy is paused, whatever
//! else changes in its spec, and a pause holds nobody out of service (a node in flight finishes
//! its upgrade and is uncordoned). A signing change (`spec.module.signing`) staged while paused
//! is held like a version change: the agents keep the key they were given until the pause ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::{Harness, STEP, agent_pods, condition, node_entry, node_state, tt_node};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PodSpec};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use ttdp_api::NodeState::*;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::{annotations, daemonset_name, env};

fn loaded(
    version: &'static str,
    n: usize,
) -> impl Fn(&str) -> Vec<ttdp_testkit::sim::TenstorrentNode> {
    move |prefix| (0..n).map(|_| tt_node(prefix).loaded(version)).collect()
}

fn cordoned(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
        || n.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotations::CORDONED_BY))
}

async fn wait_paused(h: &Harness, policy: &str) {
    h.wait_policy(policy, "Paused condition", STEP, |p| {
        condition(p, "Paused").is_some_and(|c| c.0 == "True")
    })
    .await;
}

/// The natural "stage it, unpause in the window" workflow: pause, change the version, wait
/// longer than a step may take, unpause. While paused every node stays Done on the old version,
/// none is cordoned, and none fails for waiting; once unpaused the rollout runs as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_staged_while_paused_moves_no_node_until_unpaused() {
    let h = Harness::start(loaded("2.7.0", 3)).await;
    let policy = h
        .create_policy(
            "fleet",
            "2.7.0",
            json!({"upgradePolicy": {"nodeTimeoutSeconds": 3}}),
        )
        .await;
    h.wait_ready(&policy, STEP).await;
    let nodes = h.nodes();
    h.patch_spec(&policy, json!({"paused": true})).await;
    wait_paused(&h, &policy).await;
    h.monitor.reset();
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    // Longer than nodeTimeoutSeconds, so a node wrongly started would also have failed by now.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let p = h.policies().get(&policy).await.unwrap();
    for node in &nodes {
        let entry = node_entry(&p, node).unwrap();
        assert_eq!(
            entry.state, Done,
            "{node} left Done while paused: {entry:?}"
        );
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.7.0"));
        assert!(!cordoned(&h.node_api().get(node).await.unwrap()), "{node}");
        assert!(
            h.monitor.sequence(&policy, node).iter().all(|s| *s == Done),
            "{node} went through {:?} while paused",
            h.monitor.sequence(&policy, node)
        );
    }
    assert_eq!(
        h.monitor.max_cordoned(),
        0,
        "nothing is cordoned while paused"
    );
    h.patch_spec(&policy, json!({"paused": false})).await;
    let p = h.wait_ready(&policy, STEP * 3).await;
    for node in &nodes {
        assert_eq!(node_state(&p, node), Some(Done), "{node}");
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.8.0"));
    }
    assert_eq!(h.monitor.max_cordoned(), 1);
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

/// A pause that lands while a node is being drained: that node finishes its drain and its
/// upgrade and is uncordoned during the pause; the other node does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_draining_when_paused_finishes_and_is_uncordoned() {
    let h = Harness::start(loaded("2.7.0", 2)).await;
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    h.wait_ready(&policy, STEP).await;
    let nodes = h.nodes();
    h.device_workload("inference-0", &nodes[0]).await;
    h.blocking_budget().await;
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    h.wait_policy(&policy, "drain blocked by the budget", STEP, |p| {
        node_state(p, &nodes[0]) == Some(Draining)
    })
    .await;
    h.patch_spec(&policy, json!({"paused": true})).await;
    wait_paused(&h, &policy).await;
    h.delete_budget().await;
    let finished = |p: &TenstorrentDriverPolicy| node_state(p, &nodes[0]) == Some(Done);
    let p = h
        .wait_policy(
            &policy,
            "the drained node Done while paused",
            STEP * 2,
            finished,
        )
        .await;
    assert_eq!(h.kmd_version(&nodes[0]).await.as_deref(), Some("2.8.0"));
    assert!(!cordoned(&h.node_api().get(&nodes[0]).await.unwrap()));
    let other = node_entry(&p, &nodes[1]).unwrap();
    assert_eq!(other.state, Pending, "{other:?}");
    assert_eq!(other.reason.as_deref(), Some("Paused"), "{other:?}");
    assert_eq!(h.kmd_version(&nodes[1]).await.as_deref(), Some("2.7.0"));
    assert!(!cordoned(&h.node_api().get(&nodes[1]).await.unwrap()));
    h.patch_spec(&policy, json!({"paused": false})).await;
    h.wait_ready(&policy, STEP * 2).await;
    assert_eq!(h.monitor.max_cordoned(), 1);
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

/// The value of `name` in the agent container of `pod`.
fn agent_env(pod: Option<&PodSpec>, name: &str) -> Option<String> {
    pod?.containers
        .first()?
        .env
        .as_ref()?
        .iter()
        .find(|v| v.name == name)?
        .value
        .clone()
}

/// The signing Secret (`<namespace>/<name>`) and version the policy's DaemonSet gives its agents.
async fn daemonset_target(h: &Harness, policy: &str) -> (Option<String>, Option<String>) {
    let ds = Api::<DaemonSet>::namespaced(h.client.clone(), &h.namespace)
        .get(&daemonset_name(policy))
        .await
        .unwrap();
    let pod = ds.spec.and_then(|s| s.template.spec);
    (
        agent_env(pod.as_ref(), env::MODULE_SIGNING_SECRET),
        agent_env(pod.as_ref(), env::TT_KMD_VERSION),
    )
}

/// Each node's agent pod: its uid and the signing Secret it was given.
async fn agents(h: &Harness, policy: &str) -> BTreeMap<String, (String, Option<String>)> {
    agent_pods(h, policy)
        .await
        .into_iter()
        .map(|(node, pod)| {
            let signing = agent_env(pod.spec.as_ref(), env::MODULE_SIGNING_SECRET);
            (node, (pod.uid().unwrap(), signing))
        })
        .collect()
}

/// Stages `change` on the paused `policy` and checks, after longer than a step may take, that
/// nothing moved: every node Done on 2.7.0 all along and uncordoned, the DaemonSet still giving
/// the agents `applied` (signing Secret, version), and no agent pod replaced.
async fn staged_while_paused_moves_nothing(
    h: &Harness,
    policy: &str,
    change: Value,
    applied: &(Option<String>, Option<String>),
) {
    let before = agents(h, policy).await;
    h.monitor.reset();
    h.patch_spec(policy, change.clone()).await;
    // Longer than nodeTimeoutSeconds, so a node wrongly started would also have failed by now.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let p = h.policies().get(policy).await.unwrap();
    for node in &h.nodes() {
        let entry = node_entry(&p, node).unwrap();
        assert_eq!(entry.state, Done, "{change}: {node} left Done: {entry:?}");
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.7.0"));
        assert!(!cordoned(&h.node_api().get(node).await.unwrap()), "{node}");
        assert!(
            h.monitor.sequence(policy, node).iter().all(|s| *s == Done),
            "{change}: {node} went through {:?}",
            h.monitor.sequence(policy, node)
        );
    }
    assert_eq!(h.monitor.max_cordoned(), 0, "{change}: a node was cordoned");
    assert_eq!(
        &daemonset_target(h, policy).await,
        applied,
        "{change}: the DaemonSet changed while paused"
    );
    assert_eq!(
        agents(h, policy).await,
        before,
        "{change}: an agent pod was replaced while paused"
    );
}

fn signing(secret: &str) -> Value {
    json!({"module": {"signing": {"secretName": secret}}})
}

/// `spec.module.signing` set, changed and removed while paused: the agents keep running without
/// a key (none is restarted, no node leaves Done or is cordoned, the DaemonSet is unchanged).
/// Once unpaused the key staged last reaches every agent: the DaemonSet names it, each agent
/// pod is replaced by one that has it, and no node is cordoned, since a module already at the
/// target is not reloaded for a new key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signing_change_staged_while_paused_moves_no_node_until_unpaused() {
    let h = Harness::start(loaded("2.7.0", 2)).await;
    let policy = h
        .create_policy(
            "signing",
            "2.7.0",
            json!({"upgradePolicy": {"nodeTimeoutSeconds": 3}}),
        )
        .await;
    h.wait_ready(&policy, STEP).await;
    h.patch_spec(&policy, json!({"paused": true})).await;
    wait_paused(&h, &policy).await;
    let unsigned = (None, Some("2.7.0".to_owned()));
    assert_eq!(daemonset_target(&h, &policy).await, unsigned);
    for change in [
        signing("tt-kmd-signing"),
        signing("tt-kmd-signing-rotated"),
        json!({"module": {"signing": null}}),
        signing("tt-kmd-signing"),
    ] {
        staged_while_paused_moves_nothing(&h, &policy, change, &unsigned).await;
    }
    h.monitor.reset();
    h.patch_spec(&policy, json!({"paused": false})).await;
    let secret = format!("{}/tt-kmd-signing", h.namespace);
    let given = (Some(secret.clone()), Some("2.7.0".to_owned()));
    let started = std::time::Instant::now();
    loop {
        let agents = agents(&h, &policy).await;
        let all_have_it = agents.len() == 2
            && agents
                .values()
                .all(|(_, s)| s.as_deref() == Some(secret.as_str()));
        if daemonset_target(&h, &policy).await == given && all_have_it {
            break;
        }
        assert!(
            started.elapsed() < STEP * 2,
            "the agents never got the Secret: {agents:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let p = h.wait_ready(&policy, STEP * 2).await;
    for node in &h.nodes() {
        assert_eq!(node_state(&p, node), Some(Done), "{node}");
        assert_eq!(h.kmd_version(node).await.as_deref(), Some("2.7.0"));
    }
    assert_eq!(h.monitor.max_cordoned(), 0, "no reload, so no cordon");
    h.assert_nothing_left_behind().await;
    h.shutdown().await;
}

/// A version bump staged together with a signing Secret while paused moves nothing either; once
/// unpaused both go out together: the agents are given the Secret with the new version, and
/// since the simulated kubelet mounts no Secret, the first node fails `SigningKeyUnusable`
/// naming it and keeps its working driver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_and_signing_staged_while_paused_go_out_together() {
    let h = Harness::start(loaded("2.7.0", 2)).await;
    let policy = h
        .create_policy(
            "signed-bump",
            "2.7.0",
            json!({"upgradePolicy": {"nodeTimeoutSeconds": 3}}),
        )
        .await;
    h.wait_ready(&policy, STEP).await;
    h.patch_spec(&policy, json!({"paused": true})).await;
    wait_paused(&h, &policy).await;
    let applied = (None, Some("2.7.0".to_owned()));
    let bump = json!({"version": "2.8.0", "module": {"signing": {"secretName": "tt-kmd-signing"}}});
    staged_while_paused_moves_nothing(&h, &policy, bump, &applied).await;
    staged_while_paused_moves_nothing(&h, &policy, signing("tt-kmd-signing-rotated"), &applied)
        .await;
    h.patch_spec(&policy, json!({"paused": false})).await;
    let secret = format!("{}/tt-kmd-signing-rotated", h.namespace);
    let failed = |p: &TenstorrentDriverPolicy| {
        h.nodes().iter().any(|n| {
            node_entry(p, n).is_some_and(|e| {
                e.state == Failed && e.reason.as_deref() == Some("SigningKeyUnusable")
            })
        })
    };
    let p = h
        .wait_policy(
            &policy,
            "a node failed with SigningKeyUnusable",
            STEP * 2,
            failed,
        )
        .await;
    assert_eq!(
        daemonset_target(&h, &policy).await,
        (Some(secret.clone()), Some("2.8.0".to_owned()))
    );
    for node in &h.nodes() {
        let entry = node_entry(&p, node).unwrap();
        if entry.state == Failed {
            let message = entry.message.clone().unwrap_or_default();
            assert!(message.contains(&format!("Secret {secret}")), "{message}");
        }
        assert_eq!(
            h.cluster.node(node).unwrap().loaded_version().as_deref(),
            Some("2.7.0"),
            "{node}: the working driver stays loaded"
        );
    }
    h.shutdown().await;
}
