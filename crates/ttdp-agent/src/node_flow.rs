//! [`NodeAgent`]: the long-running node flow (spec "What happens" steps 3 to 6).
//!
//! Every probe period (and sooner when a retry is due) one pass:
//! 1. observe the host (DKMS signals, module status) and publish the labels for what is true now;
//! 2. host-managed: report and stand down (never rmmod/insmod, never copy tt-smi, never write
//!    the cache);
//! 3. container mode, target loaded: copy tt-smi if it differs, put the version's udev rule in
//!    place if it is not (`udev_rule`), label, report Ready;
//! 4. otherwise, when a retry is due: ensure the target `.ko` (cache hit, or fetch + build: this
//!    step may be abandoned on shutdown, nothing has been changed yet), then secure the rollback
//!    path: a verified `.ko` of the loaded version (cache hit, or built from its tag; also
//!    abandonable). Without one (unknown or custom version, tag missing) nothing is unloaded: the
//!    failure `NoRollbackPath` is reported, unless the node is labelled
//!    `driver.tenstorrent.com/allow-no-rollback=true`. With another version loaded, wait for the
//!    controller's upgrade grant (node annotation `driver.tenstorrent.com/upgrade-grant`,
//!    [`crate::grant`]; `WaitingForGrant` until then, nothing unloaded, no holder touched).
//!    Then check holders (wait with back-off unless force unload), take the node's module lock
//!    (another agent may be swapping) and decide again under it, on the module status, grant
//!    and holders read then (`still_allowed`), then swap with rollback
//!    (never abandoned half-way: on shutdown it finishes first) and, with post-load validation
//!    on, prove the loaded module works before the swap returns (devices bound, the command; a
//!    failure loads the previous version back: `validate`); observe again, label and report.
//!
//! Every pass begins by settling a swap a stopped agent left half-way (its journal, see
//! `resume`): the previous version is loaded back when the target cannot be, and until that is
//! settled the pass neither labels the node nor treats it as a new one.
//!
//! A target found loaded is validated before it is first reported Ready, and a Ready node's
//! devices are looked at on every pass. Once Ready, the other installed kernels get the
//! target's module in the background ([`crate::next_kernels`]); the first load of this agent
//! is recorded in the report's `startLoad` (`start_load`).
//!
//! Failures and holders are reported (pod annotation, node Event) and retried with back-off; the
//! agent never exits on them. It never unloads the module on exit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};
use ttdp_api::agent_report::{AgentPhase, AgentReport};
use ttdp_hostprobe::{CompilerFamily, detect_host_install, kernel_compiler, kernel_release};
use ttdp_kmod::parameters::uninterpreted_values;
use ttdp_kmod::prebuilt::PrebuiltFallback;
use ttdp_kmod::{
    InstallerConfig, Kernel, KmodError, ModuleInstaller, ModuleStatus, SwapOptions, UdevConfig,
    UnloadOptions,
};

use crate::backoff::Backoff;
use crate::builder_compiler::BuilderCompiler;
use crate::config::{AgentConfig, KernelKind};
use crate::convergence::{
    Observation, Step, UnloadGate, base_report, host_managed_message, next_step, unload_gate,
};
use crate::error::AgentError;
use crate::labels::NodeLabels;
use crate::next_kernels::NextKernels;
use crate::prebuilt_fetch::HttpPrebuiltSource;
use crate::reasons;
use crate::reporting::{EventKind, Reporter};
use crate::tt_smi::{TtSmiInstaller, TtSmiOutcome};

mod publishing;
mod resume;
mod start_load;
mod target_ko;
mod udev_rule;
mod unload_gate;
mod validate;

/// Whether the loaded module can be loaded back if the target fails to load.
enum RollbackPath {
    /// A verified `.ko` of the loaded version is in the cache (or nothing is loaded).
    Secured,
    /// None can be had, and the node opted in to unloading anyway.
    Allowed,
    /// None can be had and the node did not opt in: reported, nothing unloaded.
    Refused,
    /// Shutdown arrived while fetching or building it; nothing was changed.
    Abandoned,
}

/// How taking the module lock ended.
enum LockTaken {
    /// Held: no other installer on the node swaps until it is dropped.
    Held(ttdp_kmod::FileLock),
    /// Shutdown arrived while waiting for it; nothing was changed.
    Abandoned,
    /// It could not be taken (reported).
    Failed,
}

/// How an attempt to install the target ended.
enum Attempt {
    /// Shutdown arrived before anything was changed.
    Abandoned,
    /// The attempt ran to its end (success, failure or waiting); observe again.
    Done,
}

/// The agent of one node, generic over the kernel and where it reports.
#[derive(Debug)]
pub struct NodeAgent<K, R> {
    config: AgentConfig,
    installer: Arc<ModuleInstaller<K>>,
    reporter: R,
    tt_smi: Option<TtSmiInstaller>,
    tt_smi_installed: bool,
    /// The loaded version whose udev rule was checked since it became Ready, and the problem
    /// found then, shown in the Ready message while it lasts.
    udev_checked: Option<(String, Option<String>)>,
    failure_backoff: Backoff,
    holder_backoff: Backoff,
    next_attempt: Option<Instant>,
    last_labels: Option<NodeLabels>,
    last_report: Option<AgentReport>,
    last_resync: Instant,
    last_event: Option<(String, String)>,
    ready_version: Option<String>,
    validated: Option<validate::ValidatedModule>,
    compiler: BuilderCompiler,
    /// The other installed kernels, prepared in the background once Ready.
    next_kernels: NextKernels,
    /// How the module came up at this agent's start (see `start_load`).
    start: start_load::StartTracker,
}

impl<K, R> NodeAgent<K, R>
where
    K: Kernel + Send + Sync + 'static,
    R: Reporter,
{
    /// An agent for the node in `config`, using `kernel` and publishing through `reporter`.
    /// Fails when the configuration is invalid or the host's kernel release cannot be read.
    pub fn new(config: AgentConfig, kernel: K, reporter: R) -> Result<Self, AgentError> {
        config.validate()?;
        let release = kernel_release(&config.host).map_err(|source| AgentError::Installer {
            host: config.host.to_string(),
            source: Box::new(source.into()),
        })?;
        let installer_config = InstallerConfig {
            build: config.build_options(&release),
            cache_dir: Some(config.cache_dir.clone()),
            lock_dir: Some(config.lock_dir.clone()),
            udev: UdevConfig {
                rules_dir: None,
                // a simulated kernel has no udev: never tell the real one
                udevadm: config
                    .udevadm
                    .clone()
                    .filter(|_| config.kernel == KernelKind::Real),
            },
            ..InstallerConfig::default()
        };
        let mut installer = ModuleInstaller::new(config.host.clone(), kernel, installer_config)
            .map_err(|source| AgentError::Installer {
                host: config.host.to_string(),
                source: Box::new(source),
            })?;
        let compiler = BuilderCompiler {
            kernel: kernel_compiler(&config.host)
                .map_err(|source| AgentError::Installer {
                    host: config.host.to_string(),
                    source: Box::new(source.into()),
                })?
                .map_or(CompilerFamily::Unknown, |c| c.family()),
            image_gcc: config.builder_gcc,
        };
        if let Some(prebuilt) = &config.prebuilt {
            let mut prebuilt = prebuilt.clone();
            if let Some(why) = compiler.mismatch() {
                // downloads need no compiler; a module the server lacks must not be built here
                warn!(%why, "a prebuilt module the server lacks is not built");
                prebuilt.fallback = PrebuiltFallback::Fail;
            }
            let source = HttpPrebuiltSource::new(prebuilt, config.build.fetch_timeout)?;
            installer = installer.with_prebuilt(Arc::new(source));
        }
        if let Some(signing) = &config.signing {
            installer = installer.with_signing(signing.clone());
        }
        let tt_smi = config
            .tt_smi
            .as_ref()
            .map(|s| TtSmiInstaller::new(&s.path, &config.host));
        let period = config.probe_period;
        Ok(Self {
            failure_backoff: Backoff::new(config.retry.initial, config.retry.max),
            holder_backoff: Backoff::new(config.retry.initial.min(period), period),
            installer: Arc::new(installer),
            reporter,
            tt_smi,
            tt_smi_installed: false,
            udev_checked: None,
            next_attempt: None,
            last_labels: None,
            last_report: None,
            last_resync: Instant::now(),
            last_event: None,
            ready_version: None,
            validated: None,
            compiler,
            next_kernels: NextKernels::default(),
            start: start_load::StartTracker::new(),
            config,
        })
    }

    /// The module installer (for inspection in tests).
    pub fn installer(&self) -> &ModuleInstaller<K> {
        &self.installer
    }

    /// Runs passes until `shutdown` is cancelled. Returns once no swap is in flight; never
    /// unloads the module.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), AgentError> {
        info!(
            node = %self.config.node_name,
            target_version = %self.config.target_version,
            host_root = %self.config.host,
            release = %self.installer.release(),
            force_unload = self.config.force_unload,
            "agent started"
        );
        while !shutdown.is_cancelled() {
            self.pass(&shutdown).await?;
            let wait = self.wait_before_next_pass();
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => {}
            }
        }
        info!(node = %self.config.node_name, "shutting down; the loaded module stays loaded");
        Ok(())
    }

    /// One pass (see the module docs). Public so tests can step the flow.
    pub async fn pass(&mut self, shutdown: &CancellationToken) -> Result<(), AgentError> {
        if self.last_resync.elapsed() >= self.config.resync_period {
            // write everything again: repairs labels or annotations others changed
            self.last_labels = None;
            self.last_report = None;
            self.last_resync = Instant::now();
        }
        if !self.resume_interrupted_swap().await {
            return Ok(());
        }
        let Some(observation) = self.observe().await else {
            return Ok(());
        };
        self.notice_external_change(&observation).await;
        self.publish_labels(&observation).await;
        match next_step(
            &observation,
            &self.config.target_version,
            &self.config.parameters,
        ) {
            Step::StandDown => self.stand_down(&observation).await,
            Step::Converged => self.settle_ready(&observation).await,
            Step::Install if self.attempt_due() => {
                match self.attempt_install(&observation, shutdown).await? {
                    Attempt::Abandoned => {}
                    Attempt::Done => {
                        if let Some(after) = self.observe().await {
                            if next_step(
                                &after,
                                &self.config.target_version,
                                &self.config.parameters,
                            ) == Step::Converged
                            {
                                self.settle_ready(&after).await;
                            } else {
                                self.publish_labels(&after).await;
                            }
                        }
                    }
                }
            }
            Step::Install => {
                debug!(node = %self.config.node_name, "retry not due yet");
            }
        }
        Ok(())
    }

    /// How long to sleep: one probe period, or less when a retry is due sooner.
    fn wait_before_next_pass(&self) -> Duration {
        let period = self.config.probe_period;
        match self.next_attempt {
            Some(at) => at.saturating_duration_since(Instant::now()).min(period),
            None => period,
        }
    }

    fn attempt_due(&self) -> bool {
        self.next_attempt.is_none_or(|at| Instant::now() >= at)
    }

    /// Reads DKMS signals and the module status; a failure is reported and `None` returned.
    async fn observe(&mut self) -> Option<Observation> {
        let started = Instant::now();
        let host_install = match detect_host_install(&self.config.host) {
            Ok(found) => found,
            Err(e) => {
                let message = format!("cannot check the host for a DKMS install: {e}");
                self.fail(reasons::HOST_PROBE_FAILED, "Probe", message, None)
                    .await;
                return None;
            }
        };
        let status = match self.installer.status() {
            Ok(status) => status,
            Err(e) => {
                let message = format!("cannot read the module status: {e}");
                self.fail(e.reason(), "Probe", message, None).await;
                return None;
            }
        };
        debug!(
            step = "observe",
            loaded = ?status.loaded_version(),
            refcnt = ?status.refcnt,
            host_managed = host_install.is_host_managed(),
            elapsed_ms = millis(started.elapsed()),
            "observed the host"
        );
        Some(Observation {
            host_install,
            status,
        })
    }

    /// After being ready: the module was unloaded or replaced without us.
    async fn notice_external_change(&mut self, observation: &Observation) {
        let Some(ready) = self.ready_version.clone() else {
            return;
        };
        if observation.loaded_version() == Some(ready.as_str()) {
            return;
        }
        self.ready_version = None;
        let now = observation
            .loaded_version()
            .map_or("no module is loaded".to_string(), |v| {
                format!("version {v} is loaded")
            });
        let note = format!(
            "module {} {ready} was unloaded or replaced outside ttdp ({now}); converging back to {}",
            observation.status.name, self.config.target_version
        );
        warn!(node = %self.config.node_name, step = "watch", %note);
        self.next_attempt = None;
        self.event(EventKind::Warning, reasons::MODULE_CHANGED, "Watch", note)
            .await;
    }

    /// Host-managed node: report, touch nothing.
    async fn stand_down(&mut self, observation: &Observation) {
        if self.last_report.as_ref().map(|r| r.phase) != Some(AgentPhase::HostManaged) {
            info!(
                node = %self.config.node_name,
                loaded = ?observation.loaded_version(),
                "host-managed tt-kmd install found; standing down"
            );
        }
        let mut report = base_report(
            AgentPhase::HostManaged,
            &self.config.target_version,
            observation,
        );
        let message = host_managed_message(&observation.host_install);
        report.reason = Some(reasons::HOST_MANAGED.to_string());
        report.message = Some(message.clone());
        self.publish_report(report).await;
        self.next_attempt = None;
        self.event(EventKind::Normal, reasons::HOST_MANAGED, "Probe", message)
            .await;
    }

    /// Target loaded: proven to work (post-load validation), tt-smi, labels, Ready.
    async fn settle_ready(&mut self, observation: &Observation) {
        if !self.proven_working(observation).await {
            self.publish_labels(observation).await;
            return;
        }
        let newly_ready = self.ready_version.is_none();
        if newly_ready {
            // problems announced before are over: announce them again if they come back
            self.last_event = None;
            self.settle_start_load();
        }
        // the node runs its driver: now the kernels it may boot next get theirs
        self.next_kernels.poll(&self.installer, &self.config);
        let mut message = format!(
            "tt-kmd {} is loaded",
            observation.loaded_version().unwrap_or_default()
        );
        if let Some(validated) = &self.validated {
            message = format!("{message}; {}", validated.summary);
        }
        let unread = uninterpreted_values(&self.config.parameters, &observation.status.parameters);
        if !unread.is_empty() {
            // taken from ttdp's record of the load: reloading would only show the same again
            message = format!(
                "{message}; parameters sysfs shows in another form ({}) are taken as loaded: ttdp loaded this module with exactly these values, so it is not reloaded for them",
                unread.join("; ")
            );
        }
        if let Some(problem) = self.ensure_tt_smi().await {
            message = format!("{message}; {problem}");
        }
        if let Some(problem) = self.ensure_udev_rule(observation).await {
            message = format!("{message}; {problem}");
        }
        self.publish_labels(observation).await;
        let mut report = base_report(AgentPhase::Ready, &self.config.target_version, observation);
        report.message = Some(message);
        if newly_ready {
            info!(node = %self.config.node_name, version = %self.config.target_version, step = "ready", "node is ready");
        }
        self.publish_report(report).await;
        self.ready_version = observation.loaded_version().map(str::to_string);
        self.next_attempt = None;
        self.failure_backoff.reset();
        self.holder_backoff.reset();
    }

    /// Copies tt-smi when configured; returns a problem text when it failed.
    async fn ensure_tt_smi(&mut self) -> Option<String> {
        let version = self.config.tt_smi.as_ref()?.version.clone();
        let installer = self.tt_smi.as_mut()?;
        match installer.ensure() {
            Ok(TtSmiOutcome::Unchanged) => {
                self.tt_smi_installed = true;
                None
            }
            Ok(TtSmiOutcome::Copied { bytes, elapsed_ms }) => {
                let dest = installer.dest().display().to_string();
                self.tt_smi_installed = true;
                info!(step = "tt-smi", %dest, bytes, elapsed_ms, version = %version, "copied tt-smi to the host");
                let note = format!("copied tt-smi {version} to {dest}");
                self.event(
                    EventKind::Normal,
                    reasons::TT_SMI_INSTALLED,
                    "CopyTtSmi",
                    note,
                )
                .await;
                None
            }
            Err(e) => {
                let problem = format!("tt-smi was not copied: {e}");
                error!(step = "tt-smi", error = %e, "cannot copy tt-smi to the host");
                self.event(
                    EventKind::Warning,
                    reasons::TT_SMI_COPY_FAILED,
                    "CopyTtSmi",
                    problem.clone(),
                )
                .await;
                Some(problem)
            }
        }
    }

    /// This image's compiler is not the kernel's and the target or rollback `.ko` may have to be
    /// built (no prebuilt source): report it, build nothing, look again after a probe period
    /// (the node is about to run another image, or needs the admin). Whether it waits.
    async fn waits_for_builder(&mut self, observation: &Observation) -> bool {
        let Some(why) = self
            .compiler
            .mismatch()
            .filter(|_| self.config.prebuilt.is_none())
        else {
            return false;
        };
        if self.last_report.as_ref().map(|r| r.phase) != Some(AgentPhase::WaitingForBuilder) {
            warn!(node = %self.config.node_name, %why, "not building with another compiler than the kernel's");
        }
        let mut report = base_report(
            AgentPhase::WaitingForBuilder,
            &self.config.target_version,
            observation,
        );
        report.reason = Some(reasons::COMPILER_MISMATCH.to_string());
        report.message = Some(why.clone());
        self.publish_report(report).await;
        self.next_attempt = Some(Instant::now() + self.config.probe_period);
        self.event(EventKind::Warning, reasons::COMPILER_MISMATCH, "Build", why)
            .await;
        true
    }

    /// Ensure the `.ko`, check holders, swap. See the module docs for what shutdown does.
    async fn attempt_install(
        &mut self,
        observation: &Observation,
        shutdown: &CancellationToken,
    ) -> Result<Attempt, AgentError> {
        let target = self.config.target_version.clone();
        let status = match self.target_ko_in_cache(observation, shutdown).await? {
            Ok(status) => status,
            Err(ended) => return Ok(ended),
        };
        let allow_no_rollback = match self.secure_rollback(observation, &status, shutdown).await? {
            RollbackPath::Secured => false,
            RollbackPath::Allowed => true,
            RollbackPath::Refused => return Ok(Attempt::Done),
            RollbackPath::Abandoned => return Ok(Attempt::Abandoned),
        };
        if status.loaded
            && !status.at_target(target.as_str(), &self.config.parameters)
            && !self.granted(observation, &status).await
        {
            return Ok(Attempt::Done);
        }
        if unload_gate(&status, self.config.force_unload) == UnloadGate::WaitForHolders {
            self.wait_for_holders(observation, &status).await;
            return Ok(Attempt::Done);
        }
        // the lock may take minutes: what was decided above is decided again under it
        let module_lock = match self.take_module_lock(observation, shutdown).await? {
            LockTaken::Held(lock) => lock,
            LockTaken::Abandoned => return Ok(Attempt::Abandoned),
            LockTaken::Failed => return Ok(Attempt::Done),
        };
        let Some(status) = self.still_allowed(observation).await else {
            return Ok(Attempt::Done);
        };

        let mut report = base_report(AgentPhase::Swapping, &target, observation);
        report.message = Some(self.swap_message(&status, target.as_str()));
        self.publish_report(report).await;
        let options = self.swap_options(allow_no_rollback);
        match self
            .run_swap(module_lock, status, &target, options, shutdown)
            .await?
        {
            Ok(report) => {
                self.start.note_swap(&report);
                self.swapped(report).await;
            }
            Err(KmodError::InUse { .. }) => {
                // a holder appeared between the check and the unload
                if let Ok(status) = self.installer.status() {
                    self.wait_for_holders(observation, &status).await;
                }
            }
            Err(e) => {
                let message = e.to_string();
                self.fail(e.reason(), "Swap", message, Some(observation))
                    .await;
            }
        }
        Ok(Attempt::Done)
    }

    /// What the Swapping report says the swap does.
    fn swap_message(&self, status: &ModuleStatus, target: &str) -> String {
        match status.loaded_version() {
            Some(old) if old == target => format!(
                "reloading tt-kmd {target} with parameters \"{}\"",
                self.config.parameters
            ),
            Some(old) => format!("replacing tt-kmd {old} with {target}"),
            None => format!("loading tt-kmd {target}"),
        }
    }

    /// The swap's settings from the agent's configuration.
    fn swap_options(&self, allow_no_rollback: bool) -> SwapOptions {
        let force = self.config.force_unload;
        SwapOptions {
            unload: UnloadOptions {
                force,
                wait: if force {
                    self.config.unload_wait
                } else {
                    Duration::ZERO
                },
            },
            params: self.config.parameters.clone(),
            source_commit: self.config.source_commit.clone(),
            allow_no_rollback,
        }
    }
}

/// Whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
