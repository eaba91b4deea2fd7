//! The target `.ko` in the cache before anything else: taken from the cache at once on a
//! verified hit, else downloaded or built on a blocking thread (abandoned on shutdown, nothing
//! changed yet).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::info;
use ttdp_api::agent_report::AgentPhase;
use ttdp_kmod::prebuilt::{PrebuiltFallback, prebuilt_url};
use ttdp_kmod::{CacheOutcome, EnsuredKo, Kernel, KmdVersion};

use super::{Attempt, NodeAgent};
use crate::convergence::{Observation, base_report};
use crate::error::AgentError;
use crate::reporting::Reporter;

impl<K, R> NodeAgent<K, R>
where
    K: Kernel + Send + Sync + 'static,
    R: Reporter,
{
    /// Makes sure the target `.ko` is in the cache, and returns the module status to decide on
    /// after that; `Err(attempt)` when the attempt ends here (also when this image must not
    /// build for the kernel: see `waits_for_builder`).
    pub(super) async fn target_ko_in_cache(
        &mut self,
        observation: &Observation,
        shutdown: &CancellationToken,
    ) -> Result<Result<ttdp_kmod::ModuleStatus, Attempt>, AgentError> {
        let target = self.config.target_version.clone();
        // a verified hit needs no thread, no cache lock and no new look at the node: the
        // common case, kept fast (the boot into a prepared kernel). It needs no compiler
        // either: only a rollback `.ko` still to build would.
        if let Some(ensured) = self
            .installer
            .cached_ko(&target, self.config.source_commit.as_deref())
        {
            let rollback_to_build = self
                .installer
                .cached_rollback_ko(&observation.status, &target)
                .is_none();
            if rollback_to_build && self.waits_for_builder(observation).await {
                return Ok(Err(Attempt::Done));
            }
            log_ensured(&target, &ensured);
            self.start.note_target_ko(true);
            return Ok(Ok(observation.status.clone()));
        }
        if self.waits_for_builder(observation).await {
            return Ok(Err(Attempt::Done));
        }
        if let Some(ended) = self.ensure_target_ko(observation, shutdown).await? {
            return Ok(Err(ended));
        }
        // a fetch or a build takes minutes: the node may have changed meanwhile
        match self.installer.status() {
            Ok(status) => Ok(Ok(status)),
            Err(e) => {
                let message = format!("cannot read the module status: {e}");
                self.fail(e.reason(), "Probe", message, Some(observation))
                    .await;
                Ok(Err(Attempt::Done))
            }
        }
    }

    /// Puts the target `.ko` in the cache on a miss (fetch or download, and build; abandoned
    /// on shutdown, nothing changed yet). `Some(attempt)` when the attempt ends here.
    async fn ensure_target_ko(
        &mut self,
        observation: &Observation,
        shutdown: &CancellationToken,
    ) -> Result<Option<Attempt>, AgentError> {
        let target = self.config.target_version.clone();
        let mut report = base_report(AgentPhase::Building, &target, observation);
        report.message = Some(self.building_message());
        self.publish_report(report).await;

        let installer = Arc::clone(&self.installer);
        let version = target.clone();
        let pin = self.config.source_commit.clone();
        let build = tokio::task::spawn_blocking(move || {
            installer.ensure_pinned_ko(&version, pin.as_deref())
        });
        let ensured = tokio::select! {
            joined = build => joined.map_err(|source| AgentError::Task { task: "ensure .ko", source })?,
            () = shutdown.cancelled() => {
                info!(step = "ensure-ko", version = %target, "shutdown during fetch/build: abandoned, the loaded module was not touched");
                return Ok(Some(Attempt::Abandoned));
            }
        };
        let ensured = match ensured {
            Ok(ensured) => ensured,
            Err(e) => {
                let message = format!(
                    "{e}; the loaded module ({}) was left as it is",
                    observation.loaded_version().unwrap_or("none")
                );
                self.fail(e.reason(), "Build", message, Some(observation))
                    .await;
                return Ok(Some(Attempt::Done));
            }
        };
        log_ensured(&target, &ensured);
        self.start
            .note_target_ko(ensured.cache == CacheOutcome::Hit);
        Ok(None)
    }

    /// What the agent does on a cache miss of the target: downloads it or builds it.
    fn building_message(&self) -> String {
        let (target, release) = (&self.config.target_version, self.installer.release());
        let pin = self
            .config
            .source_commit
            .as_deref()
            .map_or(String::new(), |c| format!(" (pinned to commit {c})"));
        let build = format!(
            "fetching tag ttkmd-{target}{pin} from {} and building it for kernel {release}",
            self.config.build.repository,
        );
        match &self.config.prebuilt {
            Some(prebuilt) => format!(
                "downloading prebuilt tt-kmd {target} for kernel {release} from {} ({})",
                prebuilt_url(&prebuilt.url_template, target, release),
                match prebuilt.fallback {
                    PrebuiltFallback::Build => format!("if it is missing: {build}"),
                    PrebuiltFallback::Fail => "no build if it is missing".to_owned(),
                }
            ),
            None => build,
        }
    }
}

/// Logs how the target `.ko` came to be in the cache.
fn log_ensured(target: &KmdVersion, ensured: &EnsuredKo) {
    let cache = match &ensured.cache {
        CacheOutcome::Hit => "hit".to_string(),
        CacheOutcome::Miss => "miss".to_string(),
        CacheOutcome::Rebuilt { reason } => format!("rebuilt ({reason})"),
        CacheOutcome::Resigned { reason } => format!("re-signed ({reason})"),
        CacheOutcome::Downloaded { url } => format!("downloaded from {url}"),
    };
    info!(
        step = "ensure-ko",
        version = %target,
        cache = %cache,
        fetch_ms = ensured.fetch_ms,
        build_ms = ensured.build_ms,
        elapsed_ms = ensured.elapsed_ms,
        "module file ready"
    );
}
