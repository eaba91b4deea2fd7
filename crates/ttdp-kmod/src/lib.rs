//! Linux kernel-module status, build, cache, load, unload and holder discovery, without Kubernetes.
//!
//! What it is for: everything a node agent does to the tt-kmd module (`tenstorrent`), on a host
//! seen through a [`HostRoot`] (`/host` in a pod, a temporary directory in tests):
//!
//! - [`ModuleStatus`]: loaded or not, version, refcnt, initstate, dependent modules, the
//!   processes holding `/dev/tenstorrent` ([`find_device_holders`], a `/proc/*/fd` walk) and the
//!   loaded module [`parameters`];
//! - [`KmdVersion`]: a tt-kmd release version (`MAJOR.MINOR.PATCH`), checked once where it
//!   enters the program; every operation below takes one and checks nothing again (defined in
//!   `ttdp-kmd-types`, which the controller shares without linking this crate);
//! - [`build_module`]: fetch tag `ttkmd-<version>` from a git repository ([`BuildOptions`]) and
//!   `make -C /lib/modules/<release>/build M=<src> modules` with a job count and a timeout;
//! - [`KoCache`]: `/var/cache/tt-kmd/<release>/<version>/tenstorrent.ko`, atomic writes, verified
//!   hits, a lock per entry serialising agents; entries for every installed kernel, not only the
//!   running one ([`ModuleInstaller::ensure_ko_for`]), and [`prune_plan`] keeping it to the
//!   installed kernels and under a size limit ([`ModuleInstaller::prune_cache`]);
//! - [`prebuilt`]: ready-built modules from a server, checked (checksum, version, vermagic)
//!   before they enter the cache; the caller supplies the download ([`prebuilt::PrebuiltSource`]);
//! - [`ModuleInstaller`]: ensure the `.ko`, unload (optionally killing holders), load, and
//!   [`ModuleInstaller::swap`] which does all three with rollback, and
//!   [`ModuleInstaller::swap_validated`] which also proves the loaded module works (a
//!   [`PostLoadCheck`]) and rolls back when it does not;
//! - [`SwapJournal`]: what a swap writes down before it unloads a working module, so a process
//!   stopped half-way leaves which driver the node had; [`ModuleInstaller::resume_swap`] settles
//!   it (the target from the cache, else the previous version back);
//! - [`module_signing`]: modules signed with a key the caller names (the kernel's `sign-file`)
//!   before they are cached, entries signed by another key re-signed, and, where the kernel only
//!   loads signed modules, a signer it does not list refused before anything is unloaded
//!   ([`module_signature`] reads who signed a module);
//! - [`udev_rule`]: the udev rule a version ships, kept in its cache record and put in place
//!   on the host before every load of that version (the previous one's on a rollback);
//! - the [`Kernel`] trait: [`RealKernel`] (`finit_module`, `delete_module`, `kill` through nix) and,
//!   with the `sim` feature only (tests and demos, never a release build), `SimKernel` (a kernel
//!   simulated in files, shared by processes), with `SimHost` and `SimKmdRepo` to create
//!   simulated hosts and tt-kmd repositories. The [`test_hook`] kill and pause points act only
//!   with the `test-hooks` feature.
//!
//! What it must not do: depend on Kubernetes or an async runtime; touch a host path outside the
//! host root; unload a working module before the replacement `.ko` is built and verified; load an
//! unverified cache entry; decide whether a host is DKMS-managed (callers check
//! `ttdp_hostprobe::detect_host_install` first and leave such hosts alone).
//!
//! ```no_run
//! use ttdp_kmod::{HostRoot, InstallerConfig, KmdVersion, ModuleInstaller, RealKernel, SwapOptions};
//! let version: KmdVersion = "2.8.0".parse()?;
//! let host = HostRoot::new("/host");
//! let installer = ModuleInstaller::new(host.clone(), RealKernel::new(host), InstallerConfig::default())?;
//! let report = installer.swap(&version, &SwapOptions::default())?;
//! println!("{report:?}");
//! # Ok::<(), ttdp_kmod::KmodError>(())
//! ```
#![deny(missing_docs)]

mod cache_prune;
mod ensure_ko;
mod error;
mod file_lock;
mod holders;
mod install_report;
mod installer;
mod kernel;
mod ko_cache;
mod ko_signing;
mod loaded_signer;
mod modinfo;
pub mod module_signature;
pub mod module_signing;
pub mod parameters;
pub mod prebuilt;
mod rollback;
#[cfg(feature = "sim")]
mod sim_host;
#[cfg(feature = "sim")]
mod sim_kernel;
#[cfg(feature = "sim")]
mod sim_source;
mod source_build;
mod status;
mod swap_journal;
mod swap_resume;
pub mod test_hook;
mod timed_command;
pub mod udev_rule;
mod validated_swap;

pub use cache_prune::{CacheEntry, PruneReason, PruneRules, PrunedEntry, prune_plan};
pub use error::{KmodError, ResumeProblems};
pub use file_lock::FileLock;
pub use holders::{DeviceHolder, chrdev_major, find_device_holders};
pub use install_report::{
    CacheOutcome, EnsuredKo, SwapOptions, SwapOutcome, SwapReport, UnloadOptions, UnloadReport,
};
pub use installer::{InstallerConfig, MODULE_LOCK_DIR, ModuleInstaller};
pub use kernel::{Kernel, RealKernel};
pub use ko_cache::{
    CACHE_DIR, CacheLookup, CachedKo, KoCache, KoRecord, RECORD_FILE_NAME, TEMPORARY_PREFIX,
};
pub use modinfo::{ModInfo, is_signed};
pub use module_signing::{RecordedSignature, SigningConfig, SigningKey};
#[cfg(feature = "sim")]
pub use sim_host::SimHost;
#[cfg(feature = "sim")]
pub use sim_kernel::{SIM_STATE_DIR, SimKernel};
#[cfg(feature = "sim")]
pub use sim_source::SimKmdRepo;
pub use source_build::{BuildOptions, BuiltModule, DEFAULT_REPOSITORY, build_module, fetch_source};
pub use status::{ModuleStatus, is_loaded, loaded_version};
pub use swap_journal::{SwapJournal, SwapPhase};
pub use swap_resume::{ResumeOutcome, ResumedSwap};
pub use timed_command::{CommandRun, log_tail, run_logged};
pub use ttdp_hostprobe::HostRoot;
pub use ttdp_kmd_types::{KmdVersion, RELEASE_TAG_PREFIX};
pub use udev_rule::{InstalledUdevRule, ShippedUdevRule, UdevConfig};
pub use validated_swap::PostLoadCheck;

/// The README's example, compiled as a doctest so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;

/// The tt-kmd module name.
pub const MODULE_NAME: &str = "tenstorrent";
/// Host directory of tt-kmd's device nodes.
pub const DEVICE_DIR: &str = "/dev/tenstorrent";
/// File name of the built module.
pub const KO_FILE_NAME: &str = "tenstorrent.ko";
