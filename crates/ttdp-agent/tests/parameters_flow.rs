//! Module parameters the kernel prints in another form than they were given: the agent on a
//! simulated node reloads the module once for them, then takes them as loaded, and says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Node, Recording};
use tokio_util::sync::CancellationToken;
use ttdp_agent::{NodeAgent, NodeKernel, reasons};
use ttdp_api::agent_report::AgentPhase;

#[tokio::test]
async fn parameters_shown_in_another_form_reload_once_and_not_again() {
    let node = Node::new(&["1.0.0"]);
    node.preinstall("1.0.0");
    // what a kernel shows: an integer in decimal, a bool as N, and a custom type in its own form
    let kernel = node.kernel();
    kernel.show_parameter_as("reset_limit", Some("16")).unwrap();
    kernel.show_parameter_as("auto_reset", Some("N")).unwrap();
    kernel.show_parameter_as("mode", Some("fast")).unwrap();
    let mut config = node.config("1.0.0");
    config.parameters = "reset_limit=0x10 auto_reset=off mode=FAST".into();
    let reporter = Recording::default();
    let agent_kernel = NodeKernel::new(config.kernel, &config.host);
    let mut agent = NodeAgent::new(config, agent_kernel, reporter.clone()).unwrap();

    for _ in 0..5 {
        agent.pass(&CancellationToken::new()).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    }

    let reloads = reporter.events_with(reasons::MODULE_REPLACED);
    assert_eq!(
        reloads.len(),
        1,
        "one reload, not one per pass: {reloads:?}"
    );
    let ready = reporter.last_report().unwrap();
    assert_eq!(ready.phase, AgentPhase::Ready);
    let message = ready.message.unwrap();
    assert!(
        message.contains(r#"mode: wanted "FAST", sysfs shows "fast""#)
            && !message.contains("reset_limit:")
            && !message.contains("auto_reset:"),
        "{message}"
    );
}

/// The record of a load is believed only while sysfs still shows what it showed after it: a
/// module reloaded by hand with another value of a parameter shown in its own form is reloaded.
#[tokio::test]
async fn a_module_reloaded_by_hand_is_not_taken_for_the_one_ttdp_loaded() {
    let node = Node::new(&["1.0.0"]);
    node.preinstall("1.0.0");
    node.kernel()
        .show_parameter_as("mode", Some("fast"))
        .unwrap();
    let mut config = node.config("1.0.0");
    config.parameters = "mode=FAST".into();
    let reporter = Recording::default();
    let agent_kernel = NodeKernel::new(config.kernel, &config.host);
    let mut agent = NodeAgent::new(config, agent_kernel, reporter.clone()).unwrap();
    agent.pass(&CancellationToken::new()).await.unwrap();
    assert_eq!(reporter.events_with(reasons::MODULE_REPLACED).len(), 1);

    // someone writes another value into the parameter behind ttdp's back
    let shown = node.host().path("/sys/module/tenstorrent/parameters/mode");
    std::fs::write(&shown, "slow\n").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    agent.pass(&CancellationToken::new()).await.unwrap();
    assert_eq!(
        reporter.events_with(reasons::MODULE_REPLACED).len(),
        2,
        "reloaded with the wanted value"
    );
}
