//! A simulated node (host root + tt-kmd repository + bundled tt-smi) and a recording reporter,
//! shared by the agent's integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod agent_process;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ttdp_agent::grant::GrantView;
use ttdp_agent::labels::NodeLabels;
use ttdp_agent::reporting::{NodeEvent, ReportError, Reporter};
use ttdp_agent::{AgentConfig, HostRoot, KernelKind, KmdVersion, RetryPolicy, TtSmiSource};
use ttdp_api::agent_report::AgentReport;
use ttdp_kmod::{InstallerConfig, ModuleInstaller, SimHost, SimKernel, SimKmdRepo, SwapOptions};

/// The simulated kernel release.
pub const RELEASE: &str = "6.8.0-sim";
/// The tt-smi version the fixture bundles.
pub const TT_SMI_VERSION: &str = "3.0.0";
/// The bundled tt-smi's content.
pub const TT_SMI_CONTENT: &[u8] = b"#!/bin/sh\necho tt-smi 3.0.0\n";

/// `text` as a tt-kmd version (the tests write only valid ones).
pub fn v(text: &str) -> KmdVersion {
    text.parse().unwrap()
}

/// A temporary simulated node.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub sim: SimHost,
    pub repo: SimKmdRepo,
    pub tt_smi: PathBuf,
}

impl Node {
    /// A node without a module loaded, a repository with tags for `versions`.
    pub fn new(versions: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let sim = SimHost::create(dir.path().join("host"), RELEASE).unwrap();
        let repo = SimKmdRepo::create(dir.path().join("tt-kmd"), versions).unwrap();
        let tt_smi = dir.path().join("image/opt/ttdp/tt-smi");
        std::fs::create_dir_all(tt_smi.parent().unwrap()).unwrap();
        std::fs::write(&tt_smi, TT_SMI_CONTENT).unwrap();
        Self {
            dir,
            sim,
            repo,
            tt_smi,
        }
    }

    pub fn host(&self) -> &HostRoot {
        self.sim.host()
    }

    pub fn kernel(&self) -> SimKernel {
        self.sim.kernel()
    }

    /// The agent configuration for target `version`, with short periods for tests.
    pub fn config(&self, version: &str) -> AgentConfig {
        let mut config = AgentConfig::new(v(version), "node-1", self.host().clone());
        config.kernel = KernelKind::Sim;
        config.tt_smi = Some(TtSmiSource {
            path: self.tt_smi.clone(),
            version: TT_SMI_VERSION.into(),
        });
        config.build.repository = self.repo.url();
        config.build.jobs = 2;
        config.build.fetch_timeout = Duration::from_secs(60);
        config.build.build_timeout = Duration::from_secs(60);
        config.build.work_dir = Some(self.dir.path().join("work"));
        config.probe_period = Duration::from_millis(50);
        config.retry = RetryPolicy {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        };
        config.unload_wait = Duration::from_secs(5);
        config
    }

    /// Installs `version` the way an earlier agent would have (it is then loaded and cached).
    pub fn preinstall(&self, version: &str) {
        let config = InstallerConfig {
            build: self.config(version).build,
            ..InstallerConfig::default()
        };
        ModuleInstaller::new(self.host().clone(), self.kernel(), config)
            .unwrap()
            .swap(&v(version), &SwapOptions::default())
            .unwrap();
    }

    /// The version sysfs reports, `None` when not loaded.
    pub fn loaded(&self) -> Option<String> {
        ttdp_kmod::ModuleStatus::read(
            self.host(),
            "tenstorrent",
            std::path::Path::new("/dev/tenstorrent"),
        )
        .unwrap()
        .loaded_version()
        .map(str::to_string)
    }

    /// Versions cached for the simulated kernel.
    pub fn cached(&self) -> Vec<String> {
        ttdp_kmod::KoCache::new(self.host())
            .versions(RELEASE)
            .iter()
            .map(KmdVersion::to_string)
            .collect()
    }

    /// The host's copy of tt-smi.
    pub fn host_tt_smi(&self) -> PathBuf {
        self.host().path("/usr/local/bin/tt-smi")
    }

    /// Makes every later build against this host's build tree take at least `seconds`.
    pub fn slow_builds(&self, seconds: u32) {
        let script = self.host().path(format!(
            "/usr/src/linux-headers-{RELEASE}/scripts/sim-kbuild.sh"
        ));
        let text = std::fs::read_to_string(&script).unwrap();
        let slowed = text.replacen("set -eu\n", &format!("set -eu\nsleep {seconds}\n"), 1);
        assert_ne!(text, slowed, "the simulated kbuild script changed shape");
        std::fs::write(&script, slowed).unwrap();
    }
}

/// Everything the agent published, in order.
#[derive(Debug, Default)]
pub struct Published {
    /// Every label patch.
    pub label_patches: Vec<NodeLabels>,
    /// The labels as they would be on the node.
    pub labels: BTreeMap<String, String>,
    /// Every report.
    pub reports: Vec<AgentReport>,
    /// Every Event.
    pub events: Vec<NodeEvent>,
    /// The grant the backend shows; `None` is no controller (`GrantView::NotEnforced`).
    pub grant: Option<GrantView>,
    /// How many times the agent read the grant.
    pub grant_reads: usize,
}

/// A reporter that records everything (cheap to clone; clones share the record).
#[derive(Debug, Clone, Default)]
pub struct Recording(pub Arc<Mutex<Published>>);

impl Recording {
    pub fn get(&self) -> std::sync::MutexGuard<'_, Published> {
        self.0.lock().unwrap()
    }

    pub fn last_report(&self) -> Option<AgentReport> {
        self.get().reports.last().cloned()
    }

    pub fn label(&self, key: &str) -> Option<String> {
        self.get().labels.get(key).cloned()
    }

    pub fn events_with(&self, reason: &str) -> Vec<NodeEvent> {
        self.get()
            .events
            .iter()
            .filter(|e| e.reason == reason)
            .cloned()
            .collect()
    }
}

impl Reporter for Recording {
    async fn patch_labels(&self, labels: &NodeLabels) -> Result<(), ReportError> {
        let mut p = self.get();
        labels.apply_to(&mut p.labels);
        p.label_patches.push(labels.clone());
        Ok(())
    }

    async fn publish_report(&self, report: &AgentReport) -> Result<(), ReportError> {
        self.get().reports.push(report.clone());
        Ok(())
    }

    async fn record_event(&self, event: &NodeEvent) -> Result<(), ReportError> {
        self.get().events.push(event.clone());
        Ok(())
    }

    async fn upgrade_grant(&self) -> Result<GrantView, ReportError> {
        let mut published = self.get();
        published.grant_reads += 1;
        Ok(published.grant.clone().unwrap_or(GrantView::NotEnforced))
    }
}

/// Polls `condition` every 20 ms until it holds; panics with `what` after `timeout`.
pub async fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A self-signed signing key and certificate for `CN=name` in `dir`, as a Secret of type
/// `kubernetes.io/tls` holds them (`tls.key`, `tls.crt`).
pub fn make_signing_key(dir: &std::path::Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let out = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .arg("-subj")
        .arg(format!("/CN={name}"))
        .arg("-keyout")
        .arg(dir.join("tls.key"))
        .arg("-out")
        .arg(dir.join("tls.crt"))
        .output()
        .expect("openssl must be installed (.ci/deps)");
    assert!(out.status.success(), "{out:?}");
}
