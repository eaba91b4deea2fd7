//! [`NextKernels`]: the kernels a node may boot into next, prepared before it does.
//!
//! Once the node is Ready, and again every [`AgentConfig::kernel_scan_period`], one background
//! task (a blocking thread) looks at every kernel installed on the host
//! ([`ttdp_hostprobe::installed_kernels`]), prunes the `.ko` cache of kernels that are gone and
//! down to [`AgentConfig::cache_size_limit`], and makes sure a verified `.ko` of the target
//! version waits in the cache for each installed kernel other than the running one
//! ([`ModuleInstaller::ensure_ko_for`]: downloaded, or built against that kernel's headers
//! with `make` under `nice`). Each entry is built under its own lock, so the main flow's own
//! builds and swaps never wait for it; it never touches the loaded module. What it found is
//! [`NextKernels::readiness`], the report's `installedKernels`: Pending while it works, Ready,
//! or Failed with the reason and message of the error (retried after
//! [`RETRY_FAILED_AFTER`], or at once when the kernel's headers appear or go).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::{debug, info, warn};
use ttdp_api::agent_report::{KernelModuleState, KernelReadiness};
use ttdp_hostprobe::{InstalledKernel, build_tree_compiler, installed_kernels};
use ttdp_kmod::{CacheOutcome, Kernel, KmdVersion, ModuleInstaller, PruneReason};

use crate::builder_compiler::next_kernel_mismatch;
use crate::config::AgentConfig;
use crate::reasons;

/// The `nice` value of background builds: the lowest priority.
pub const BACKGROUND_NICENESS: u8 = 19;
/// How long a kernel whose module could not be made waits before it is tried again (its
/// headers appearing or going retries it at the next scan).
pub const RETRY_FAILED_AFTER: Duration = Duration::from_secs(15 * 60);
/// The longest message kept for a kernel whose module could not be made (a build log's tail
/// can be long; the report rides in an annotation).
const MESSAGE_LIMIT: usize = 1500;

/// What the agent knows about one installed kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tracked {
    readiness: KernelReadiness,
    /// When it last failed.
    failed_at: Option<Instant>,
    /// Whether its headers were there when it was last looked at.
    had_headers: bool,
}

/// What to do for one installed kernel at a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelStep {
    /// Its module is in the cache, verified.
    Ready,
    /// Download or build its module now.
    Prepare,
    /// It failed not long ago and nothing changed since: leave it Failed for now.
    KeepFailed,
}

/// The step for a kernel whose module is `cached` (verified) or not, whose headers are there
/// (`has_headers`) or not, which was last `failed_at` with headers `had_headers`.
pub fn kernel_step(
    cached: bool,
    has_headers: bool,
    last_failure: Option<(Instant, bool)>,
    now: Instant,
) -> KernelStep {
    match last_failure {
        _ if cached => KernelStep::Ready,
        Some((at, had_headers))
            if had_headers == has_headers && now.duration_since(at) < RETRY_FAILED_AFTER =>
        {
            KernelStep::KeepFailed
        }
        _ => KernelStep::Prepare,
    }
}

/// The state of the kernels the node may boot next, and the background task preparing them.
#[derive(Debug, Default)]
pub struct NextKernels {
    tracked: Arc<Mutex<BTreeMap<String, Tracked>>>,
    task: Option<JoinHandle<()>>,
    last_scan: Option<Instant>,
}

impl NextKernels {
    /// Every installed kernel but the running one and whether its module is ready, by release.
    pub fn readiness(&self) -> Vec<KernelReadiness> {
        lock(&self.tracked)
            .values()
            .map(|t| t.readiness.clone())
            .collect()
    }

    /// Starts a scan in the background when none runs and one is due (never yet, or
    /// `config.kernel_scan_period` after the last). Returns at once.
    pub fn poll<K>(&mut self, installer: &Arc<ModuleInstaller<K>>, config: &AgentConfig)
    where
        K: Kernel + Send + Sync + 'static,
    {
        if self.task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let due = self
            .last_scan
            .is_none_or(|at| at.elapsed() >= config.kernel_scan_period);
        if !due {
            return;
        }
        self.last_scan = Some(Instant::now());
        let (installer, tracked) = (Arc::clone(installer), Arc::clone(&self.tracked));
        let config = config.clone();
        self.task = Some(tokio::task::spawn_blocking(move || {
            scan_and_prepare(&installer, &config, &tracked);
        }));
    }
}

fn lock(tracked: &Mutex<BTreeMap<String, Tracked>>) -> MutexGuard<'_, BTreeMap<String, Tracked>> {
    // a panic elsewhere left the map as it was between two whole updates: still usable
    tracked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One scan: the installed kernels, the cache pruned, then each kernel's module made ready.
fn scan_and_prepare<K: Kernel>(
    installer: &ModuleInstaller<K>,
    config: &AgentConfig,
    tracked: &Mutex<BTreeMap<String, Tracked>>,
) {
    let kernels = match installed_kernels(installer.host()) {
        Ok(kernels) => kernels,
        Err(e) => {
            warn!(step = "next-kernels", error = %e, "cannot list the installed kernels");
            return;
        }
    };
    prune(installer, config, &kernels);
    let target = &config.target_version;
    let commit = config.source_commit.as_deref();
    let others: Vec<&InstalledKernel> = kernels
        .iter()
        .filter(|k| k.release != installer.release())
        .collect();
    let now = Instant::now();
    let mut todo = Vec::new();
    {
        let mut map = lock(tracked);
        map.retain(|release, _| others.iter().any(|k| &k.release == release));
        for kernel in &others {
            let cached = installer
                .cached_ko_for(&kernel.release, target, commit)
                .is_some();
            let last_failure = map
                .get(&kernel.release)
                .and_then(|t| t.failed_at.map(|at| (at, t.had_headers)));
            let state = match kernel_step(cached, kernel.has_headers(), last_failure, now) {
                KernelStep::KeepFailed => continue,
                KernelStep::Ready => KernelModuleState::Ready,
                KernelStep::Prepare => {
                    todo.push(*kernel);
                    KernelModuleState::Pending
                }
            };
            map.insert(kernel.release.clone(), tracked_as(kernel, state, None));
        }
    }
    for kernel in todo {
        let outcome = prepare(installer, config, kernel, target);
        lock(tracked).insert(kernel.release.clone(), outcome);
    }
}

/// The kernel's entry in `state`, with `failure` (reason, message) when it failed.
fn tracked_as(
    kernel: &InstalledKernel,
    state: KernelModuleState,
    failure: Option<(&str, String)>,
) -> Tracked {
    Tracked {
        failed_at: failure.as_ref().map(|_| Instant::now()),
        had_headers: kernel.has_headers(),
        readiness: KernelReadiness {
            release: kernel.release.clone(),
            state,
            reason: failure.as_ref().map(|(reason, _)| (*reason).to_string()),
            message: failure.map(|(_, message)| bounded_message(message)),
        },
    }
}

/// Downloads or builds the target's module for `kernel`, niced, and says how it went.
fn prepare<K: Kernel>(
    installer: &ModuleInstaller<K>,
    config: &AgentConfig,
    kernel: &InstalledKernel,
    target: &KmdVersion,
) -> Tracked {
    let release = &kernel.release;
    let mut build = config.build_options(release);
    build.niceness = Some(BACKGROUND_NICENESS);
    if let Some(why) = compiler_mismatch(config, kernel) {
        warn!(step = "next-kernels", %release, version = %target, %why, "not building for an installed kernel with another compiler than its own");
        let failure = (reasons::COMPILER_MISMATCH, why);
        return tracked_as(kernel, KernelModuleState::Failed, Some(failure));
    }
    info!(step = "next-kernels", %release, version = %target, "preparing the module for an installed kernel");
    match installer.ensure_ko_for(release, target, config.source_commit.as_deref(), &build) {
        Ok(ensured) => {
            let cache = match &ensured.cache {
                CacheOutcome::Hit => "hit".to_string(),
                CacheOutcome::Downloaded { url } => format!("downloaded from {url}"),
                CacheOutcome::Miss | CacheOutcome::Rebuilt { .. } => "built".to_string(),
                CacheOutcome::Resigned { .. } => "re-signed".to_string(),
            };
            info!(
                step = "next-kernels",
                %release,
                version = %target,
                %cache,
                build_ms = ensured.build_ms,
                elapsed_ms = ensured.elapsed_ms,
                "module ready for an installed kernel: a boot into it loads it from the cache"
            );
            tracked_as(kernel, KernelModuleState::Ready, None)
        }
        Err(e) => {
            warn!(step = "next-kernels", %release, version = %target, reason = e.reason(), error = %e, "cannot prepare the module for an installed kernel; the loaded module is untouched");
            tracked_as(
                kernel,
                KernelModuleState::Failed,
                Some((e.reason(), e.to_string())),
            )
        }
    }
}

/// Why this image must not build for `kernel` (its build tree names another compiler family
/// than the image's), as the main flow decides for the running kernel; `None` with a prebuilt
/// server, which needs no compiler.
fn compiler_mismatch(config: &AgentConfig, kernel: &InstalledKernel) -> Option<String> {
    if config.prebuilt.is_some() {
        return None;
    }
    let family = kernel
        .build_tree
        .usable_dir()
        .and_then(build_tree_compiler)
        .map(|c| c.family());
    next_kernel_mismatch(&kernel.release, family, config.builder_gcc)
}

/// Prunes the cache to the installed kernels and the size limit, logging what went.
fn prune<K: Kernel>(
    installer: &ModuleInstaller<K>,
    config: &AgentConfig,
    kernels: &[InstalledKernel],
) {
    let installed: BTreeSet<String> = kernels.iter().map(|k| k.release.clone()).collect();
    match installer.prune_cache(&config.target_version, &installed, config.cache_size_limit) {
        Ok(Some(pruned)) => {
            for p in pruned {
                let why = match p.reason {
                    PruneReason::KernelRemoved => "its kernel is no longer installed",
                    PruneReason::OverSizeLimit => "the cache is over its size limit",
                };
                info!(step = "prune", release = %p.entry.release, version = %p.entry.version, bytes = p.entry.bytes, %why, "removed a cache entry");
            }
        }
        Ok(None) => debug!(
            step = "prune",
            "a swap holds the module lock; pruning at the next scan"
        ),
        Err(e) => warn!(step = "prune", error = %e, "cannot prune the .ko cache"),
    }
}

/// `message`, cut in the middle when longer than [`MESSAGE_LIMIT`] (the start says what
/// failed, the end what the build printed last).
fn bounded_message(message: String) -> String {
    if message.len() <= MESSAGE_LIMIT {
        return message;
    }
    let head_end = floor_char_boundary(&message, MESSAGE_LIMIT / 3);
    let tail_start = ceil_char_boundary(&message, message.len() - MESSAGE_LIMIT * 2 / 3);
    format!("{} [...] {}", &message[..head_end], &message[tail_start..])
}

fn floor_char_boundary(s: &str, mut at: usize) -> usize {
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_char_boundary(s: &str, mut at: usize) -> usize {
    while !s.is_char_boundary(at) {
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_kernels_wait_unless_their_headers_changed() {
        let now = Instant::now();
        let recently = now.checked_sub(Duration::from_secs(60)).unwrap_or(now);
        assert_eq!(kernel_step(true, false, None, now), KernelStep::Ready);
        assert_eq!(
            kernel_step(true, true, Some((recently, true)), now),
            KernelStep::Ready
        );
        assert_eq!(kernel_step(false, true, None, now), KernelStep::Prepare);
        assert_eq!(
            kernel_step(false, true, Some((recently, true)), now),
            KernelStep::KeepFailed
        );
        assert_eq!(
            kernel_step(false, true, Some((recently, false)), now),
            KernelStep::Prepare,
            "its headers were installed since"
        );
        let later = now + RETRY_FAILED_AFTER;
        assert_eq!(
            kernel_step(false, false, Some((now, false)), later),
            KernelStep::Prepare
        );
    }

    #[test]
    fn long_messages_keep_their_start_and_end() {
        let short = "build failed".to_string();
        assert_eq!(bounded_message(short.clone()), short);
        let long = format!("building failed{}last line é", "x".repeat(5000));
        let cut = bounded_message(long);
        assert!(cut.len() < MESSAGE_LIMIT + 20, "{}", cut.len());
        assert!(cut.starts_with("building failed") && cut.ends_with("last line é"));
        assert!(cut.contains(" [...] "));
    }
}
