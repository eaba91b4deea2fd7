//! The grant is decided under the module lock: what an agent checked before it (the loaded
//! module, the controller's grant) may be minutes old by the time it holds the lock, so it is
//! read again there, and nothing is unloaded or killed unless the grant is valid then.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Node, Recording, v, wait_until};
use tokio_util::sync::CancellationToken;
use ttdp_agent::grant::GrantView;
use ttdp_agent::{NodeAgent, NodeKernel};
use ttdp_api::agent_report::AgentPhase;
use ttdp_api::names::upgrade_grant;
use ttdp_kmod::{FileLock, InstallerConfig, ModuleInstaller, SimKernel};

const WAIT: Duration = Duration::from_secs(30);
const HOLDER: i32 = 4242;

fn grant(value: Option<&str>) -> Option<GrantView> {
    Some(GrantView::Node {
        grant: value.map(str::to_string),
        policy: Some("fleet".into()),
    })
}

/// An installer of the node's host, as another agent would have.
fn other_installer(node: &Node) -> ModuleInstaller<SimKernel> {
    let config = InstallerConfig {
        build: node.config("1.0.0").build,
        ..InstallerConfig::default()
    };
    ModuleInstaller::new(node.host().clone(), node.kernel(), config).unwrap()
}

/// Runs one pass of `agent` in a task while the test holds the module lock, lets `meanwhile`
/// change the world once the agent is past its checks (`past_checks`), then releases the lock.
async fn pass_while_the_lock_is_held(
    agent: NodeAgent<NodeKernel, Recording>,
    past_checks: impl FnMut() -> bool,
    meanwhile: impl FnOnce(),
) {
    let lock = FileLock::acquire(&agent.installer().module_lock_path(), WAIT).unwrap();
    let pass = tokio::spawn(async move {
        let mut agent = agent;
        agent.pass(&CancellationToken::new()).await.unwrap();
    });
    wait_until(
        "the agent past its checks before the lock",
        WAIT,
        past_checks,
    )
    .await;
    // long enough for the agent to be waiting for the lock (its checks take milliseconds)
    tokio::time::sleep(Duration::from_millis(300)).await;
    meanwhile();
    drop(lock);
    tokio::time::timeout(WAIT, pass).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_revoked_while_waiting_for_the_lock_unloads_nothing_and_kills_no_one() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    other_installer(&node).ensure_ko(&v("2.0.0")).unwrap();
    node.kernel().hold(HOLDER, "python3").unwrap();
    let reporter = Recording::default();
    reporter.get().grant = grant(Some(&upgrade_grant("fleet", "2.0.0")));
    let mut config = node.config("2.0.0");
    config.force_unload = true;
    let kernel = NodeKernel::new(config.kernel, &config.host);
    let agent = NodeAgent::new(config, kernel, reporter.clone()).unwrap();

    let revoke = || reporter.get().grant = grant(None);
    pass_while_the_lock_is_held(agent, || reporter.get().grant_reads >= 1, revoke).await;

    assert_eq!(node.loaded().as_deref(), Some("1.0.0"), "nothing unloaded");
    assert!(node.kernel().process_alive(HOLDER), "no holder killed");
    assert_eq!(reporter.get().grant_reads, 2, "read again under the lock");
    let report = reporter.last_report().unwrap();
    assert_eq!(report.phase, AgentPhase::WaitingForGrant);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_another_agent_loads_while_waiting_for_the_lock_needs_the_grant() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    let other = other_installer(&node);
    other.ensure_ko(&v("2.0.0")).unwrap();
    let old = other.ensure_ko(&v("1.0.0")).unwrap().ko;
    let reporter = Recording::default();
    reporter.get().grant = grant(None);
    let config = node.config("2.0.0");
    let kernel = NodeKernel::new(config.kernel, &config.host);
    let agent = NodeAgent::new(config, kernel, reporter.clone()).unwrap();

    // nothing is loaded when the agent checks, so it needs no grant; then, while it waits for
    // the lock, another agent (a hand-over between policies) installs 1.0.0
    let install_other = || other.load(&old, "").unwrap();
    let observed = || !reporter.get().label_patches.is_empty();
    pass_while_the_lock_is_held(agent, observed, install_other).await;

    assert_eq!(node.loaded().as_deref(), Some("1.0.0"), "nothing unloaded");
    assert_eq!(
        reporter.get().grant_reads,
        1,
        "only under the lock: before it, nothing was loaded"
    );
    assert_eq!(
        reporter.last_report().unwrap().phase,
        AgentPhase::WaitingForGrant
    );
}
