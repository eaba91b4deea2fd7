//! Installing, upgrading, downgrading and rolling back on a simulated host, with the real build
//! path against the simulated build tree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::time::Duration;

use fixture::{Fixture, RELEASE, v};
use ttdp_kmod::{CacheLookup, CacheOutcome, KmodError, SwapOptions, SwapOutcome, UnloadOptions};

fn no_wait() -> UnloadOptions {
    UnloadOptions {
        force: false,
        wait: Duration::ZERO,
    }
}

fn forced() -> SwapOptions {
    SwapOptions {
        unload: UnloadOptions {
            force: true,
            wait: Duration::from_secs(5),
        },
        params: String::new(),
        source_commit: None,
        allow_no_rollback: false,
    }
}

#[test]
fn first_install_builds_caches_and_loads() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    let report = installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(report.outcome, SwapOutcome::Installed);
    assert_eq!(
        (report.previous.as_deref(), report.cache.clone()),
        (None, Some(CacheOutcome::Miss))
    );
    assert!(report.total_ms >= report.build_ms);
    let status = installer.status().unwrap();
    assert_eq!(status.loaded_version(), Some("1.0.0"));
    assert_eq!(status.refcnt, Some(0));
    assert!(
        fx.sim
            .host()
            .path("/var/cache/tt-kmd/6.8.0-sim/1.0.0/tenstorrent.ko")
            .is_file()
    );
    assert!(
        fx.sim
            .host()
            .path("/var/cache/tt-kmd/6.8.0-sim/1.0.0/tenstorrent.ko.json")
            .is_file()
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["cache"]["kind"], "miss");
    assert_eq!(json["outcome"], "installed");
    assert!(
        json["buildMs"].is_u64()
            && json["loadMs"].is_u64()
            && json["unloadMs"].is_u64()
            && json["probeMs"].is_u64()
    );
}

#[test]
fn a_configured_cache_dir_is_where_modules_are_cached() {
    let fx = Fixture::new(&["1.0.0"]);
    let elsewhere = fx.dir.path().join("other-cache");
    let config = ttdp_kmod::InstallerConfig {
        build: fx.build_options(),
        cache_dir: Some(elsewhere.clone()),
        ..ttdp_kmod::InstallerConfig::default()
    };
    let installer =
        ttdp_kmod::ModuleInstaller::new(fx.sim.host().clone(), fx.kernel(), config).unwrap();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    assert!(elsewhere.join("6.8.0-sim/1.0.0/tenstorrent.ko").is_file());
    assert!(
        !fx.sim
            .host()
            .path("/var/cache/tt-kmd/6.8.0-sim/1.0.0")
            .exists(),
        "nothing is written to the default cache"
    );
}

#[test]
fn upgrade_then_downgrade_from_the_cache() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    let up = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(
        (up.outcome, up.previous.as_deref()),
        (SwapOutcome::Replaced, Some("1.0.0"))
    );
    assert_eq!(installer.status().unwrap().loaded_version(), Some("2.0.0"));
    // without the repository, the downgrade can only come from the cache
    std::fs::remove_dir_all(fx.repo.dir()).unwrap();
    let down = installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(
        (down.outcome, down.cache),
        (SwapOutcome::Replaced, Some(CacheOutcome::Hit))
    );
    assert_eq!(installer.status().unwrap().loaded_version(), Some("1.0.0"));
    assert_eq!(installer.cache().versions(RELEASE), ["1.0.0", "2.0.0"]);
}

#[test]
fn the_loaded_version_is_left_alone() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().hold(42, "train").unwrap();
    std::fs::remove_dir_all(fx.repo.dir()).unwrap();
    let report = installer.swap(&v("1.0.0"), &forced()).unwrap();
    assert_eq!(
        (report.outcome, report.cache, report.killed.len()),
        (SwapOutcome::AlreadyLoaded, None, 0)
    );
    assert_eq!(
        installer.status().unwrap().refcnt,
        Some(1),
        "the workload keeps running"
    );
}

#[test]
fn a_held_module_is_not_unloaded_without_force_and_the_holders_are_named() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().hold(4242, "python3").unwrap();
    let options = SwapOptions {
        unload: no_wait(),
        params: String::new(),
        source_commit: None,
        allow_no_rollback: false,
    };
    let err = installer.swap(&v("2.0.0"), &options).unwrap_err();
    assert_eq!(err.reason(), "ModuleInUse");
    let msg = err.to_string();
    assert!(
        msg.contains("pid 4242 (python3)")
            && msg.contains("tenstorrent 1.0.0")
            && msg.contains("refcnt 1"),
        "{msg}"
    );
    assert!(
        msg.contains("drain") && msg.contains("force unload"),
        "{msg}"
    );
    let status = installer.status().unwrap();
    assert_eq!(status.loaded_version(), Some("1.0.0"));
    assert_eq!(status.device_holders[0].pid, 4242);
    // the new version was prepared before touching the module, so a retry only waits for the drain
    assert!(matches!(
        installer.cache().lookup(RELEASE, &v("2.0.0")).unwrap(),
        CacheLookup::Hit(_)
    ));
}

#[test]
fn unload_waits_a_bounded_time_for_holders_to_go() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    let kernel = fx.kernel();
    kernel.hold(7, "job").unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        kernel.release(7).unwrap();
    });
    let report = installer
        .unload(&UnloadOptions {
            force: false,
            wait: Duration::from_secs(5),
        })
        .unwrap();
    releaser.join().unwrap();
    assert!(report.killed.is_empty());
    assert!(report.waited_ms >= 100, "{report:?}");
    assert_eq!(report.version.as_deref(), Some("1.0.0"));
    assert!(!installer.status().unwrap().loaded);
}

#[test]
fn force_unload_kills_the_holders_and_reports_them() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().hold(300, "train").unwrap();
    fx.kernel().hold(301, "tt-smi").unwrap();
    let report = installer.swap(&v("2.0.0"), &forced()).unwrap();
    let killed: Vec<(i32, &str)> = report
        .killed
        .iter()
        .map(|h| (h.pid, h.comm.as_str()))
        .collect();
    assert_eq!(killed, vec![(300, "train"), (301, "tt-smi")]);
    assert!(!fx.sim.host().path("/proc/300").exists() && !fx.sim.host().path("/proc/301").exists());
    let status = installer.status().unwrap();
    assert_eq!(
        (status.loaded_version(), status.refcnt),
        (Some("2.0.0"), Some(0))
    );
}

#[test]
fn force_unload_gives_up_when_something_it_cannot_kill_holds_the_module() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    // a dependent module holds it: there is no process to kill
    std::fs::create_dir_all(
        fx.sim
            .host()
            .path("/sys/module/tenstorrent/holders/tt_extra"),
    )
    .unwrap();
    std::fs::write(fx.sim.host().path("/sys/module/tenstorrent/refcnt"), "1\n").unwrap();
    let err = installer
        .unload(&UnloadOptions {
            force: true,
            wait: Duration::from_millis(100),
        })
        .unwrap_err();
    let KmodError::HoldersRemain {
        refcnt,
        killed,
        left,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!((*refcnt, killed.len(), left.len()), (1, 0, 0));
    assert!(
        err.to_string().contains("still in use after force unload"),
        "{err}"
    );
    let err = installer.unload(&no_wait()).unwrap_err();
    assert_eq!(err.reason(), "ModuleInUse");
    assert!(
        err.to_string().contains("no holding process found"),
        "{err}"
    );
    assert!(installer.status().unwrap().loaded);
}

#[test]
fn a_failed_build_never_unloads_the_working_module_or_kills_workloads() {
    let fx = Fixture::new(&["1.0.0"]);
    fx.repo.add_broken_version("2.0.0").unwrap();
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().hold(55, "train").unwrap();
    let err = installer.swap(&v("2.0.0"), &forced()).unwrap_err();
    assert_eq!(err.reason(), "BuildFailed");
    let status = installer.status().unwrap();
    assert_eq!(
        (status.loaded_version(), status.refcnt),
        (Some("1.0.0"), Some(1))
    );
    assert!(
        fx.sim.host().path("/proc/55").exists(),
        "the workload was not killed"
    );
    let err = installer.swap(&v("3.0.0"), &forced()).unwrap_err();
    assert_eq!(err.reason(), "FetchFailed");
    fx.sim.remove_headers().unwrap();
    fx.repo.add_version("4.0.0").unwrap();
    let err = installer.swap(&v("4.0.0"), &forced()).unwrap_err();
    assert_eq!(err.reason(), "HeadersMissing");
    assert_eq!(installer.status().unwrap().loaded_version(), Some("1.0.0"));
}

#[test]
fn a_version_that_fails_to_load_is_rolled_back_and_both_errors_reported() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().fail_load("2.0.0", true).unwrap();
    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    let KmodError::RolledBack {
        version,
        previous,
        load_error,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!((version.as_str(), previous.as_str()), ("2.0.0", "1.0.0"));
    assert_eq!(load_error.reason(), "BadModule");
    let msg = err.to_string();
    assert!(
        msg.contains("loading tenstorrent 2.0.0 failed")
            && msg.contains("tenstorrent 1.0.0 was loaded back"),
        "{msg}"
    );
    assert!(
        msg.contains("rebuild it against the running kernel"),
        "{msg}"
    );
    assert_eq!(installer.status().unwrap().loaded_version(), Some("1.0.0"));
    // the rejected .ko is dropped from the cache: the next attempt rebuilds it
    assert_eq!(
        installer.cache().lookup(RELEASE, &v("2.0.0")).unwrap(),
        CacheLookup::Miss
    );
    fx.kernel().fail_load("2.0.0", false).unwrap();
    let report = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(report.cache, Some(CacheOutcome::Miss));
}

#[test]
fn when_rollback_is_impossible_the_error_says_nothing_is_loaded() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    installer.ensure_ko(&v("2.0.0")).unwrap();
    // 1.0.0's .ko is gone and cannot be built again: no rollback path
    installer.cache().evict(RELEASE, &v("1.0.0")).unwrap();
    fx.sim.fail_builds(true).unwrap();
    fx.kernel().fail_load("2.0.0", true).unwrap();
    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "NoRollbackPath", "{err}");
    assert!(err.to_string().contains("nothing was unloaded"), "{err}");
    assert_eq!(installer.status().unwrap().loaded_version(), Some("1.0.0"));
    // the node opted in to upgrading without a rollback path
    let unprotected = SwapOptions {
        allow_no_rollback: true,
        ..SwapOptions::default()
    };
    let err = installer.swap(&v("2.0.0"), &unprotected).unwrap_err();
    let KmodError::RollbackFailed { rollback_error, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(rollback_error.reason(), "NotCached");
    assert!(
        err.to_string()
            .contains("no tenstorrent module is loaded on this node now"),
        "{err}"
    );
    assert!(!installer.status().unwrap().loaded);

    // the previous version's .ko is cached but the kernel refuses it too
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().fail_load("2.0.0", true).unwrap();
    fx.kernel().fail_load("1.0.0", true).unwrap();
    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    let KmodError::RollbackFailed { rollback_error, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(rollback_error.reason(), "BadModule");
}

#[test]
fn a_first_install_that_fails_to_load_reports_the_load_error() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    fx.kernel().fail_load("1.0.0", true).unwrap();
    let err = installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "BadModule");
    let msg = err.to_string();
    assert!(
        msg.contains("as module tenstorrent 1.0.0") && msg.contains("vermagic 6.8.0-sim"),
        "{msg}"
    );
}

#[test]
fn individual_steps_report_the_kernel_answers_as_typed_errors() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    let err = installer.unload(&no_wait()).unwrap_err();
    assert_eq!(err.reason(), "ModuleNotLoaded");
    assert!(
        err.to_string().contains("module tenstorrent is not loaded"),
        "{err}"
    );

    let one = installer.ensure_ko(&v("1.0.0")).unwrap();
    let two = installer.ensure_ko(&v("2.0.0")).unwrap();
    installer.load(&one.ko, "").unwrap();
    let err = installer.load(&two.ko, "").unwrap_err();
    let KmodError::AlreadyLoaded { loaded, wanted, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        (loaded.as_deref(), wanted.as_str()),
        (Some("1.0.0"), "2.0.0")
    );
    assert!(err.to_string().contains("unload it first"), "{err}");

    installer.unload(&no_wait()).unwrap();
    let err = installer
        .load_file(&one.ko.path, &v("9.9.9"), "")
        .unwrap_err();
    assert_eq!(err.reason(), "VersionMismatchAfterLoad");
    assert!(
        err.to_string()
            .contains("reports version 1.0.0 instead of 9.9.9"),
        "{err}"
    );
}

#[test]
fn an_unsigned_module_is_not_swapped_in_where_signatures_are_enforced() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().hold(9, "train").unwrap();
    fx.sim.enforce_signatures(true).unwrap();
    let err = installer.swap(&v("2.0.0"), &forced()).unwrap_err();
    assert_eq!(err.reason(), "SignatureRequired");
    assert!(
        err.to_string().contains("sig_enforce=Y")
            && err.to_string().contains("nothing was unloaded"),
        "{err}"
    );
    assert_eq!(installer.status().unwrap().loaded_version(), Some("1.0.0"));
    assert!(
        fx.kernel().process_alive(9),
        "no workload is killed for a swap that cannot succeed"
    );

    // loading directly anyway: the kernel's answer is reported as a signature problem
    fx.kernel().exit_process(9).unwrap();
    installer.unload(&no_wait()).unwrap();
    let two = installer.ensure_ko(&v("2.0.0")).unwrap();
    let err = installer.load(&two.ko, "").unwrap_err();
    assert_eq!(err.reason(), "SignatureRejected");
    fx.sim.enforce_signatures(false).unwrap();
    fx.sim.set_lockdown("integrity").unwrap();
    let err = installer.load(&two.ko, "").unwrap_err();
    assert_eq!(err.reason(), "SignatureRejected", "{err}");
    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert!(err.to_string().contains("lockdown=integrity"), "{err}");
    fx.sim.set_lockdown("none").unwrap();
    installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap();
}

#[test]
fn a_loaded_module_without_a_version_cannot_be_rolled_back_and_says_so() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    std::fs::remove_file(fx.sim.host().path("/sys/module/tenstorrent/version")).unwrap();
    fx.kernel().fail_load("2.0.0", true).unwrap();
    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    let KmodError::NoRollbackPath { loaded, why, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(loaded, &None);
    assert!(why.contains("declares no version"), "{why}");
    assert!(installer.status().unwrap().loaded, "nothing was unloaded");
    let unprotected = SwapOptions {
        allow_no_rollback: true,
        ..SwapOptions::default()
    };
    let err = installer.swap(&v("2.0.0"), &unprotected).unwrap_err();
    let KmodError::RollbackFailed {
        previous,
        rollback_error,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(previous, &None);
    assert!(
        rollback_error.to_string().contains("(unknown version)"),
        "{rollback_error}"
    );
}

#[test]
fn force_unload_never_kills_init_or_the_installer_itself() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    let me = i32::try_from(std::process::id()).unwrap();
    fx.kernel().hold(1, "systemd").unwrap();
    fx.kernel().hold(me, "agent").unwrap();
    let err = installer
        .unload(&UnloadOptions {
            force: true,
            wait: Duration::from_millis(50),
        })
        .unwrap_err();
    let KmodError::HoldersRemain { killed, left, .. } = &err else {
        panic!("{err}")
    };
    assert!(killed.is_empty());
    assert_eq!(left.iter().map(|h| h.pid).collect::<Vec<_>>(), vec![1, me]);
    assert!(fx.kernel().process_alive(1) && fx.kernel().process_alive(me));
}

#[test]
fn concurrent_swaps_on_one_node_are_serialised() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    // warm the cache so both swaps race on unload and load, not on the build
    fx.installer().ensure_ko(&v("1.0.0")).unwrap();
    fx.installer().ensure_ko(&v("2.0.0")).unwrap();
    for _ in 0..3 {
        let results: Vec<_> = std::thread::scope(|s| {
            let a = s.spawn(|| fx.installer().swap(&v("1.0.0"), &SwapOptions::default()));
            let b = s.spawn(|| fx.installer().swap(&v("2.0.0"), &SwapOptions::default()));
            vec![a.join().unwrap(), b.join().unwrap()]
        });
        for result in &results {
            assert!(result.is_ok(), "{result:?}");
        }
        let loaded = fx.installer().status().unwrap().version.unwrap();
        assert!(loaded == "1.0.0" || loaded == "2.0.0");
    }
}

#[test]
fn a_repository_created_by_another_process_can_be_opened() {
    let fx = Fixture::new(&["1.0.0"]);
    let reopened = ttdp_kmod::SimKmdRepo::open(fx.repo.dir()).unwrap();
    assert_eq!(reopened.url(), fx.repo.url());
    assert!(ttdp_kmod::SimKmdRepo::open(fx.dir.path().join("nothing")).is_err());
}

#[test]
fn a_loaded_version_missing_from_the_cache_is_built_before_the_unload_and_rolled_back_to() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    // as if 1.0.0 had been loaded by another tool, or the cache wiped since
    installer.cache().evict(RELEASE, &v("1.0.0")).unwrap();
    fx.kernel().fail_load("2.0.0", true).unwrap();
    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "LoadFailedRolledBack", "{err}");
    assert_eq!(installer.status().unwrap().loaded_version(), Some("1.0.0"));
    assert!(matches!(
        installer.cache().lookup(RELEASE, &v("1.0.0")).unwrap(),
        CacheLookup::Hit(_)
    ));

    fx.kernel().fail_load("2.0.0", false).unwrap();
    installer.cache().evict(RELEASE, &v("1.0.0")).unwrap();
    let report = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(report.rollback, Some(CacheOutcome::Miss), "{report:?}");
}

#[test]
fn the_module_lock_lives_where_the_config_says() {
    let fx = Fixture::new(&["1.0.0"]);
    let dir = tempfile::tempdir().unwrap();
    let config = ttdp_kmod::InstallerConfig {
        lock_dir: Some(dir.path().join("locks")),
        ..fx.installer().config().clone()
    };
    let installer =
        ttdp_kmod::ModuleInstaller::new(fx.sim.host().clone(), fx.kernel(), config).unwrap();
    assert_eq!(
        installer.module_lock_path(),
        dir.path().join("locks/tenstorrent.lock")
    );
    let held = installer.lock_module().unwrap();
    assert_eq!(held.path(), installer.module_lock_path());
    assert_eq!(
        fx.installer().module_lock_path(),
        fx.sim.host().path("/run/ttdp/tenstorrent.lock")
    );
}

#[test]
fn a_loaded_custom_build_has_no_rollback_path_unless_allowed() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    // a module loaded by hand whose version is no release (sysfs says anything it declares)
    let module = fx.sim.host().path("/sys/module/tenstorrent");
    std::fs::create_dir_all(module.join("holders")).unwrap();
    std::fs::write(module.join("version"), "1.0.0-custom\n").unwrap();
    std::fs::write(module.join("refcnt"), "0\n").unwrap();
    std::fs::write(module.join("initstate"), "live\n").unwrap();
    let err = installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "NoRollbackPath", "{err}");
    assert!(
        err.to_string()
            .contains("its version \"1.0.0-custom\" is not a tt-kmd release"),
        "{err}"
    );
    assert_eq!(
        installer.status().unwrap().loaded_version(),
        Some("1.0.0-custom")
    );
    let unprotected = SwapOptions {
        allow_no_rollback: true,
        ..SwapOptions::default()
    };
    let report = installer.swap(&v("1.0.0"), &unprotected).unwrap();
    assert_eq!(
        (report.outcome, report.previous.as_deref(), report.rollback),
        (SwapOutcome::Replaced, Some("1.0.0-custom"), None)
    );
    assert_eq!(report.version, "1.0.0");
}
