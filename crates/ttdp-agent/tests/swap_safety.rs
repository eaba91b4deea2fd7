//! The promise "a node is never left without the driver it had", over every point where an
//! agent can be killed mid-swap: the real binary on a simulated node (`TTDP_KERNEL=sim`) is
//! SIGKILLed at each test-hook point of an upgrade, the target then becomes unobtainable (its
//! cache entry corrupt, the repository gone), and the restarted agent must load the previous
//! version back from the cache, never treating the node as a new one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::agent_process::{killed, spawn_agent, wait_for};
use common::{Node, RELEASE};
use ttdp_api::agent_report::AgentPhase;
use ttdp_api::names::labels;
use ttdp_kmod::test_hook::{
    AFTER_LOAD, AFTER_UNLOAD, BEFORE_UNLOAD, KILL_AT_ENV, VALIDATION_ROLLBACK,
};

const FAILING_VALIDATION: &str = r#"["sh","-c","echo no chips answered; exit 3"]"#;

/// Makes `version` unobtainable: its cache entry corrupt, the repository gone.
fn make_unobtainable(node: &Node, version: &str) {
    let ko = node.host().path(format!(
        "/var/cache/tt-kmd/{RELEASE}/{version}/tenstorrent.ko"
    ));
    std::fs::write(&ko, b"not a module any more").unwrap();
    std::fs::remove_dir_all(node.repo.dir()).unwrap();
}

/// One point of the kill matrix: 1.0.0 loaded and cached, the agent for 2.0.0 SIGKILLed at
/// `point` (with a validation that fails when `failing_validation`), 2.0.0 made unobtainable,
/// the agent restarted: 1.0.0 must be loaded again, reported and labelled, with `reason`.
fn killed_then_unobtainable(point: &str, failing_validation: bool, reason: &str) {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    let mut env = vec![(KILL_AT_ENV, point)];
    if failing_validation {
        env.push(("TTDP_VALIDATION_COMMAND", FAILING_VALIDATION));
    }
    killed(spawn_agent(&node, "2.0.0", &env, "killed.log"), point);
    let left = node.loaded();
    make_unobtainable(&node, "2.0.0");

    let env: &[(&str, &str)] = if failing_validation {
        &[("TTDP_VALIDATION_COMMAND", FAILING_VALIDATION)]
    } else {
        &[]
    };
    let mut agent = spawn_agent(&node, "2.0.0", env, "restarted.log");
    // The failure's report lasts only until the next attempt's replaces it (a few hundred ms,
    // which a loaded machine's polling can miss); its Event stays.
    let file = wait_for(&node, "restarted.log", reason, |f| {
        f.events.iter().any(|e| e.reason == reason)
            || f.report.as_ref().is_some_and(|r| {
                r.phase == AgentPhase::Failed && r.reason.as_deref() == Some(reason)
            })
    });
    agent.kill().unwrap();
    agent.wait().unwrap();
    eprintln!(
        "killed at {point}: left {left:?}; restarted: {:?}",
        node.loaded()
    );
    assert_eq!(node.loaded().as_deref(), Some("1.0.0"), "killed at {point}");
    let report = file.report.unwrap();
    assert_eq!(report.loaded_version.as_deref(), Some("1.0.0"));
    assert_eq!(
        file.labels.get(labels::KMD_VERSION).map(String::as_str),
        Some("1.0.0")
    );
    assert!(
        !node.host().path("/run/ttdp/tenstorrent.swap").exists(),
        "the journal is settled"
    );
    let log = std::fs::read_to_string(node.dir.path().join("restarted.log")).unwrap();
    assert!(
        !log.contains("\"outcome\":\"Installed\""),
        "the restarted agent never installed on the node as on a new one:\n{log}"
    );
}

#[test]
fn killed_before_the_unload_keeps_the_previous_version() {
    killed_then_unobtainable(BEFORE_UNLOAD, false, "FetchFailed");
}

#[test]
fn killed_between_unload_and_load_loads_the_previous_version_back() {
    killed_then_unobtainable(AFTER_UNLOAD, false, "SwapResumedRolledBack");
}

#[test]
fn killed_after_a_load_that_fails_validation_loads_the_previous_version_back() {
    killed_then_unobtainable(AFTER_LOAD, true, "SwapResumedRolledBack");
}

#[test]
fn killed_during_a_validation_rollback_finishes_the_rollback() {
    killed_then_unobtainable(VALIDATION_ROLLBACK, true, "SwapResumedRolledBack");
}

/// When the target is still loadable from the cache, the restarted agent finishes the swap.
#[test]
fn killed_between_unload_and_load_finishes_the_swap_when_the_target_loads() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    killed(
        spawn_agent(&node, "2.0.0", &[(KILL_AT_ENV, AFTER_UNLOAD)], "killed.log"),
        AFTER_UNLOAD,
    );
    assert_eq!(node.loaded(), None);
    std::fs::remove_dir_all(node.repo.dir()).unwrap();
    let mut agent = spawn_agent(&node, "2.0.0", &[], "restarted.log");
    let file = wait_for(&node, "restarted.log", "Ready for 2.0.0", |f| {
        f.report
            .as_ref()
            .is_some_and(|r| r.phase == AgentPhase::Ready)
    });
    agent.kill().unwrap();
    agent.wait().unwrap();
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    assert!(
        file.events.iter().any(|e| e.reason == "SwapResumed"),
        "{:?}",
        file.events
    );
}
