//! What [`crate::ModuleInstaller`] operations report back: cache outcomes, unload and swap reports
//! with timings, for the caller to log.

use std::time::Duration;

use crate::KmdVersion;
use crate::holders::DeviceHolder;
use crate::ko_cache::CachedKo;

/// Options for unloading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnloadOptions {
    /// SIGKILL every process holding the device before unloading (the spec's `forceUnload`).
    pub force: bool,
    /// How long to wait for refcnt to reach 0 (after killing, when `force`) before giving up.
    pub wait: Duration,
}

impl Default for UnloadOptions {
    fn default() -> Self {
        Self {
            force: false,
            wait: Duration::from_secs(30),
        }
    }
}

/// Options for [`crate::ModuleInstaller::swap`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwapOptions {
    /// How to unload the old module.
    pub unload: UnloadOptions,
    /// Module parameters passed at load, e.g. `reset_limit=5` (empty for none).
    pub params: String,
    /// The commit the target's release tag must point at when it is built (see
    /// [`crate::ModuleInstaller::ensure_pinned_ko`]); `None`: any.
    pub source_commit: Option<String>,
    /// Unload the loaded module even when no `.ko` of it can be had to load back if the new
    /// version fails (an explicit per-node opt-in; off by default, when such a swap fails with
    /// [`crate::KmodError::NoRollbackPath`] before anything is unloaded).
    pub allow_no_rollback: bool,
}

/// Where the `.ko` came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum CacheOutcome {
    /// A verified cache entry was used.
    Hit,
    /// Nothing was cached: it was fetched and built.
    Miss,
    /// Nothing verified was cached: a prebuilt module was downloaded, checked and cached.
    Downloaded {
        /// Where it came from.
        url: String,
    },
    /// A cache entry failed verification, was removed and rebuilt.
    Rebuilt {
        /// Why the old entry was rejected.
        reason: String,
    },
    /// A verified cache entry was not signed by the signing key: it was signed again in place.
    Resigned {
        /// How it was signed before.
        reason: String,
    },
}

/// A `.ko` ready to load, and how it was obtained.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnsuredKo {
    /// The verified cache entry.
    pub ko: CachedKo,
    /// Hit, miss or rebuilt.
    pub cache: CacheOutcome,
    /// Fetch time, when built.
    pub fetch_ms: u64,
    /// `make` time, when built.
    pub build_ms: u64,
    /// Total time of the ensure step (lock wait, lookup, build, store).
    pub elapsed_ms: u64,
}

/// What an unload did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnloadReport {
    /// The version that was unloaded, as sysfs declared it (any text), when it declared one.
    pub version: Option<String>,
    /// Processes sent SIGKILL (force unload only).
    pub killed: Vec<DeviceHolder>,
    /// Time spent waiting for refcnt 0.
    pub waited_ms: u64,
}

/// How a swap ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SwapOutcome {
    /// The wanted version was already loaded: nothing was done.
    AlreadyLoaded,
    /// No module was loaded; the wanted version was loaded.
    Installed,
    /// Another version was unloaded and the wanted version loaded.
    Replaced,
}

/// What a successful swap did, with timings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapReport {
    /// The version now loaded.
    pub version: KmdVersion,
    /// The version loaded before, if any, as sysfs declared it (not necessarily a release
    /// version: a custom build may be replaced).
    pub previous: Option<String>,
    /// What happened.
    pub outcome: SwapOutcome,
    /// Where the `.ko` came from (`None` when already loaded).
    pub cache: Option<CacheOutcome>,
    /// Where the `.ko` of the previous version, secured before the unload for a rollback, came
    /// from (`None` when nothing was loaded, or none could be had and that was allowed).
    pub rollback: Option<CacheOutcome>,
    /// Processes killed by force unload.
    pub killed: Vec<DeviceHolder>,
    /// Reading the module status.
    pub probe_ms: u64,
    /// Ensuring the `.ko` (cache lookup, or fetch + build + store).
    pub build_ms: u64,
    /// Unloading the old module, including waits and kills.
    pub unload_ms: u64,
    /// Loading and verifying the new module.
    pub load_ms: u64,
    /// What the post-load validation proved ([`crate::ModuleInstaller::swap_validated`]),
    /// `None` when none ran.
    pub validation: Option<String>,
    /// The post-load validation.
    pub validate_ms: u64,
    /// The whole swap.
    pub total_ms: u64,
}
