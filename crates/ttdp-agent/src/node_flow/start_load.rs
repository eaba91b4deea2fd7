//! The module load at this agent's start (after a reboot, or in a new agent pod): whether the
//! target's `.ko` was a verified cache hit, and how long from the agent's start to Ready, for
//! the report's `startLoad` and one clear log line.

use std::time::Instant;

use tracing::info;
use ttdp_api::agent_report::StartLoad;
use ttdp_kmod::{Kernel, SwapOutcome, SwapReport};

use super::{NodeAgent, millis};
use crate::reporting::Reporter;

/// What is known of the start load so far.
#[derive(Debug)]
pub(super) struct StartTracker {
    /// When the agent started.
    started: Instant,
    /// Whether the target's `.ko` came from the cache as is, at its latest look.
    target_ko_hit: Option<bool>,
    /// A first swap loaded a module and Ready has not been reported since: whether its `.ko`
    /// was a cache hit.
    loaded_hit: Option<bool>,
    /// Whether this agent has swapped before (only its first load is the start load).
    swapped: bool,
    /// The start load, once Ready followed it.
    recorded: Option<StartLoad>,
}

impl StartTracker {
    pub(super) fn new() -> Self {
        Self {
            started: Instant::now(),
            target_ko_hit: None,
            loaded_hit: None,
            swapped: false,
            recorded: None,
        }
    }

    /// The target's `.ko` was found in the cache as is (`hit`), or had to be downloaded or
    /// built.
    pub(super) fn note_target_ko(&mut self, hit: bool) {
        self.target_ko_hit = Some(hit);
    }

    /// A swap succeeded: the first one that loaded a module is the start load.
    pub(super) fn note_swap(&mut self, report: &SwapReport) {
        if self.swapped || report.outcome == SwapOutcome::AlreadyLoaded {
            return;
        }
        self.swapped = true;
        self.loaded_hit = Some(self.target_ko_hit.unwrap_or(false));
    }

    /// The start load, once recorded.
    pub(super) fn start_load(&self) -> Option<StartLoad> {
        self.recorded
    }
}

impl<K, R> NodeAgent<K, R>
where
    K: Kernel + Send + Sync + 'static,
    R: Reporter,
{
    /// The node is newly Ready: after the agent's first load, that is its start load.
    pub(super) fn settle_start_load(&mut self) {
        let Some(cache_hit) = self.start.loaded_hit.take() else {
            return;
        };
        let ready_after_ms = millis(self.start.started.elapsed());
        self.start.recorded = Some(StartLoad {
            cache_hit,
            ready_after_ms,
        });
        let (version, release) = (&self.config.target_version, self.installer.release());
        if cache_hit {
            info!(step = "start", %version, %release, ready_after_ms, cache_hit,
                "cache hit for tt-kmd {version} on kernel {release}: loaded without building");
        } else {
            info!(step = "start", %version, %release, ready_after_ms, cache_hit,
                "no verified tt-kmd {version} was cached for kernel {release}: it was downloaded or built before loading");
        }
    }
}
