//! Post-load validation on simulated hosts with 0, 1 and several Tenstorrent devices: the agent
//! proves the loaded driver sees every card (bound to `tenstorrent`, `/dev/tenstorrent/<n>`
//! present) and, when configured, that a command passes, before it reports Ready; a failure
//! loads the previous version back and fails the node with what was missing; the readiness probe
//! keeps checking the devices.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Node, Recording, v};
use tokio_util::sync::CancellationToken;
use ttdp_agent::probe::{ProbeChecks, readiness, readiness_with};
use ttdp_agent::reasons;
use ttdp_agent::{NodeAgent, NodeKernel};
use ttdp_api::agent_report::AgentPhase;

/// A node with `devices` Tenstorrent PCI functions (the simulated host starts with one).
fn node_with_devices(versions: &[&str], devices: usize) -> Node {
    let node = Node::new(versions);
    let pci = node.host().path("/sys/bus/pci/devices");
    std::fs::remove_dir_all(&pci).unwrap();
    for n in 0..devices {
        node.sim
            .add_pci_device(&format!("0000:{:02x}:00.0", n + 1), 0x401e)
            .unwrap();
    }
    node
}

fn agent(
    node: &Node,
    version: &str,
    command: Option<&[&str]>,
    reporter: &Recording,
) -> NodeAgent<NodeKernel, Recording> {
    let mut config = node.config(version);
    config.validation.device_wait = Duration::from_millis(200);
    config.validation.command_timeout = Duration::from_secs(10);
    config.validation.command = command.map(|argv| argv.iter().map(|a| a.to_string()).collect());
    let kernel = NodeKernel::new(config.kernel, &config.host);
    NodeAgent::new(config, kernel, reporter.clone()).unwrap()
}

async fn pass(agent: &mut NodeAgent<NodeKernel, Recording>) {
    agent.pass(&CancellationToken::new()).await.unwrap();
}

/// Waits out the agent's retry back-off (the test config caps it at 200 ms).
async fn after_backoff() {
    tokio::time::sleep(Duration::from_millis(250)).await;
}

#[tokio::test]
async fn a_node_without_cards_validates_trivially_and_says_so() {
    let node = node_with_devices(&["1.0.0"], 0);
    let reporter = Recording::default();
    pass(&mut agent(&node, "1.0.0", None, &reporter)).await;

    let report = reporter.last_report().unwrap();
    assert_eq!(report.phase, AgentPhase::Ready);
    let message = report.message.unwrap();
    assert!(
        message.contains("no Tenstorrent PCI device (vendor 1e52) on this node"),
        "{message}"
    );
    let installed = &reporter.events_with(reasons::MODULE_INSTALLED)[0];
    assert!(
        installed
            .note
            .contains("validated: no Tenstorrent PCI device"),
        "{installed:?}"
    );
    assert!(readiness(node.host(), &v("1.0.0")).is_ready());
}

#[tokio::test]
async fn one_card_is_validated_and_readiness_follows_it_when_it_vanishes() {
    let node = node_with_devices(&["1.0.0"], 1);
    let reporter = Recording::default();
    let mut agent = agent(&node, "1.0.0", None, &reporter);
    pass(&mut agent).await;

    let report = reporter.last_report().unwrap();
    assert_eq!(report.phase, AgentPhase::Ready);
    assert!(
        report
            .message
            .unwrap()
            .contains("1 of 1 devices bound to tenstorrent, each with its /dev/tenstorrent node")
    );
    let ready = readiness(node.host(), &v("1.0.0"));
    assert!(
        ready.is_ready() && ready.reason().contains("1 of 1 devices bound"),
        "{ready:?}"
    );

    // the card's device node disappears: the probe and the agent both notice, the module stays
    std::fs::remove_file(node.host().path("/dev/tenstorrent/0")).unwrap();
    let not_ready = readiness(node.host(), &v("1.0.0"));
    assert!(
        !not_ready.is_ready()
            && not_ready
                .reason()
                .contains("is loaded but 1 of 1 devices bound to tenstorrent, 0 of 1 bound with their /dev/tenstorrent node (0000:01:00.0: /dev/tenstorrent/0 missing)"),
        "{not_ready:?}"
    );
    pass(&mut agent).await;
    let lost = reporter.last_report().unwrap();
    assert_eq!(lost.phase, AgentPhase::Failed);
    assert_eq!(lost.reason.as_deref(), Some(reasons::DEVICES_LOST));
    assert!(lost.message.unwrap().contains("/dev/tenstorrent/0 missing"));
    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));

    // the node comes back: validated again, Ready again
    std::fs::write(node.host().path("/dev/tenstorrent/0"), "").unwrap();
    after_backoff().await;
    pass(&mut agent).await;
    assert_eq!(reporter.last_report().unwrap().phase, AgentPhase::Ready);
    assert!(readiness(node.host(), &v("1.0.0")).is_ready());
}

#[tokio::test]
async fn an_upgrade_that_binds_half_the_cards_is_rolled_back_and_the_node_fails() {
    let node = node_with_devices(&["1.0.0", "2.0.0"], 4);
    node.preinstall("1.0.0");
    node.kernel().limit_binding("2.0.0", Some(2)).unwrap();
    let reporter = Recording::default();
    pass(&mut agent(&node, "2.0.0", None, &reporter)).await;

    assert_eq!(
        node.loaded().as_deref(),
        Some("1.0.0"),
        "the previous version is back"
    );
    let failed = reporter.last_report().unwrap();
    assert_eq!(failed.phase, AgentPhase::Failed);
    assert_eq!(failed.reason.as_deref(), Some("ValidationFailedRolledBack"));
    assert_eq!(failed.loaded_version.as_deref(), Some("1.0.0"));
    let message = failed.message.unwrap();
    assert!(
        message.contains(
            "tenstorrent 2.0.0 loaded but does not work: 2 of 4 devices bound to tenstorrent"
        ) && message
            .contains("0000:03:00.0 is bound to no driver; 0000:04:00.0 is bound to no driver")
            && message.contains("tenstorrent 1.0.0 was loaded back"),
        "{message}"
    );
    assert_eq!(reporter.events_with("ValidationFailedRolledBack").len(), 1);
    assert!(!readiness(node.host(), &v("2.0.0")).is_ready());
    let back = readiness(node.host(), &v("1.0.0"));
    assert!(
        back.is_ready() && back.reason().contains("4 of 4 devices bound"),
        "{back:?}"
    );
}

#[tokio::test]
async fn several_cards_all_bound_upgrade_and_the_event_says_what_was_proven() {
    let node = node_with_devices(&["1.0.0", "2.0.0"], 3);
    node.preinstall("1.0.0");
    let reporter = Recording::default();
    pass(&mut agent(&node, "2.0.0", None, &reporter)).await;

    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    let replaced = &reporter.events_with(reasons::MODULE_REPLACED)[0];
    assert!(
        replaced.note.contains(
            "validated: 3 of 3 devices bound to tenstorrent, each with its /dev/tenstorrent node"
        ),
        "{replaced:?}"
    );
    assert_eq!(reporter.last_report().unwrap().phase, AgentPhase::Ready);
}

#[tokio::test]
async fn a_failing_command_rolls_back_and_a_passing_one_is_required_by_the_probe() {
    let node = node_with_devices(&["1.0.0", "2.0.0"], 2);
    node.preinstall("1.0.0");
    let failing: &[&str] = &["sh", "-c", "echo 'tt-smi: no chips found'; exit 1"];
    let reporter = Recording::default();
    pass(&mut agent(&node, "2.0.0", Some(failing), &reporter)).await;

    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));
    let failed = reporter.last_report().unwrap();
    assert_eq!(failed.reason.as_deref(), Some("ValidationFailedRolledBack"));
    let message = failed.message.unwrap();
    assert!(
        message.contains("the validation command `sh -c echo 'tt-smi: no chips found'; exit 1` failed with exit status: 1")
            && message.contains("tt-smi: no chips found"),
        "{message}"
    );

    // the same upgrade with a command that passes
    let passing: &[&str] = &["sh", "-c", "test -e \"$TTDP_HOST_ROOT/dev/tenstorrent/1\""];
    let reporter = Recording::default();
    pass(&mut agent(&node, "2.0.0", Some(passing), &reporter)).await;
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    let ready = reporter.last_report().unwrap();
    assert_eq!(ready.phase, AgentPhase::Ready);
    assert!(ready.message.unwrap().contains("passed"));

    let mut checks = ProbeChecks::defaults(node.host());
    checks.validation.command = Some(passing.iter().map(|a| a.to_string()).collect());
    assert!(readiness_with(node.host(), &v("2.0.0"), &checks).is_ready());
    // a probe configured with another command has no proof that it passed
    checks.validation.command = Some(vec!["tt-smi".into(), "-s".into()]);
    let unproven = readiness_with(node.host(), &v("2.0.0"), &checks);
    assert!(
        !unproven.is_ready() && unproven.reason().contains("`tt-smi -s` has not passed"),
        "{unproven:?}"
    );
}

#[tokio::test]
async fn a_first_install_that_fails_validation_keeps_the_driver_and_is_not_ready() {
    let node = node_with_devices(&["1.0.0"], 2);
    node.kernel().limit_binding("1.0.0", Some(1)).unwrap();
    let reporter = Recording::default();
    let mut agent = agent(&node, "1.0.0", None, &reporter);
    pass(&mut agent).await;

    assert_eq!(
        node.loaded().as_deref(),
        Some("1.0.0"),
        "never left without a driver"
    );
    let failed = reporter.last_report().unwrap();
    assert_eq!(failed.phase, AgentPhase::Failed);
    assert_eq!(failed.reason.as_deref(), Some("ValidationFailed"));
    let message = failed.message.unwrap();
    assert!(
        message.contains(
            "1 of 2 devices bound to tenstorrent (0000:02:00.0 is bound to no driver); it stays loaded because no module was loaded before it"
        ),
        "{message}"
    );
    assert!(!readiness(node.host(), &v("1.0.0")).is_ready());

    // later passes re-validate after the back-off and keep failing without reporting Ready
    after_backoff().await;
    pass(&mut agent).await;
    let again = reporter.last_report().unwrap();
    assert_eq!(again.phase, AgentPhase::Failed);
    assert_eq!(again.reason.as_deref(), Some(reasons::VALIDATION_FAILED));
    assert!(
        reporter
            .get()
            .reports
            .iter()
            .all(|r| r.phase != AgentPhase::Ready)
    );
}

#[tokio::test]
async fn validation_off_trusts_the_version_alone() {
    let node = node_with_devices(&["1.0.0"], 2);
    node.kernel().limit_binding("1.0.0", Some(0)).unwrap();
    let reporter = Recording::default();
    let mut config = node.config("1.0.0");
    config.validation.enabled = false;
    let kernel = NodeKernel::new(config.kernel, &config.host);
    let mut agent = NodeAgent::new(config, kernel, reporter.clone()).unwrap();
    pass(&mut agent).await;

    assert_eq!(reporter.last_report().unwrap().phase, AgentPhase::Ready);
    assert!(
        !readiness(node.host(), &v("1.0.0")).is_ready(),
        "the default probe checks"
    );
    let mut checks = ProbeChecks::defaults(node.host());
    checks.validation.enabled = false;
    assert!(readiness_with(node.host(), &v("1.0.0"), &checks).is_ready());
}
