//! The kernels a node may boot next: once Ready, the agent prepares the target's module for
//! each other installed kernel in the background (never touching the loaded module, never
//! delaying the main flow), reports how each stands, loads the prepared module at once after a
//! boot into that kernel (its start load recorded), and prunes the cache of kernels that are
//! gone. Simulated nodes with the real fetch and build path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Node, RELEASE, Recording, v};
use tokio_util::sync::CancellationToken;
use ttdp_agent::{AgentConfig, NodeAgent, NodeKernel};
use ttdp_api::agent_report::{AgentPhase, KernelModuleState, KernelReadiness};
use ttdp_kmod::{Kernel, KoCache};

const NEXT: &str = "6.9.0-next";

fn agent(config: AgentConfig, reporter: &Recording) -> NodeAgent<NodeKernel, Recording> {
    let kernel = NodeKernel::new(config.kernel, &config.host);
    NodeAgent::new(config, kernel, reporter.clone()).unwrap()
}

fn config(node: &Node) -> AgentConfig {
    let mut config = node.config("2.0.0");
    config.kernel_scan_period = Duration::ZERO;
    config
}

/// Runs passes until the last report satisfies `done`; panics after `limit`.
async fn passes_until(
    agent: &mut NodeAgent<NodeKernel, Recording>,
    reporter: &Recording,
    limit: Duration,
    what: &str,
    done: impl Fn(&ttdp_api::agent_report::AgentReport) -> bool,
) {
    let started = Instant::now();
    let shutdown = CancellationToken::new();
    loop {
        agent.pass(&shutdown).await.unwrap();
        if reporter.last_report().is_some_and(|r| done(&r)) {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "timed out waiting for {what}; last report: {:?}",
            reporter.last_report()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn kernels(reporter: &Recording) -> Vec<KernelReadiness> {
    reporter
        .last_report()
        .map(|r| r.installed_kernels)
        .unwrap_or_default()
}

fn state_of(reporter: &Recording, release: &str) -> Option<KernelModuleState> {
    kernels(reporter)
        .into_iter()
        .find(|k| k.release == release)
        .map(|k| k.state)
}

/// Makes every build for kernel `release` take at least `seconds`.
fn slow_builds_of(node: &Node, release: &str, seconds: u32) {
    let script = node.host().path(format!(
        "/usr/src/linux-headers-{release}/scripts/sim-kbuild.sh"
    ));
    let text = std::fs::read_to_string(&script).unwrap();
    let slowed = text.replacen("set -eu\n", &format!("set -eu\nsleep {seconds}\n"), 1);
    assert_ne!(text, slowed);
    std::fs::write(&script, slowed).unwrap();
}

/// Boots the simulated node into `release`: the module goes (nothing survives a reboot) and
/// the kernel release changes.
fn reboot_into(node: &Node, release: &str) {
    if node.loaded().is_some() {
        node.kernel().unload("tenstorrent").unwrap();
    }
    std::fs::write(
        node.host().path("/proc/sys/kernel/osrelease"),
        format!("{release}\n"),
    )
    .unwrap();
    std::fs::write(
        node.host().path("/proc/version"),
        format!("Linux version {release} (sim@ttdp) (cc (GCC) 12.2.0, GNU ld (GNU Binutils) 2.40) #1 SMP PREEMPT_DYNAMIC\n"),
    )
    .unwrap();
}

#[tokio::test]
async fn a_ready_node_prepares_its_next_kernel_and_says_so() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.sim.add_kernel(NEXT, true, true).unwrap();
    slow_builds_of(&node, NEXT, 2);
    let reporter = Recording::default();
    let mut agent = agent(config(&node), &reporter);

    passes_until(
        &mut agent,
        &reporter,
        Duration::from_secs(60),
        "Ready",
        |r| r.phase == AgentPhase::Ready,
    )
    .await;
    passes_until(
        &mut agent,
        &reporter,
        Duration::from_secs(60),
        "Pending",
        |r| {
            r.installed_kernels
                .iter()
                .any(|k| k.state == KernelModuleState::Pending)
        },
    )
    .await;
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    passes_until(
        &mut agent,
        &reporter,
        Duration::from_secs(60),
        "the next kernel Ready",
        |r| {
            r.installed_kernels
                .iter()
                .all(|k| k.state == KernelModuleState::Ready)
        },
    )
    .await;

    assert_eq!(
        kernels(&reporter),
        vec![KernelReadiness {
            release: NEXT.into(),
            state: KernelModuleState::Ready,
            reason: None,
            message: None,
        }],
        "every installed kernel but the running one"
    );
    let cache = KoCache::new(node.host());
    let record = cache.record(NEXT, &v("2.0.0")).unwrap();
    assert!(
        record.vermagic.starts_with(&format!("{NEXT} ")),
        "{record:?}"
    );
    assert_eq!(
        node.loaded().as_deref(),
        Some("2.0.0"),
        "the loaded module is untouched"
    );
    assert_eq!(reporter.last_report().unwrap().phase, AgentPhase::Ready);
}

#[tokio::test]
async fn a_kernel_without_headers_is_reported_with_what_to_install() {
    let node = Node::new(&["2.0.0"]);
    node.sim.add_kernel(NEXT, false, true).unwrap();
    let reporter = Recording::default();
    let mut agent = agent(config(&node), &reporter);

    passes_until(
        &mut agent,
        &reporter,
        Duration::from_secs(60),
        "Failed",
        |r| {
            r.phase == AgentPhase::Ready
                && r.installed_kernels
                    .iter()
                    .any(|k| k.state == KernelModuleState::Failed)
        },
    )
    .await;
    let failed = kernels(&reporter).pop().unwrap();
    assert_eq!(failed.release, NEXT);
    assert_eq!(failed.reason.as_deref(), Some("HeadersMissing"));
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains(&format!("install linux-headers-{NEXT}")),
        "{message}"
    );
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
}

/// A next kernel built by another GCC than the image's is not built ahead of the reboot: it is
/// reported as the main flow reports the running kernel, naming both compilers.
#[tokio::test]
async fn a_kernel_built_by_another_gcc_is_a_compiler_mismatch_naming_both() {
    let node = Node::new(&["2.0.0"]);
    node.sim.add_kernel(NEXT, true, true).unwrap();
    std::fs::write(
        node.host()
            .path(format!("/usr/src/linux-headers-{NEXT}/.config")),
        "CONFIG_CC_IS_GCC=y\nCONFIG_CC_VERSION_TEXT=\"gcc-13 (Debian 13.2.0-25) 13.2.0\"\n",
    )
    .unwrap();
    let reporter = Recording::default();
    let mut config = config(&node);
    // the running kernel's banner names GCC 12: the main flow builds
    config.builder_gcc = Some(12);
    let mut agent = agent(config, &reporter);

    passes_until(
        &mut agent,
        &reporter,
        Duration::from_secs(60),
        "the next kernel Failed",
        |r| {
            r.phase == AgentPhase::Ready
                && r.installed_kernels
                    .iter()
                    .any(|k| k.state == KernelModuleState::Failed)
        },
    )
    .await;
    let failed = kernels(&reporter).pop().unwrap();
    assert_eq!(failed.release, NEXT);
    assert_eq!(failed.reason.as_deref(), Some("CompilerMismatch"));
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains("gcc-13") && message.contains("gcc 12") && message.contains(NEXT),
        "{message}"
    );
    assert_eq!(
        KoCache::new(node.host()).lookup(NEXT, &v("2.0.0")).unwrap(),
        ttdp_kmod::CacheLookup::Miss,
        "nothing was built for it"
    );
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
}

#[tokio::test]
async fn the_main_flow_never_waits_for_a_background_build() {
    let node = Node::new(&["2.0.0"]);
    node.sim.add_kernel(NEXT, true, true).unwrap();
    slow_builds_of(&node, NEXT, 30);
    let reporter = Recording::default();
    let mut agent = agent(config(&node), &reporter);
    passes_until(
        &mut agent,
        &reporter,
        Duration::from_secs(60),
        "Pending",
        |r| {
            r.phase == AgentPhase::Ready
                && r.installed_kernels
                    .iter()
                    .any(|k| k.state == KernelModuleState::Pending)
        },
    )
    .await;

    // the module goes from under the agent while the next kernel's build runs
    node.kernel().unload("tenstorrent").unwrap();
    let started = Instant::now();
    passes_until(
        &mut agent,
        &reporter,
        Duration::from_secs(20),
        "Ready again",
        |r| r.phase == AgentPhase::Ready && r.loaded_version.as_deref() == Some("2.0.0"),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the swap waited {:?} for the background build",
        started.elapsed()
    );
    assert_eq!(state_of(&reporter, NEXT), Some(KernelModuleState::Pending));
}

#[tokio::test]
async fn a_boot_into_a_prepared_kernel_loads_it_from_the_cache_at_once() {
    let node = Node::new(&["2.0.0"]);
    node.sim.add_kernel(NEXT, true, true).unwrap();
    let reporter = Recording::default();
    let mut first = agent(config(&node), &reporter);
    passes_until(
        &mut first,
        &reporter,
        Duration::from_secs(60),
        "prepared",
        |r| {
            r.phase == AgentPhase::Ready
                && r.installed_kernels
                    .iter()
                    .any(|k| k.state == KernelModuleState::Ready)
        },
    )
    .await;
    let started = reporter.last_report().unwrap().start_load.unwrap();
    assert!(!started.cache_hit, "the first install built the module");
    drop(first);

    reboot_into(&node, NEXT);
    let mut config = config(&node);
    // nothing can be fetched now: a build would fail
    config.build.repository = node.dir.path().join("gone").display().to_string();
    let reporter = Recording::default();
    let mut second = agent(config, &reporter);
    second.pass(&CancellationToken::new()).await.unwrap();

    let report = reporter.last_report().unwrap();
    assert_eq!(report.phase, AgentPhase::Ready, "{report:?}");
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    let start = report.start_load.expect("the start load is reported");
    assert!(start.cache_hit);
    assert!(start.ready_after_ms < 10_000, "{start:?}");
    assert!(
        reporter
            .get()
            .reports
            .iter()
            .all(|r| r.phase != AgentPhase::Building),
        "nothing was built"
    );

    // the kernel it came from is now the other one, and its module is still cached
    passes_until(
        &mut second,
        &reporter,
        Duration::from_secs(30),
        "the old kernel listed",
        |r| {
            r.installed_kernels
                .iter()
                .any(|k| k.release == RELEASE && k.state == KernelModuleState::Ready)
        },
    )
    .await;

    // removing it prunes its cache entry; the running kernel's stays
    node.sim.remove_kernel(RELEASE).unwrap();
    let cache = KoCache::new(node.host());
    passes_until(
        &mut second,
        &reporter,
        Duration::from_secs(30),
        "pruned",
        |r| r.installed_kernels.is_empty() && cache.versions(RELEASE).is_empty(),
    )
    .await;
    assert_eq!(cache.versions(NEXT), vec![v("2.0.0")]);
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
}
