//! An agent whose image carries another gcc than the one that built the kernel builds nothing:
//! it labels the node with the kernel's compiler and says why it waits; with the kernel's gcc it
//! builds as always. Simulated nodes with the real fetch and build path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Node, Recording};
use tokio_util::sync::CancellationToken;
use ttdp_agent::reasons;
use ttdp_agent::{NodeAgent, NodeKernel};
use ttdp_api::agent_report::AgentPhase;
use ttdp_api::names::compiler::KERNEL_COMPILER_LABEL;

const GCC13: &str = "Linux version 6.8.0-sim (buildd@ttdp) (x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0, GNU ld (GNU Binutils for Ubuntu) 2.42) #1 SMP\n";

/// A node whose kernel gcc 13 built, and an agent whose image says it carries `image_gcc`.
fn agent_on_gcc13(
    node: &Node,
    image_gcc: Option<u32>,
    reporter: &Recording,
) -> NodeAgent<NodeKernel, Recording> {
    std::fs::write(node.host().path("/proc/version"), GCC13).unwrap();
    let mut config = node.config("2.0.0");
    config.builder_gcc = image_gcc;
    let kernel = NodeKernel::new(config.kernel, &config.host);
    NodeAgent::new(config, kernel, reporter.clone()).unwrap()
}

#[tokio::test]
async fn an_image_of_another_gcc_builds_nothing_and_says_why() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    let reporter = Recording::default();
    let mut agent = agent_on_gcc13(&node, Some(12), &reporter);

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded(), None, "nothing loaded");
    assert!(node.cached().is_empty(), "nothing built");
    assert_eq!(
        reporter.label(KERNEL_COMPILER_LABEL).as_deref(),
        Some("gcc-13")
    );
    let report = reporter.last_report().unwrap();
    assert_eq!(report.phase, AgentPhase::WaitingForBuilder);
    assert_eq!(report.reason.as_deref(), Some(reasons::COMPILER_MISMATCH));
    assert_eq!(report.kernel_compiler.as_deref(), Some("gcc-13"));
    let message = report.message.unwrap_or_default();
    assert!(
        message.contains("gcc-13") && message.contains("gcc 12"),
        "{message}"
    );
    assert_eq!(reporter.events_with(reasons::COMPILER_MISMATCH).len(), 1);
}

#[tokio::test]
async fn an_image_of_the_kernels_gcc_or_one_that_does_not_say_builds() {
    for image_gcc in [Some(13), None] {
        let node = Node::new(&["1.0.0", "2.0.0"]);
        let reporter = Recording::default();
        let mut agent = agent_on_gcc13(&node, image_gcc, &reporter);

        agent.pass(&CancellationToken::new()).await.unwrap();

        assert_eq!(node.loaded().as_deref(), Some("2.0.0"), "{image_gcc:?}");
        assert_eq!(
            reporter.label(KERNEL_COMPILER_LABEL).as_deref(),
            Some("gcc-13")
        );
        let report = reporter.last_report().unwrap();
        assert_eq!(report.phase, AgentPhase::Ready, "{image_gcc:?}");
        assert_eq!(report.kernel_compiler.as_deref(), Some("gcc-13"));
    }
}

#[tokio::test]
async fn a_verified_cache_hit_loads_whatever_compiler_the_image_has() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    let reporter = Recording::default();
    let mut builder = agent_on_gcc13(&node, Some(13), &reporter);
    builder.pass(&CancellationToken::new()).await.unwrap();
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    drop(builder);
    // a reboot: the module is gone, its verified .ko stays in the cache
    ttdp_kmod::Kernel::unload(&node.kernel(), "tenstorrent").unwrap();

    let reporter = Recording::default();
    let mut agent = agent_on_gcc13(&node, Some(12), &reporter);
    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(
        node.loaded().as_deref(),
        Some("2.0.0"),
        "nothing to build: loaded"
    );
    let report = reporter.last_report().unwrap();
    assert_eq!(report.phase, AgentPhase::Ready, "{report:?}");
    assert!(reporter.events_with(reasons::COMPILER_MISMATCH).is_empty());
}
