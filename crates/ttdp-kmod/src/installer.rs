//! [`ModuleInstaller`]: status, ensure-`.ko`, unload, load and swap for one module on one host.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use ttdp_hostprobe::{HostRoot, kernel_release, signing_facts};

use crate::KmdVersion;
use crate::file_lock::FileLock;
use crate::install_report::{SwapOptions, SwapOutcome, SwapReport};
use crate::kernel::Kernel;
use crate::ko_cache::{CachedKo, KoCache};
use crate::modinfo::ModInfo;
use crate::module_signature::{SIGNATURE_MARKER, appended_signature};
use crate::module_signing::SigningConfig;
use crate::prebuilt::PrebuiltSource;
use crate::source_build::{BuildOptions, millis};
use crate::status::{ModuleStatus, loaded_version};
use crate::test_hook::{AFTER_LOAD, AFTER_UNLOAD, BEFORE_UNLOAD, checkpoint};
use crate::udev_rule::UdevConfig;
use crate::validated_swap::PostLoadCheck;
use crate::{DEVICE_DIR, KmodError, MODULE_NAME};

mod unload;

/// Host directory of the node-wide module lock (the default of [`InstallerConfig::lock_dir`]).
/// An agent in a pod must see the host's directory here: ttdp's DaemonSet mounts the host's
/// `/run/ttdp` (and nothing else of `/run`) at `<host root>/run/ttdp`.
pub const MODULE_LOCK_DIR: &str = "/run/ttdp";
/// How often unload re-reads refcnt while waiting for it to reach 0.
const REFCNT_POLL: Duration = Duration::from_millis(50);

/// Settings of a [`ModuleInstaller`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallerConfig {
    /// Module name (`tenstorrent`).
    pub module: String,
    /// Host directory of the module's device nodes (`/dev/tenstorrent`).
    pub device_dir: PathBuf,
    /// Where and how to fetch and build.
    pub build: BuildOptions,
    /// How long to wait for the cache lock and the module lock (another agent building or
    /// swapping on the same node).
    pub cache_lock_timeout: Duration,
    /// The `.ko` cache directory as this process sees it; `None` is `/var/cache/tt-kmd` under the
    /// host root (the spec's location).
    pub cache_dir: Option<PathBuf>,
    /// The directory of the node-wide module lock as this process sees it; `None` is
    /// [`MODULE_LOCK_DIR`] under the host root. Every installer on a node must use the same host
    /// directory, or two of them can swap at the same time.
    pub lock_dir: Option<PathBuf>,
    /// Where the version's udev rule goes and how udev is told (see [`crate::udev_rule`]).
    pub udev: UdevConfig,
}

impl Default for InstallerConfig {
    fn default() -> Self {
        Self {
            module: MODULE_NAME.to_string(),
            device_dir: PathBuf::from(DEVICE_DIR),
            build: BuildOptions::default(),
            cache_lock_timeout: Duration::from_secs(20 * 60),
            cache_dir: None,
            lock_dir: None,
            udev: UdevConfig::default(),
        }
    }
}

/// Manages one module on one host through a [`Kernel`].
///
/// It does not check for a host-managed (DKMS) install: callers do that first with
/// `ttdp_hostprobe::detect_host_install` and leave such hosts alone.
#[derive(Debug)]
pub struct ModuleInstaller<K> {
    host: HostRoot,
    kernel: K,
    release: String,
    cache: KoCache,
    config: InstallerConfig,
    prebuilt: Option<Arc<dyn PrebuiltSource>>,
    /// Where the key every cached module is signed with is, when modules are signed.
    pub(crate) signing: Option<SigningConfig>,
    /// The last problem putting the udev rule in place or telling udev, for the caller to show.
    pub(crate) udev_problem: Mutex<Option<String>>,
}

impl<K: Kernel> ModuleInstaller<K> {
    /// An installer for the host at `host`, reading its kernel release now.
    pub fn new(host: HostRoot, kernel: K, config: InstallerConfig) -> Result<Self, KmodError> {
        let release = kernel_release(&host)?;
        let cache = match &config.cache_dir {
            Some(dir) => KoCache::at(dir.clone()),
            None => KoCache::new(&host),
        };
        Ok(Self {
            host,
            kernel,
            release,
            cache,
            config,
            prebuilt: None,
            signing: None,
            udev_problem: Mutex::new(None),
        })
    }

    /// This installer, asking `source` for a ready-built `.ko` on every cache miss before building
    /// one (see [`ModuleInstaller::ensure_pinned_ko`]).
    pub fn with_prebuilt(mut self, source: Arc<dyn PrebuiltSource>) -> Self {
        self.prebuilt = Some(source);
        self
    }

    /// The server of ready-built modules, when one is set.
    pub fn prebuilt(&self) -> Option<&dyn PrebuiltSource> {
        self.prebuilt.as_deref()
    }

    /// The host root.
    pub fn host(&self) -> &HostRoot {
        &self.host
    }

    /// The kernel used for system calls.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// The running kernel release the installer builds for.
    pub fn release(&self) -> &str {
        &self.release
    }

    /// The `.ko` cache.
    pub fn cache(&self) -> &KoCache {
        &self.cache
    }

    /// The settings.
    pub fn config(&self) -> &InstallerConfig {
        &self.config
    }

    /// The module's current status.
    pub fn status(&self) -> Result<ModuleStatus, KmodError> {
        let mut status =
            ModuleStatus::read(&self.host, &self.config.module, &self.config.device_dir)?;
        status.applied_parameters = status
            .loaded
            .then(|| self.applied_parameters(&status.parameters))
            .flatten();
        status.source_commit = status
            .loaded_version()
            .and_then(|v| v.parse::<KmdVersion>().ok())
            .and_then(|v| self.cache.record(&self.release, &v))
            // a module loaded from elsewhere at the same version is not that build
            .filter(|r| r.srcversion.is_none() || r.srcversion == status.srcversion)
            .and_then(|r| r.source_commit);
        status.signer = self.loaded_signer(&status);
        status.udev_rule = self.installed_udev_rule();
        Ok(status)
    }

    /// Loads a cached `.ko` with `params` and checks that sysfs then reports its version. A `.ko`
    /// the kernel rejects as invalid is removed from the cache so the next attempt rebuilds it.
    /// The version's udev rule is put in place first ([`crate::udev_rule`]), so the device nodes
    /// the load creates get its mode.
    pub fn load(&self, ko: &CachedKo, params: &str) -> Result<(), KmodError> {
        self.load_with_rule(ko, params, None)
    }

    /// [`ModuleInstaller::load`] of the version a swap replaced, loaded back: when the rule it
    /// ships is unknown, the rule file the swap found goes back as it was.
    pub(crate) fn load_back(&self, ko: &CachedKo, params: &str) -> Result<(), KmodError> {
        let before = self
            .swap_journal()
            .ok()
            .flatten()
            .map(|journal| journal.previous_udev_rule);
        self.load_with_rule(ko, params, before.as_ref())
    }

    fn load_with_rule(
        &self,
        ko: &CachedKo,
        params: &str,
        restore: Option<&Option<String>>,
    ) -> Result<(), KmodError> {
        let rule_changed = self.place_udev_rule(ko, restore);
        self.load_file(&ko.path, &ko.record.version, params)
            .inspect_err(|e| {
                if matches!(e, KmodError::BadModule { .. }) {
                    let _ = self.cache.evict(&self.release, &ko.record.version);
                }
            })?;
        if rule_changed {
            // nodes udev handled before it read the new rule get it now
            self.retrigger_devices();
        }
        Ok(())
    }

    /// Loads the module file at `path`, expected to be `version`, and verifies the loaded version.
    pub fn load_file(
        &self,
        path: &Path,
        version: &KmdVersion,
        params: &str,
    ) -> Result<(), KmodError> {
        let module = self.config.module.clone();
        if let Err(e) = self.kernel.load(path, params) {
            return Err(match errno(&e) {
                Some(Errno::EEXIST) => KmodError::AlreadyLoaded {
                    module,
                    loaded: self.status().ok().and_then(|s| s.version),
                    wanted: version.to_string(),
                },
                Some(Errno::ENOEXEC | Errno::EINVAL) => KmodError::BadModule {
                    module,
                    version: version.to_string(),
                    path: path.to_path_buf(),
                    vermagic: ModInfo::from_file(path)
                        .ok()
                        .and_then(|i| i.vermagic().map(str::to_string)),
                    source: e,
                },
                Some(Errno::EKEYREJECTED | Errno::ENOKEY | Errno::EBADMSG) => {
                    KmodError::SignatureRejected {
                        module,
                        version: version.to_string(),
                        source: e,
                    }
                }
                Some(Errno::EPERM) => {
                    let enforced =
                        signing_facts(&self.host).is_ok_and(|f| !f.unsigned_modules_load());
                    if enforced {
                        KmodError::SignatureRejected {
                            module,
                            version: version.to_string(),
                            source: e,
                        }
                    } else {
                        KmodError::PermissionDenied {
                            action: "load",
                            module,
                            version: Some(version.to_string()),
                        }
                    }
                }
                _ => KmodError::Syscall {
                    action: "load",
                    module,
                    version: Some(version.to_string()),
                    source: e,
                },
            });
        }
        // sysfs alone: the holders' walk of every process's open files tells nothing here
        let found = loaded_version(&self.host, &self.config.module)?;
        if found.as_deref() != Some(version.as_str()) {
            return Err(KmodError::VersionAfterLoad {
                module,
                expected: version.to_string(),
                found,
            });
        }
        self.record_parameters(params)?;
        self.record_loaded_signer(path)
    }

    /// The node-wide module lock file: `<lock dir>/<module>.lock`.
    pub fn module_lock_path(&self) -> PathBuf {
        let dir = match &self.config.lock_dir {
            Some(dir) => dir.clone(),
            None => self.host.path(MODULE_LOCK_DIR),
        };
        dir.join(format!("{}.lock", self.config.module))
    }

    /// Takes the node-wide module lock ([`ModuleInstaller::module_lock_path`], by default
    /// `/run/ttdp/<module>.lock` on the host), so two installers on one node never interleave
    /// their unloads and loads. [`ModuleInstaller::swap`] takes it itself; callers running the
    /// steps one by one hold it around their unload and load.
    pub fn lock_module(&self) -> Result<FileLock, KmodError> {
        FileLock::acquire(&self.module_lock_path(), self.config.cache_lock_timeout)
    }

    /// [`ModuleInstaller::lock_module`] without waiting: `None` when another holds it.
    pub fn try_lock_module(&self) -> Result<Option<FileLock>, KmodError> {
        match FileLock::acquire(&self.module_lock_path(), Duration::ZERO) {
            Ok(lock) => Ok(Some(lock)),
            Err(KmodError::LockTimeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Makes `version` the loaded module: ensures its `.ko` first (so a failed build never unloads
    /// a working module) and a `.ko` of the loaded version to roll back to
    /// ([`ModuleInstaller::ensure_rollback_ko`]; without one nothing is unloaded unless
    /// `options.allow_no_rollback`), then unloads the old module (see [`ModuleInstaller::unload`])
    /// and loads the new one. If loading fails, the previous version is loaded back from the cache
    /// and the error reports both outcomes ([`KmodError::RolledBack`] or
    /// [`KmodError::RollbackFailed`]). Holds [`ModuleInstaller::lock_module`] throughout; the
    /// [`crate::test_hook`] points are on the way.
    pub fn swap(
        &self,
        version: &KmdVersion,
        options: &SwapOptions,
    ) -> Result<SwapReport, KmodError> {
        self.swap_checked(version, options, None)
    }

    /// [`ModuleInstaller::swap`], then `check` on the loaded module before the module lock is
    /// released and the swap returns: a module that loads but does not work (its devices are not
    /// bound, a validation command fails) is replaced by the previous version, with the rollback
    /// rules of a failed load and the node never left without a driver (see
    /// [`KmodError::ValidationFailedRolledBack`], [`KmodError::ValidationFailedKeptLoaded`],
    /// [`KmodError::ValidationFailedRollbackFailed`]). Not run when the target was already loaded.
    pub fn swap_validated(
        &self,
        version: &KmdVersion,
        options: &SwapOptions,
        check: PostLoadCheck<'_>,
    ) -> Result<SwapReport, KmodError> {
        self.swap_checked(version, options, Some(check))
    }

    fn swap_checked(
        &self,
        version: &KmdVersion,
        options: &SwapOptions,
        check: Option<PostLoadCheck<'_>>,
    ) -> Result<SwapReport, KmodError> {
        let started = Instant::now();
        let module_lock = self.lock_module()?;
        self.swap_locked_since(&module_lock, None, version, options, check, started)
    }

    /// [`ModuleInstaller::swap`] (with `check`: [`ModuleInstaller::swap_validated`]) for a
    /// caller that took the module lock itself ([`ModuleInstaller::lock_module`]), so it can
    /// decide under the lock, on what the node shows then, whether the swap may go ahead at
    /// all. `observed` is the module status the caller read under the lock and decided on: the
    /// swap goes on from it (the unload still looks at the holders again), and reads it anew
    /// only when a stopped swap's journal had to be settled first. Fails without touching
    /// anything when `lock` is not this module's lock.
    pub fn swap_locked(
        &self,
        lock: &FileLock,
        observed: ModuleStatus,
        version: &KmdVersion,
        options: &SwapOptions,
        check: Option<PostLoadCheck<'_>>,
    ) -> Result<SwapReport, KmodError> {
        self.swap_locked_since(
            lock,
            Some(observed),
            version,
            options,
            check,
            Instant::now(),
        )
    }

    fn swap_locked_since(
        &self,
        lock: &FileLock,
        observed: Option<ModuleStatus>,
        version: &KmdVersion,
        options: &SwapOptions,
        check: Option<PostLoadCheck<'_>>,
        started: Instant,
    ) -> Result<SwapReport, KmodError> {
        let lock_path = self.module_lock_path();
        if lock.path() != lock_path {
            return Err(KmodError::io(
                "swap under",
                lock.path(),
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("not the module lock {}", lock_path.display()),
                ),
            ));
        }
        // a swap a stopped process left comes first: its journal knows what the node had
        let observed = match self.resume_swap_locked(check)? {
            None => observed,
            Some(_) => None,
        };
        let status = match observed {
            Some(status) => status,
            None => self.status()?,
        };
        let swapped = self.swap_steps(status, version, options, check, started);
        let settled = self.settle_swap_journal();
        let report = swapped?;
        settled.map(|()| report)
    }

    fn swap_steps(
        &self,
        status: ModuleStatus,
        version: &KmdVersion,
        options: &SwapOptions,
        check: Option<PostLoadCheck<'_>>,
        started: Instant,
    ) -> Result<SwapReport, KmodError> {
        let probe_ms = millis(started.elapsed());
        let previous = status.loaded_version().map(str::to_string);
        let mut report = SwapReport {
            version: version.clone(),
            previous: previous.clone(),
            outcome: SwapOutcome::AlreadyLoaded,
            cache: None,
            rollback: None,
            killed: Vec::new(),
            probe_ms,
            build_ms: 0,
            unload_ms: 0,
            load_ms: 0,
            validation: None,
            validate_ms: 0,
            total_ms: 0,
        };
        if status.at_target(version.as_str(), &options.params) {
            report.total_ms = millis(started.elapsed());
            return Ok(report);
        }

        let step = Instant::now();
        let ensured = self.ensure_pinned_ko(version, options.source_commit.as_deref())?;
        report.build_ms = millis(step.elapsed());
        report.cache = Some(ensured.cache.clone());

        self.check_signature_policy(&ensured.ko)?;
        report.rollback = self.rollback_ko_or_allowed(&status, version, options)?;
        report.build_ms = millis(step.elapsed());

        if status.loaded {
            // written before the unload: a process stopped from here on leaves what the node had
            self.write_swap_journal(&self.journal_for(&status, version.as_str(), &options.params))?;
        }
        checkpoint(BEFORE_UNLOAD);
        let step = Instant::now();
        report.outcome = if status.loaded {
            report.killed = self.unload(&options.unload)?.killed;
            SwapOutcome::Replaced
        } else {
            SwapOutcome::Installed
        };
        report.unload_ms = millis(step.elapsed());
        checkpoint(AFTER_UNLOAD);

        let step = Instant::now();
        if let Err(load_error) = self.load(&ensured.ko, &options.params) {
            // the previous module goes back with the parameters it had
            let before = status.applied_parameters.as_deref().unwrap_or_default();
            return Err(self.roll_back(version, status.loaded, previous, load_error, before));
        }
        report.load_ms = millis(step.elapsed());
        checkpoint(AFTER_LOAD);
        if let Some(check) = check {
            let step = Instant::now();
            let summary =
                self.validate_loaded(version, Some(&ensured.ko), &status, &options.params, check)?;
            report.validation = Some(summary);
            report.validate_ms = millis(step.elapsed());
        }
        report.total_ms = millis(started.elapsed());
        Ok(report)
    }

    /// Fails with [`KmodError::SignatureRequired`] when the host only loads signed modules and
    /// `ko` is not signed, and with [`KmodError::SignerNotTrusted`] when it is signed by the
    /// policy's key and the kernel's key list shows it does not hold that key: loading it could
    /// only fail, after the working module was unloaded.
    pub fn check_signature_policy(&self, ko: &CachedKo) -> Result<(), KmodError> {
        let signing = signing_facts(&self.host)?;
        if signing.unsigned_modules_load() {
            return Ok(());
        }
        let bytes = std::fs::read(&ko.path).map_err(|e| KmodError::io("read", &ko.path, e))?;
        let enforcement = match (signing.sig_enforce, signing.lockdown) {
            (Some(true), _) => "sig_enforce=Y".to_string(),
            (_, Some(level)) => format!("lockdown={level:?}").to_lowercase(),
            _ => "signature enforcement".to_string(),
        };
        if let Ok(Some(signature)) = appended_signature(&bytes) {
            return self.check_signer_trusted(ko, &signature.signer, &signing, &enforcement);
        }
        if bytes.ends_with(SIGNATURE_MARKER) {
            // a signature this reader cannot follow: the kernel decides
            return Ok(());
        }
        Err(KmodError::SignatureRequired {
            module: self.config.module.clone(),
            version: ko.record.version.to_string(),
            release: self.release.clone(),
            enforcement,
        })
    }
}

/// The errno carried by a kernel error.
fn errno(e: &io::Error) -> Option<Errno> {
    e.raw_os_error().map(Errno::from_raw)
}
