//! ttdp-kmod against a real Linux kernel: run inside a QEMU VM by `cargo xtask vm-test` (scenario
//! `kmod`), ignored everywhere else (they load and unload kernel modules).
//!
//! The VM boots Debian 12's kernel with no network; its `/init` puts the stub `tenstorrent`
//! module (`tests/vm/stub-module/`: a `tenstorrent` character device `/dev/tenstorrent/0`), built
//! on the host, at `$TTDP_VM_KO_DIR/<version>/tenstorrent.ko` for versions 1.0.0 and 2.0.0, plus
//! 3.0.0 whose init fails with EINVAL. The host root is `/`. The tests share one kernel, so they run one at a time
//! (`--test-threads=1`) and each starts from a clean slate: no module loaded, no holder, empty cache.
//!
//! Tests with `from_source` in their name fetch and build the module inside the VM (scenario
//! `kmod-build`: the host's `/usr` with git, make, gcc and the kernel headers is mounted read-only,
//! and `$TTDP_VM_STUB_REPO` is a git repository of the stub module with tags `ttkmd-<version>`);
//! scenario `kmod` runs all the others.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ttdp_kmod::{
    BuildOptions, CacheLookup, CacheOutcome, HostRoot, InstallerConfig, Kernel, KmdVersion,
    KmodError, ModuleInstaller, RealKernel, SwapOptions, SwapOutcome, UnloadOptions,
};

const V1: &str = "1.0.0";
const V2: &str = "2.0.0";
const BROKEN: &str = "3.0.0";
const DEVICE: &str = "/dev/tenstorrent/0";
const EAGAIN: i32 = 11;

/// `text` as a tt-kmd version (the tests write only valid ones).
fn v(text: &str) -> KmdVersion {
    text.parse().unwrap()
}

/// The stub module built at `version` on the host, as placed in the VM by `cargo xtask vm-test`.
fn stub_ko(version: &str) -> PathBuf {
    let dir = std::env::var("TTDP_VM_KO_DIR").expect(
        "TTDP_VM_KO_DIR is set by the VM's /init: run these tests with cargo xtask vm-test",
    );
    let good = std::env::var("TTDP_VM_KO_VERSIONS").unwrap_or_default();
    let broken = std::env::var("TTDP_VM_KO_BROKEN_VERSION").unwrap_or_default();
    assert!(
        good.split_whitespace().any(|v| v == version) || broken == version,
        "the VM has no stub module {version} (loadable: {good}; broken: {broken})"
    );
    Path::new(&dir).join(version).join("tenstorrent.ko")
}

/// A module installer on the VM itself, after resetting it to a clean slate.
fn fresh_installer() -> ModuleInstaller<RealKernel> {
    fresh_installer_with(InstallerConfig::default())
}

/// [`fresh_installer`] with settings.
fn fresh_installer_with(config: InstallerConfig) -> ModuleInstaller<RealKernel> {
    let host = HostRoot::system();
    let installer = ModuleInstaller::new(host.clone(), RealKernel::new(host), config).unwrap();
    if installer.status().unwrap().loaded {
        let force = UnloadOptions {
            force: true,
            wait: Duration::from_secs(5),
        };
        installer.unload(&force).unwrap();
    }
    match std::fs::remove_dir_all(installer.cache().dir()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot clear the cache: {e}"),
    }
    // A test whose swap could load neither version leaves its journal for the next swap to
    // settle; each test starts from a node with no swap behind it.
    match std::fs::remove_file(installer.swap_journal_path()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot clear the swap journal: {e}"),
    }
    installer
}

/// Puts the stub `.ko` for `version` into the cache, as a previous build would have.
fn cache_stub(installer: &ModuleInstaller<RealKernel>, version: &str) -> PathBuf {
    let cached = installer
        .cache()
        .store_file(
            &stub_ko(version),
            installer.release(),
            &v(version),
            "tests/vm/stub-module",
            "stub",
        )
        .unwrap();
    cached.path
}

fn loaded_version(installer: &ModuleInstaller<RealKernel>) -> Option<String> {
    installer
        .status()
        .unwrap()
        .loaded_version()
        .map(str::to_string)
}

/// A child process (`sleep`) holding `/dev/tenstorrent/0` open; killed and reaped on drop.
struct Holder {
    child: Child,
}

impl Holder {
    fn spawn() -> Self {
        Self::spawn_on(DEVICE)
    }

    /// A holder of the device node at `path`.
    fn spawn_on(path: &str) -> Self {
        let child = Command::new("/bin/sh")
            .args(["-c", &format!("exec 3<{path}; exec sleep 1000")])
            .spawn()
            .unwrap();
        let holder = Self { child };
        let fd = PathBuf::from(format!("/proc/{}/fd/3", holder.pid()));
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_link(&fd).ok().as_deref() != Some(Path::new(path))
            || comm(holder.pid()) != "sleep"
        {
            assert!(Instant::now() < deadline, "the holder never opened {path}");
            std::thread::sleep(Duration::from_millis(10));
        }
        holder
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn load_reports_version_and_creates_the_device_then_unload_removes_both() {
    let installer = fresh_installer();
    let absent = installer.status().unwrap();
    assert!(!absent.loaded && !absent.in_use(), "{absent:?}");

    installer.load_file(&stub_ko(V1), &v(V1), "").unwrap();
    let status = installer.status().unwrap();
    assert!(status.loaded, "{status:?}");
    assert_eq!(status.loaded_version(), Some(V1));
    assert_eq!(status.refcnt, Some(0));
    assert_eq!(status.initstate.as_deref(), Some("live"));
    assert!(status.srcversion.is_some(), "{status:?}");
    assert!(
        status.device_holders.is_empty() && !status.in_use(),
        "{status:?}"
    );
    assert!(Path::new(DEVICE).exists(), "{DEVICE} missing after load");

    let report = installer.unload(&UnloadOptions::default()).unwrap();
    assert_eq!(report.version.as_deref(), Some(V1));
    assert!(report.killed.is_empty());
    assert!(!installer.status().unwrap().loaded);
    assert!(!Path::new("/sys/module/tenstorrent").exists());
    assert!(
        !Path::new(DEVICE).exists(),
        "{DEVICE} still there after unload"
    );
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn loading_while_another_version_is_loaded_is_already_loaded() {
    let installer = fresh_installer();
    installer.load_file(&stub_ko(V1), &v(V1), "").unwrap();

    let err = installer.load_file(&stub_ko(V2), &v(V2), "").unwrap_err();
    assert_eq!(err.reason(), "ModuleAlreadyLoaded", "{err}");
    match &err {
        KmodError::AlreadyLoaded { loaded, wanted, .. } => {
            assert_eq!((loaded.as_deref(), wanted.as_str()), (Some(V1), V2));
        }
        other => panic!("expected AlreadyLoaded, got {other:?}"),
    }
    assert_eq!(loaded_version(&installer).as_deref(), Some(V1));
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn unloading_a_module_that_is_not_loaded_is_not_loaded() {
    let installer = fresh_installer();
    let err = installer.unload(&UnloadOptions::default()).unwrap_err();
    assert_eq!(err.reason(), "ModuleNotLoaded", "{err}");
    // the kernel's own answer, which the installer maps
    let raw = installer.kernel().unload("tenstorrent").unwrap_err();
    assert_eq!(raw.raw_os_error(), Some(2), "ENOENT expected: {raw}");
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn unloading_a_held_module_fails_naming_the_holder_and_leaves_it_loaded() {
    let installer = fresh_installer();
    installer.load_file(&stub_ko(V1), &v(V1), "").unwrap();
    let holder = Holder::spawn();

    let status = installer.status().unwrap();
    assert!(
        status.refcnt.unwrap_or(0) >= 1,
        "holding the device raises refcnt: {status:?}"
    );
    let found = status.device_holders.iter().find(|h| h.pid == holder.pid());
    let found = found.unwrap_or_else(|| panic!("holder {} not found: {status:?}", holder.pid()));
    assert_eq!(found.comm, "sleep");
    assert_eq!(found.paths, vec![PathBuf::from(DEVICE)]);

    // the kernel says EAGAIN (not EBUSY) for a module in use
    let raw = installer.kernel().unload("tenstorrent").unwrap_err();
    assert_eq!(raw.raw_os_error(), Some(EAGAIN), "{raw}");

    let wait = UnloadOptions {
        force: false,
        wait: Duration::from_millis(300),
    };
    let err = installer.unload(&wait).unwrap_err();
    assert_eq!(err.reason(), "ModuleInUse", "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("pid {}", holder.pid())),
        "{message}"
    );
    assert!(message.contains("sleep"), "{message}");
    assert_eq!(loaded_version(&installer).as_deref(), Some(V1));
    assert_eq!(
        comm(holder.pid()),
        "sleep",
        "a plain unload must not kill the holder"
    );
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn a_holder_of_the_device_under_another_name_is_found_by_its_major_number() {
    // what a container that mounts the device somewhere else under /dev looks like from the host
    let installer = fresh_installer();
    installer.load_file(&stub_ko(V1), &v(V1), "").unwrap();
    let major = ttdp_kmod::chrdev_major(&HostRoot::system(), "tenstorrent")
        .expect("the stub registers a tenstorrent character device region in /proc/devices");
    let alias = "/dev/tt-alias";
    let _ = std::fs::remove_file(alias);
    let mknod = Command::new("mknod")
        .args([alias, "c", &major.to_string(), "0"])
        .status();
    assert!(mknod.unwrap().success(), "mknod {alias} failed");
    let holder = Holder::spawn_on(alias);

    let status = installer.status().unwrap();
    let found = status.device_holders.iter().find(|h| h.pid == holder.pid());
    let found = found.unwrap_or_else(|| panic!("holder {} not found: {status:?}", holder.pid()));
    assert_eq!(found.paths, vec![PathBuf::from(alias)]);
    assert!(status.refcnt.unwrap_or(0) >= 1, "{status:?}");
    drop(holder);
    std::fs::remove_file(alias).unwrap();
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn force_unload_kills_the_holder_and_unloads() {
    let installer = fresh_installer();
    installer.load_file(&stub_ko(V1), &v(V1), "").unwrap();
    let mut holder = Holder::spawn();

    let force = UnloadOptions {
        force: true,
        wait: Duration::from_secs(10),
    };
    let report = installer.unload(&force).unwrap();
    let killed: Vec<i32> = report.killed.iter().map(|h| h.pid).collect();
    assert_eq!(killed, vec![holder.pid()]);
    assert_eq!(report.version.as_deref(), Some(V1));
    let exit = holder.child.wait().unwrap();
    assert_eq!(
        exit.signal(),
        Some(9),
        "the holder must die of SIGKILL: {exit:?}"
    );
    assert!(!installer.status().unwrap().loaded);
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn swap_installs_upgrades_and_then_has_nothing_to_do() {
    let installer = fresh_installer();
    cache_stub(&installer, V1);
    cache_stub(&installer, V2);
    let options = SwapOptions::default();

    let first = installer.swap(&v(V1), &options).unwrap();
    assert_eq!(first.outcome, SwapOutcome::Installed);
    assert_eq!(first.previous, None);
    assert_eq!(first.cache, Some(CacheOutcome::Hit));
    assert_eq!(loaded_version(&installer).as_deref(), Some(V1));

    let upgrade = installer.swap(&v(V2), &options).unwrap();
    assert_eq!(upgrade.outcome, SwapOutcome::Replaced);
    assert_eq!(upgrade.previous.as_deref(), Some(V1));
    assert_eq!(upgrade.cache, Some(CacheOutcome::Hit));
    assert_eq!(loaded_version(&installer).as_deref(), Some(V2));
    assert!(Path::new(DEVICE).exists());

    let again = installer.swap(&v(V2), &options).unwrap();
    assert_eq!(again.outcome, SwapOutcome::AlreadyLoaded);
    assert_eq!(loaded_version(&installer).as_deref(), Some(V2));
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn swap_over_a_holder_is_refused_unless_forced() {
    let installer = fresh_installer();
    cache_stub(&installer, V1);
    cache_stub(&installer, V2);
    installer.swap(&v(V1), &SwapOptions::default()).unwrap();
    let mut holder = Holder::spawn();

    let polite = SwapOptions {
        unload: UnloadOptions {
            force: false,
            wait: Duration::from_millis(300),
        },
        ..SwapOptions::default()
    };
    let err = installer.swap(&v(V2), &polite).unwrap_err();
    assert_eq!(err.reason(), "ModuleInUse", "{err}");
    assert_eq!(
        loaded_version(&installer).as_deref(),
        Some(V1),
        "a refused swap changes nothing"
    );

    let forced = SwapOptions {
        unload: UnloadOptions {
            force: true,
            wait: Duration::from_secs(10),
        },
        ..SwapOptions::default()
    };
    let report = installer.swap(&v(V2), &forced).unwrap();
    assert_eq!(report.outcome, SwapOutcome::Replaced);
    assert_eq!(
        report.killed.iter().map(|h| h.pid).collect::<Vec<_>>(),
        vec![holder.pid()]
    );
    assert_eq!(holder.child.wait().unwrap().signal(), Some(9));
    assert_eq!(loaded_version(&installer).as_deref(), Some(V2));
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn swap_to_a_version_that_fails_to_load_rolls_back_and_reports_both() {
    let installer = fresh_installer();
    cache_stub(&installer, V1);
    cache_stub(&installer, BROKEN);
    installer.swap(&v(V1), &SwapOptions::default()).unwrap();

    let err = installer
        .swap(&v(BROKEN), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "LoadFailedRolledBack", "{err}");
    match &err {
        KmodError::RolledBack {
            version,
            previous,
            load_error,
            ..
        } => {
            assert_eq!((version.as_str(), previous.as_str()), (BROKEN, V1));
            assert_eq!(load_error.reason(), "BadModule", "{load_error}");
        }
        other => panic!("expected RolledBack, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains(BROKEN) && message.contains(V1),
        "{message}"
    );
    assert_eq!(
        loaded_version(&installer).as_deref(),
        Some(V1),
        "the previous version is back"
    );
    assert!(Path::new(DEVICE).exists());
    // the .ko the kernel refused is not trusted again
    let lookup = installer
        .cache()
        .lookup(installer.release(), &v(BROKEN))
        .unwrap();
    assert_eq!(lookup, CacheLookup::Miss);
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn a_failed_rollback_says_that_no_module_is_loaded() {
    // 1.0.0 was loaded from outside the cache (say, by hand), so there is nothing to roll back to
    let installer = fresh_installer();
    installer.load_file(&stub_ko(V1), &v(V1), "").unwrap();
    cache_stub(&installer, BROKEN);

    // 1.0.0 cannot be rebuilt here (this scenario has no kernel headers): nothing is unloaded
    let err = installer
        .swap(&v(BROKEN), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "NoRollbackPath", "{err}");
    match &err {
        KmodError::NoRollbackPath {
            loaded,
            target,
            source,
            ..
        } => {
            assert_eq!((loaded.as_deref(), target.as_str()), (Some(V1), BROKEN));
            let source = source.as_deref().map(KmodError::reason);
            assert_eq!(source, Some("HeadersMissing"), "{err}");
        }
        other => panic!("expected NoRollbackPath, got {other:?}"),
    }
    assert!(err.to_string().contains("nothing was unloaded"), "{err}");
    assert_eq!(loaded_version(&installer).as_deref(), Some(V1));

    // the node opted in to upgrading without a rollback path
    let unprotected = SwapOptions {
        allow_no_rollback: true,
        ..SwapOptions::default()
    };
    let err = installer.swap(&v(BROKEN), &unprotected).unwrap_err();
    assert_eq!(err.reason(), "LoadFailedRollbackFailed", "{err}");
    match &err {
        KmodError::RollbackFailed {
            version,
            previous,
            load_error,
            rollback_error,
            ..
        } => {
            assert_eq!((version.as_str(), previous.as_deref()), (BROKEN, Some(V1)));
            assert_eq!(load_error.reason(), "BadModule", "{load_error}");
            assert_eq!(rollback_error.reason(), "NotCached", "{rollback_error}");
        }
        other => panic!("expected RollbackFailed, got {other:?}"),
    }
    assert!(
        err.to_string().contains("no tenstorrent module is loaded"),
        "{err}"
    );
    assert!(
        !installer.status().unwrap().loaded,
        "the error must tell the truth"
    );
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn a_verified_cache_entry_is_a_hit() {
    let installer = fresh_installer();
    assert_eq!(
        installer
            .cache()
            .lookup(installer.release(), &v(V2))
            .unwrap(),
        CacheLookup::Miss
    );
    let path = cache_stub(&installer, V2);

    match installer
        .cache()
        .lookup(installer.release(), &v(V2))
        .unwrap()
    {
        CacheLookup::Hit(ko) => {
            assert_eq!(ko.path, path);
            assert_eq!(ko.record.version, V2);
            assert_eq!(ko.record.kernel_release, installer.release());
            assert!(
                ko.record.vermagic.starts_with(installer.release()),
                "{:?}",
                ko.record
            );
        }
        other => panic!("expected a hit, got {other:?}"),
    }
    let ensured = installer.ensure_ko(&v(V2)).unwrap();
    assert_eq!(ensured.cache, CacheOutcome::Hit);
    assert_eq!(ensured.ko.path, path);
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn a_corrupt_cache_entry_is_never_loaded() {
    let installer = fresh_installer();
    cache_stub(&installer, V1);
    installer.swap(&v(V1), &SwapOptions::default()).unwrap();
    let path = cache_stub(&installer, V2);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();

    match installer
        .cache()
        .lookup(installer.release(), &v(V2))
        .unwrap()
    {
        CacheLookup::Invalid { reason } => assert!(reason.contains("checksum"), "{reason}"),
        other => panic!("a corrupt entry must be invalid, got {other:?}"),
    }
    // swap evicts it and tries to rebuild; the VM has no kernel headers, so the rebuild fails
    // before anything is unloaded
    let err = installer.swap(&v(V2), &SwapOptions::default()).unwrap_err();
    assert_eq!(err.reason(), "HeadersMissing", "{err}");
    assert_eq!(
        loaded_version(&installer).as_deref(),
        Some(V1),
        "the working module stays"
    );
    assert_eq!(
        installer
            .cache()
            .lookup(installer.release(), &v(V2))
            .unwrap(),
        CacheLookup::Miss
    );
}

/// Build settings fetching from the VM's stub repository; fails unless the scenario gives the
/// guest the host's `/usr` (a missing toolchain must fail loudly, never skip).
fn stub_repo_build_options() -> BuildOptions {
    assert_eq!(
        std::env::var("TTDP_VM_HOST_USR").as_deref(),
        Ok("1"),
        "building from source needs the host's /usr in the VM: run this test in scenario kmod-build"
    );
    BuildOptions {
        repository: std::env::var("TTDP_VM_STUB_REPO").expect("TTDP_VM_STUB_REPO is set by /init"),
        jobs: 2,
        build_timeout: Duration::from_secs(600),
        ..BuildOptions::default()
    }
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn a_cache_miss_is_built_from_source_loaded_and_then_hits_the_cache() {
    let build = stub_repo_build_options();
    let repository = build.repository.clone();
    let installer = fresh_installer_with(InstallerConfig {
        build,
        ..InstallerConfig::default()
    });

    let report = installer.swap(&v(V2), &SwapOptions::default()).unwrap();
    eprintln!("fresh install from source: {report:?}");
    assert_eq!(report.outcome, SwapOutcome::Installed);
    assert_eq!(report.cache, Some(CacheOutcome::Miss));
    assert_eq!(loaded_version(&installer).as_deref(), Some(V2));
    match installer
        .cache()
        .lookup(installer.release(), &v(V2))
        .unwrap()
    {
        CacheLookup::Hit(ko) => {
            assert_eq!(ko.record.source_repository, repository);
            assert_eq!(
                ko.record.source_commit.as_ref().map(String::len),
                Some(40),
                "{:?}",
                ko.record
            );
            assert!(
                ko.record.vermagic.starts_with(installer.release()),
                "{:?}",
                ko.record
            );
        }
        other => panic!("the built module must be cached and verified, got {other:?}"),
    }

    installer.unload(&UnloadOptions::default()).unwrap();
    let second = installer.swap(&v(V2), &SwapOptions::default()).unwrap();
    assert_eq!(
        second.cache,
        Some(CacheOutcome::Hit),
        "a second install must not rebuild"
    );
    assert_eq!(loaded_version(&installer).as_deref(), Some(V2));
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn a_module_loaded_from_outside_the_cache_is_built_from_source_before_the_unload_and_rolled_back_to()
 {
    let build = stub_repo_build_options();
    let installer = fresh_installer_with(InstallerConfig {
        build,
        ..InstallerConfig::default()
    });
    // 2.0.0 loaded by hand (insmod of a .ko that is not in the cache, no sidecar)
    installer.load_file(&stub_ko(V2), &v(V2), "").unwrap();
    assert_eq!(
        installer
            .cache()
            .lookup(installer.release(), &v(V2))
            .unwrap(),
        CacheLookup::Miss
    );
    cache_stub(&installer, BROKEN);

    let err = installer
        .swap(&v(BROKEN), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "LoadFailedRolledBack", "{err}");
    match &err {
        KmodError::RolledBack {
            version, previous, ..
        } => assert_eq!((version.as_str(), previous.as_str()), (BROKEN, V2)),
        other => panic!("expected RolledBack, got {other:?}"),
    }
    assert_eq!(
        loaded_version(&installer).as_deref(),
        Some(V2),
        "the module loaded before is back"
    );
    assert!(Path::new(DEVICE).exists());
    match installer
        .cache()
        .lookup(installer.release(), &v(V2))
        .unwrap()
    {
        CacheLookup::Hit(ko) => assert_eq!(
            ko.record.source_commit.as_ref().map(String::len),
            Some(40),
            "{:?}",
            ko.record
        ),
        other => panic!("2.0.0 must have been built from its tag into the cache, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn a_version_missing_from_source_fails_before_unloading_the_working_module() {
    let build = stub_repo_build_options();
    let installer = fresh_installer_with(InstallerConfig {
        build,
        ..InstallerConfig::default()
    });
    cache_stub(&installer, V1);
    installer.swap(&v(V1), &SwapOptions::default()).unwrap();

    let err = installer
        .swap(&v("9.9.9"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "FetchFailed", "{err}");
    assert!(err.to_string().contains("ttkmd-9.9.9"), "{err}");
    assert_eq!(
        loaded_version(&installer).as_deref(),
        Some(V1),
        "the working module stays"
    );
}
