//! Full agent flows on simulated nodes (temporary host roots with the file-backed kernel), with
//! the real fetch and build path against a local tt-kmd repository and a fake build tree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Node, Recording, TT_SMI_CONTENT, TT_SMI_VERSION, v, wait_until};
use tokio_util::sync::CancellationToken;
use ttdp_agent::probe::readiness;
use ttdp_agent::reasons;
use ttdp_agent::reporting::EventKind;
use ttdp_agent::{NodeAgent, NodeKernel};
use ttdp_api::agent_report::{AgentPhase, Holder};
use ttdp_api::names::labels;
use ttdp_kmod::{Kernel, SimKernel};

const WAIT: Duration = Duration::from_secs(30);

fn agent(node: &Node, version: &str, reporter: &Recording) -> NodeAgent<NodeKernel, Recording> {
    let config = node.config(version);
    let kernel = NodeKernel::new(config.kernel, &config.host);
    NodeAgent::new(config, kernel, reporter.clone()).unwrap()
}

fn phases(reporter: &Recording) -> Vec<AgentPhase> {
    reporter.get().reports.iter().map(|r| r.phase).collect()
}

#[tokio::test]
async fn fresh_install_builds_loads_copies_tt_smi_and_labels() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    let reporter = Recording::default();
    let mut agent = agent(&node, "2.0.0", &reporter);
    assert!(!readiness(node.host(), &v("2.0.0")).is_ready());

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    assert_eq!(node.cached(), vec!["2.0.0".to_string()]);
    assert_eq!(std::fs::read(node.host_tt_smi()).unwrap(), TT_SMI_CONTENT);
    assert_eq!(
        reporter.label(labels::INSTALL_MODE).as_deref(),
        Some("container")
    );
    assert_eq!(
        reporter.label(labels::KMD_VERSION).as_deref(),
        Some("2.0.0")
    );
    assert_eq!(
        reporter.label(labels::TT_SMI_VERSION).as_deref(),
        Some(TT_SMI_VERSION)
    );
    assert_eq!(
        phases(&reporter),
        vec![
            AgentPhase::Building,
            AgentPhase::Swapping,
            AgentPhase::Ready
        ]
    );
    let ready = reporter.last_report().unwrap();
    assert_eq!(ready.loaded_version.as_deref(), Some("2.0.0"));
    assert_eq!(ready.install_mode, "container");
    let installed = reporter.events_with(reasons::MODULE_INSTALLED);
    assert_eq!(installed.len(), 1);
    assert_eq!(installed[0].kind, EventKind::Normal);
    assert_eq!(reporter.events_with(reasons::TT_SMI_INSTALLED).len(), 1);
    // the first label patch told the truth before anything was loaded
    let first = reporter.get().label_patches[0].clone();
    assert_eq!(first.get(labels::KMD_VERSION), Some(None));
    assert!(readiness(node.host(), &v("2.0.0")).is_ready());

    // a second pass changes and publishes nothing
    let counts = |r: &Recording| {
        let p = r.get();
        (p.reports.len(), p.label_patches.len(), p.events.len())
    };
    let before = counts(&reporter);
    agent.pass(&CancellationToken::new()).await.unwrap();
    assert_eq!(counts(&reporter), before);
}

#[tokio::test]
async fn cache_hit_installs_without_the_repository() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("2.0.0");
    node.kernel().unload("tenstorrent").unwrap();
    std::fs::remove_dir_all(node.repo.dir()).unwrap();
    let reporter = Recording::default();
    let mut agent = agent(&node, "2.0.0", &reporter);

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    assert_eq!(
        phases(&reporter),
        vec![AgentPhase::Swapping, AgentPhase::Ready],
        "a cache hit never reports Building"
    );
}

#[tokio::test]
async fn cache_miss_upgrade_replaces_the_old_version() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    let reporter = Recording::default();
    let mut agent = agent(&node, "2.0.0", &reporter);

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    assert_eq!(
        node.cached(),
        vec!["1.0.0".to_string(), "2.0.0".to_string()]
    );
    let replaced = reporter.events_with(reasons::MODULE_REPLACED);
    assert_eq!(replaced.len(), 1);
    assert!(
        replaced[0]
            .note
            .contains("replaced tt-kmd 1.0.0 with 2.0.0"),
        "{:?}",
        replaced[0]
    );
    let patches = reporter.get().label_patches.clone();
    assert_eq!(patches[0].get(labels::KMD_VERSION), Some(Some("1.0.0")));
    assert_eq!(
        reporter.label(labels::KMD_VERSION).as_deref(),
        Some("2.0.0")
    );
}

#[tokio::test]
async fn host_managed_node_is_reported_and_never_touched() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    node.sim.add_dkms_source("1.0.0").unwrap();
    let cache_before = node.cached();
    let reporter = Recording::default();
    let mut agent = agent(&node, "2.0.0", &reporter);

    for _ in 0..3 {
        agent.pass(&CancellationToken::new()).await.unwrap();
    }

    assert_eq!(
        node.loaded().as_deref(),
        Some("1.0.0"),
        "never rmmod/insmod"
    );
    assert_eq!(node.cached(), cache_before, "never writes the cache");
    assert!(!node.host_tt_smi().exists(), "never copies tt-smi");
    assert_eq!(
        reporter.label(labels::INSTALL_MODE).as_deref(),
        Some("host")
    );
    assert_eq!(
        reporter.label(labels::KMD_VERSION).as_deref(),
        Some("1.0.0")
    );
    assert_eq!(reporter.label(labels::TT_SMI_VERSION), None);
    let report = reporter.last_report().unwrap();
    assert_eq!(report.phase, AgentPhase::HostManaged);
    assert_eq!(report.install_mode, "host");
    assert!(
        report
            .message
            .unwrap()
            .contains("/usr/src/tenstorrent-1.0.0/dkms.conf")
    );
    assert_eq!(
        reporter.get().reports.len(),
        1,
        "unchanged reports are not republished"
    );
    assert_eq!(reporter.events_with(reasons::HOST_MANAGED).len(), 1);
    assert!(readiness(node.host(), &v("2.0.0")).is_ready());
}

#[tokio::test]
async fn matching_version_needs_no_swap() {
    let node = Node::new(&["2.0.0"]);
    node.preinstall("2.0.0");
    std::fs::remove_dir_all(node.repo.dir()).unwrap();
    let reporter = Recording::default();
    let mut agent = agent(&node, "2.0.0", &reporter);

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(phases(&reporter), vec![AgentPhase::Ready]);
    assert!(reporter.events_with(reasons::MODULE_INSTALLED).is_empty());
    assert!(reporter.events_with(reasons::MODULE_REPLACED).is_empty());
    assert_eq!(
        reporter.label(labels::KMD_VERSION).as_deref(),
        Some("2.0.0")
    );
    assert_eq!(std::fs::read(node.host_tt_smi()).unwrap(), TT_SMI_CONTENT);
}

#[tokio::test]
async fn holders_block_the_swap_until_they_are_gone() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    let kernel = node.kernel();
    kernel.hold(1234, "python3").unwrap();
    kernel.hold(1240, "tt-smi").unwrap();
    let reporter = Recording::default();
    let agent = agent(&node, "2.0.0", &reporter);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(agent.run(shutdown.clone()));

    wait_until("a WaitingForHolders report", WAIT, || {
        reporter
            .last_report()
            .is_some_and(|r| r.phase == AgentPhase::WaitingForHolders)
    })
    .await;
    let waiting = reporter.last_report().unwrap();
    assert_eq!(waiting.reason.as_deref(), Some(reasons::DEVICE_HELD));
    assert_eq!(
        waiting.holders,
        vec![
            Holder {
                pid: 1234,
                comm: "python3".into()
            },
            Holder {
                pid: 1240,
                comm: "tt-smi".into()
            }
        ]
    );
    assert_eq!(
        waiting.holders_text().as_deref(),
        Some("held by pid 1234 (python3), pid 1240 (tt-smi)")
    );
    let held = reporter.events_with(reasons::DEVICE_HELD);
    assert_eq!(held[0].kind, EventKind::Warning);
    assert!(
        held[0]
            .note
            .contains("held by pid 1234 (python3), pid 1240 (tt-smi)"),
        "{}",
        held[0].note
    );
    // the .ko was built while waiting, the old module is untouched
    assert_eq!(
        node.cached(),
        vec!["1.0.0".to_string(), "2.0.0".to_string()]
    );

    // several retries later: still waiting, still alive, announced once
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !running.is_finished(),
        "the agent must not exit while the device is held"
    );
    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));
    assert_eq!(
        reporter.label(labels::KMD_VERSION).as_deref(),
        Some("1.0.0")
    );
    assert_eq!(reporter.events_with(reasons::DEVICE_HELD).len(), 1);
    assert!(!readiness(node.host(), &v("2.0.0")).is_ready());

    kernel.release(1234).unwrap();
    kernel.release(1240).unwrap();
    wait_until("the upgrade after the holders left", WAIT, || {
        reporter
            .last_report()
            .is_some_and(|r| r.phase == AgentPhase::Ready)
    })
    .await;
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    assert_eq!(
        reporter.label(labels::KMD_VERSION).as_deref(),
        Some("2.0.0")
    );
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test]
async fn force_unload_kills_the_holders_and_upgrades() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    node.kernel().hold(4242, "python3").unwrap();
    let reporter = Recording::default();
    let mut config = node.config("2.0.0");
    config.force_unload = true;
    let kernel = NodeKernel::new(config.kernel, &config.host);
    let mut agent = NodeAgent::new(config, kernel, reporter.clone()).unwrap();

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    assert!(
        !node.host().path("/proc/4242").exists(),
        "the holder was killed"
    );
    let killed = reporter.events_with(reasons::HOLDERS_KILLED);
    assert_eq!(killed.len(), 1);
    assert!(
        killed[0].note.contains("pid 4242 (python3)"),
        "{}",
        killed[0].note
    );
    assert!(!phases(&reporter).contains(&AgentPhase::WaitingForHolders));
}

#[tokio::test]
async fn build_failure_leaves_the_old_module_and_retries() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    node.sim.fail_builds(true).unwrap();
    let reporter = Recording::default();
    let mut config = node.config("2.0.0");
    config.retry.initial = Duration::from_secs(3600);
    let kernel = NodeKernel::new(config.kernel, &config.host);
    let mut agent = NodeAgent::new(config, kernel, reporter.clone()).unwrap();

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));
    let failed = reporter.last_report().unwrap();
    assert_eq!(failed.phase, AgentPhase::Failed);
    assert_eq!(failed.reason.as_deref(), Some("BuildFailed"));
    let message = failed.message.unwrap();
    assert!(
        message.contains("simulated build failure") && message.contains("1.0.0"),
        "{message}"
    );
    assert_eq!(reporter.events_with("BuildFailed").len(), 1);
    assert_eq!(
        reporter.label(labels::KMD_VERSION).as_deref(),
        Some("1.0.0")
    );

    // the retry is not due for an hour: a pass observes but does not build again
    node.sim.fail_builds(false).unwrap();
    agent.pass(&CancellationToken::new()).await.unwrap();
    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));
    assert_eq!(node.cached(), vec!["1.0.0".to_string()]);
}

#[tokio::test]
async fn a_fixed_build_converges_on_a_later_retry() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    node.sim.fail_builds(true).unwrap();
    let reporter = Recording::default();
    let agent = agent(&node, "2.0.0", &reporter);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(agent.run(shutdown.clone()));
    wait_until("a failed build", WAIT, || {
        reporter
            .last_report()
            .is_some_and(|r| r.phase == AgentPhase::Failed)
    })
    .await;
    node.sim.fail_builds(false).unwrap();
    wait_until("convergence after the fix", WAIT, || {
        node.loaded().as_deref() == Some("2.0.0")
    })
    .await;
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(reporter.last_report().unwrap().phase, AgentPhase::Ready);
}

#[tokio::test]
async fn load_failure_rolls_back_to_the_previous_version() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    node.kernel().fail_load("2.0.0", true).unwrap();
    let reporter = Recording::default();
    let mut agent = agent(&node, "2.0.0", &reporter);

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("1.0.0"), "rolled back");
    let failed = reporter.last_report().unwrap();
    assert_eq!(failed.phase, AgentPhase::Failed);
    assert_eq!(failed.reason.as_deref(), Some("LoadFailedRolledBack"));
    assert_eq!(
        reporter.label(labels::KMD_VERSION).as_deref(),
        Some("1.0.0")
    );
    assert_eq!(
        reporter.events_with("LoadFailedRolledBack")[0].kind,
        EventKind::Warning
    );
    assert!(!readiness(node.host(), &v("2.0.0")).is_ready());
}

#[tokio::test]
async fn a_module_changed_behind_its_back_is_relabelled_and_reconverged() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0"); // cached, so an outsider can load it later
    let reporter = Recording::default();
    let mut agent = agent(&node, "2.0.0", &reporter);
    let token = CancellationToken::new();
    agent.pass(&token).await.unwrap();
    assert_eq!(reporter.last_report().unwrap().phase, AgentPhase::Ready);

    // someone runs rmmod: the next pass first labels the truth, then reinstalls
    let patches_before = reporter.get().label_patches.len();
    node.kernel().unload("tenstorrent").unwrap();
    agent.pass(&token).await.unwrap();
    let patches = reporter.get().label_patches[patches_before..].to_vec();
    assert_eq!(
        patches[0].get(labels::KMD_VERSION),
        Some(None),
        "{patches:?}"
    );
    assert_eq!(
        patches.last().unwrap().get(labels::KMD_VERSION),
        Some(Some("2.0.0"))
    );
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    let changed = reporter.events_with(reasons::MODULE_CHANGED);
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].kind, EventKind::Warning);
    assert!(
        changed[0].note.contains("no module is loaded"),
        "{}",
        changed[0].note
    );

    // someone loads another version by hand
    let kernel = node.kernel();
    kernel.unload("tenstorrent").unwrap();
    let old = node
        .host()
        .path("/var/cache/tt-kmd/6.8.0-sim/1.0.0/tenstorrent.ko");
    kernel.load(&old, "").unwrap();
    let patches_before = reporter.get().label_patches.len();
    agent.pass(&token).await.unwrap();
    let patches = reporter.get().label_patches[patches_before..].to_vec();
    assert_eq!(patches[0].get(labels::KMD_VERSION), Some(Some("1.0.0")));
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    assert_eq!(
        reporter.label(labels::KMD_VERSION).as_deref(),
        Some("2.0.0")
    );
    let changed = reporter.events_with(reasons::MODULE_CHANGED);
    assert_eq!(changed.len(), 2);
    assert!(
        changed[1].note.contains("version 1.0.0 is loaded"),
        "{}",
        changed[1].note
    );
}

#[tokio::test]
async fn a_running_agent_follows_an_rmmod_within_a_period_and_never_unloads_on_exit() {
    let node = Node::new(&["2.0.0"]);
    let reporter = Recording::default();
    let agent = agent(&node, "2.0.0", &reporter);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(agent.run(shutdown.clone()));
    wait_until("ready", WAIT, || {
        reporter
            .last_report()
            .is_some_and(|r| r.phase == AgentPhase::Ready)
    })
    .await;
    node.kernel().unload("tenstorrent").unwrap();
    wait_until("the rmmod noticed", WAIT, || {
        !reporter.events_with(reasons::MODULE_CHANGED).is_empty()
    })
    .await;
    wait_until("reinstalled", WAIT, || {
        node.loaded().as_deref() == Some("2.0.0")
    })
    .await;
    wait_until("ready again", WAIT, || {
        reporter
            .last_report()
            .is_some_and(|r| r.phase == AgentPhase::Ready)
            && reporter.label(labels::KMD_VERSION).as_deref() == Some("2.0.0")
    })
    .await;
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(
        node.loaded().as_deref(),
        Some("2.0.0"),
        "never unloads on exit"
    );
}

/// The simulated kernel with a slow `load`, announcing when a load starts.
#[derive(Debug, Clone)]
struct SlowLoadKernel {
    inner: SimKernel,
    loading: Arc<AtomicBool>,
}

impl Kernel for SlowLoadKernel {
    fn load(&self, ko: &Path, params: &str) -> io::Result<()> {
        self.loading.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(500));
        self.inner.load(ko, params)
    }

    fn unload(&self, name: &str) -> io::Result<()> {
        self.inner.unload(name)
    }

    fn kill(&self, pid: i32) -> io::Result<()> {
        self.inner.kill(pid)
    }
}

#[tokio::test]
async fn sigterm_mid_swap_finishes_the_swap_then_exits() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    let reporter = Recording::default();
    let loading = Arc::new(AtomicBool::new(false));
    let kernel = SlowLoadKernel {
        inner: node.kernel(),
        loading: Arc::clone(&loading),
    };
    let agent = NodeAgent::new(node.config("2.0.0"), kernel, reporter.clone()).unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(agent.run(shutdown.clone()));

    wait_until("the load to start", WAIT, || loading.load(Ordering::SeqCst)).await;
    // the old module is already unloaded: the worst moment to stop
    assert_eq!(node.loaded(), None);
    shutdown.cancel();
    tokio::time::timeout(WAIT, running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    assert_eq!(node.loaded().as_deref(), Some("2.0.0"), "the swap finished");
    assert_eq!(reporter.events_with(reasons::MODULE_REPLACED).len(), 1);
}

#[test]
fn sigterm_during_a_build_abandons_it_without_touching_the_module() {
    // its own runtime: the abandoned build thread must not hold up the test's end either
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    node.slow_builds(20);
    runtime.block_on(async {
        let reporter = Recording::default();
        let agent = agent(&node, "2.0.0", &reporter);
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(agent.run(shutdown.clone()));
        wait_until("the build to start", WAIT, || {
            reporter
                .last_report()
                .is_some_and(|r| r.phase == AgentPhase::Building)
        })
        .await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("the agent stops without waiting for the build")
            .unwrap()
            .unwrap();
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));
    assert_eq!(node.cached(), vec!["1.0.0".to_string()]);
}

/// A reporter whose first `failures` label patches fail (an API server hiccup).
#[derive(Debug, Clone)]
struct FlakyReporter {
    inner: Recording,
    failures: Arc<std::sync::atomic::AtomicUsize>,
}

impl ttdp_agent::Reporter for FlakyReporter {
    async fn patch_labels(
        &self,
        labels: &ttdp_agent::labels::NodeLabels,
    ) -> Result<(), ttdp_agent::reporting::ReportError> {
        let left = self.failures.load(Ordering::SeqCst);
        if left > 0 {
            self.failures.store(left - 1, Ordering::SeqCst);
            return Err(ttdp_agent::reporting::ReportError::File {
                path: "/api-server-hiccup".into(),
                source: io::Error::other("connection refused"),
            });
        }
        self.inner.patch_labels(labels).await
    }

    async fn publish_report(
        &self,
        report: &ttdp_api::agent_report::AgentReport,
    ) -> Result<(), ttdp_agent::reporting::ReportError> {
        self.inner.publish_report(report).await
    }

    async fn record_event(
        &self,
        event: &ttdp_agent::reporting::NodeEvent,
    ) -> Result<(), ttdp_agent::reporting::ReportError> {
        self.inner.record_event(event).await
    }
}

#[tokio::test]
async fn labels_that_failed_to_publish_are_published_on_a_later_pass() {
    let node = Node::new(&["2.0.0"]);
    node.preinstall("2.0.0");
    let recording = Recording::default();
    let reporter = FlakyReporter {
        inner: recording.clone(),
        failures: Arc::new(std::sync::atomic::AtomicUsize::new(2)),
    };
    let config = node.config("2.0.0");
    let kernel = NodeKernel::new(config.kernel, &config.host);
    let mut agent = NodeAgent::new(config, kernel, reporter).unwrap();
    let token = CancellationToken::new();

    agent.pass(&token).await.unwrap(); // both label patches of this pass fail
    assert_eq!(recording.label(labels::KMD_VERSION), None);
    assert_eq!(recording.last_report().unwrap().phase, AgentPhase::Ready);
    agent.pass(&token).await.unwrap();
    assert_eq!(
        recording.label(labels::KMD_VERSION).as_deref(),
        Some("2.0.0")
    );
    assert_eq!(
        recording.label(labels::TT_SMI_VERSION).as_deref(),
        Some(TT_SMI_VERSION)
    );
}

#[tokio::test]
async fn unchanged_labels_and_report_are_rewritten_every_resync_period() {
    let node = Node::new(&["2.0.0"]);
    node.preinstall("2.0.0");
    let reporter = Recording::default();
    let mut config = node.config("2.0.0");
    config.resync_period = Duration::from_millis(100);
    let kernel = NodeKernel::new(config.kernel, &config.host);
    let mut agent = NodeAgent::new(config, kernel, reporter.clone()).unwrap();
    let token = CancellationToken::new();
    agent.pass(&token).await.unwrap();
    agent.pass(&token).await.unwrap();
    let before = {
        let p = reporter.get();
        (p.label_patches.len(), p.reports.len())
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    agent.pass(&token).await.unwrap();
    let p = reporter.get();
    assert!(p.label_patches.len() > before.0, "labels rewritten");
    assert_eq!(p.reports.len(), before.1 + 1, "report rewritten once");
}
