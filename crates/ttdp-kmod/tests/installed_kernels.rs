//! Modules for the kernels a node has installed but does not run yet: built against each one's
//! headers into the cache, verified for that kernel, without touching the loaded module; and the
//! cache pruned of kernels that are gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fixture::{Fixture, RELEASE, v};
use ttdp_hostprobe::installed_kernels;
use ttdp_kmod::{CacheLookup, CacheOutcome, KoCache, PruneReason, SwapOptions};

const NEXT: &str = "6.9.0-next";

fn installed(fx: &Fixture) -> BTreeSet<String> {
    installed_kernels(fx.sim.host())
        .unwrap()
        .into_iter()
        .map(|k| k.release)
        .collect()
}

#[test]
fn another_kernels_module_is_built_for_it_and_the_loaded_one_is_untouched() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.sim.add_kernel(NEXT, true, true).unwrap();

    let ensured = installer
        .ensure_ko_for(NEXT, &v("2.0.0"), None, &fx.build_options())
        .unwrap();
    assert_eq!(ensured.cache, CacheOutcome::Miss);
    assert_eq!(ensured.ko.record.kernel_release, NEXT);
    assert!(
        ensured.ko.record.vermagic.starts_with(&format!("{NEXT} ")),
        "{}",
        ensured.ko.record.vermagic
    );
    assert_eq!(
        ensured.ko.path,
        KoCache::new(fx.sim.host()).ko_path(NEXT, &v("2.0.0"))
    );
    let status = installer.status().unwrap();
    assert_eq!(status.version.as_deref(), Some("1.0.0"), "still loaded");
    assert!(
        installer.cached_ko(&v("2.0.0"), None).is_none(),
        "nothing was cached for the running kernel"
    );
    assert!(installer.cached_ko_for(NEXT, &v("2.0.0"), None).is_some());

    let again = installer
        .ensure_ko_for(NEXT, &v("2.0.0"), None, &fx.build_options())
        .unwrap();
    assert_eq!(again.cache, CacheOutcome::Hit);
}

#[test]
fn a_module_built_for_the_running_kernel_is_no_hit_for_another() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    let running = installer.ensure_ko(&v("1.0.0")).unwrap();
    fx.sim.add_kernel(NEXT, true, false).unwrap();
    // the running kernel's file copied under the other kernel's key: vermagic says no
    let cache = KoCache::new(fx.sim.host());
    let other = cache.ko_path(NEXT, &v("1.0.0"));
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    std::fs::copy(&running.ko.path, &other).unwrap();
    std::fs::copy(
        running.ko.path.with_file_name("tenstorrent.ko.json"),
        other.with_file_name("tenstorrent.ko.json"),
    )
    .unwrap();
    assert!(matches!(
        cache.lookup(NEXT, &v("1.0.0")).unwrap(),
        CacheLookup::Invalid { .. }
    ));
    let rebuilt = installer
        .ensure_ko_for(NEXT, &v("1.0.0"), None, &fx.build_options())
        .unwrap();
    assert!(matches!(rebuilt.cache, CacheOutcome::Rebuilt { .. }));
    assert_eq!(rebuilt.ko.record.kernel_release, NEXT);
}

#[test]
fn a_kernel_without_headers_is_refused_with_what_to_install() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    fx.sim.add_kernel(NEXT, false, true).unwrap();
    let err = installer
        .ensure_ko_for(NEXT, &v("1.0.0"), None, &fx.build_options())
        .unwrap_err();
    assert_eq!(err.reason(), "HeadersMissing");
    assert!(
        err.to_string()
            .contains(&format!("install linux-headers-{NEXT}")),
        "{err}"
    );
    assert!(installer.cached_ko_for(NEXT, &v("1.0.0"), None).is_none());
}

#[test]
fn a_build_for_another_kernel_holds_only_its_own_entry() {
    let fx = Fixture::new(&["1.0.0"]);
    let mut config = fx.installer().config().clone();
    config.cache_lock_timeout = Duration::from_millis(300);
    let installer =
        ttdp_kmod::ModuleInstaller::new(fx.sim.host().clone(), fx.kernel(), config).unwrap();
    fx.sim.add_kernel(NEXT, true, false).unwrap();
    // what a background build for the next kernel holds while it runs
    let cache = KoCache::new(fx.sim.host());
    let _building = cache
        .lock_entry(NEXT, &v("1.0.0"), Duration::from_secs(1))
        .unwrap();

    let started = Instant::now();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(
        installer.status().unwrap().version.as_deref(),
        Some("1.0.0")
    );
    let err = installer
        .ensure_ko_for(NEXT, &v("1.0.0"), None, &fx.build_options())
        .unwrap_err();
    assert_eq!(err.reason(), "LockTimeout", "the same entry waits: {err}");
}

#[test]
fn a_niced_build_runs_make_at_that_niceness() {
    let fx = Fixture::new(&["1.0.0"]);
    let mut options = fx.build_options();
    options.niceness = Some(15);
    let niced = ttdp_kmod::build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &options).unwrap();
    let plain =
        ttdp_kmod::build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap();
    // relative to this test's own niceness, which the runner may have raised
    let niceness = |log: &str| -> i32 {
        log.lines()
            .find_map(|l| l.strip_prefix("sim-kbuild: niceness "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no niceness in the build log: {log}"))
    };
    let (niced, plain) = (niceness(&niced.log), niceness(&plain.log));
    assert_eq!(niced, (plain + 15).min(19), "plain build at {plain}");
}

#[test]
fn entries_of_a_removed_kernel_are_pruned_and_the_running_kernels_stay() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    installer.ensure_ko(&v("2.0.0")).unwrap();
    fx.sim.add_kernel(NEXT, true, true).unwrap();
    installer
        .ensure_ko_for(NEXT, &v("2.0.0"), None, &fx.build_options())
        .unwrap();

    let kept = installer
        .prune_cache(&v("2.0.0"), &installed(&fx), u64::MAX)
        .unwrap()
        .unwrap();
    assert!(kept.is_empty(), "{kept:?}");

    fx.sim.remove_kernel(NEXT).unwrap();
    let pruned = installer
        .prune_cache(&v("2.0.0"), &installed(&fx), u64::MAX)
        .unwrap()
        .unwrap();
    let pruned: Vec<(String, String, PruneReason)> = pruned
        .into_iter()
        .map(|p| (p.entry.release, p.entry.version.to_string(), p.reason))
        .collect();
    assert_eq!(
        pruned,
        vec![(NEXT.to_string(), "2.0.0".into(), PruneReason::KernelRemoved)]
    );
    let cache = KoCache::new(fx.sim.host());
    assert!(!cache.dir().join(NEXT).exists());
    assert_eq!(cache.versions(RELEASE), vec![v("1.0.0"), v("2.0.0")]);

    // over the limit: the running kernel's target and loaded version still stay
    let pruned = installer
        .prune_cache(&v("2.0.0"), &installed(&fx), 0)
        .unwrap()
        .unwrap();
    assert!(pruned.is_empty(), "{pruned:?}");
    assert_eq!(
        installer.status().unwrap().version.as_deref(),
        Some("1.0.0")
    );
}

#[test]
fn pruning_waits_for_no_swap_and_skips_when_one_runs() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    let _swapping = installer.lock_module().unwrap();
    assert_eq!(
        installer
            .prune_cache(&v("1.0.0"), &BTreeSet::new(), 0)
            .unwrap(),
        None
    );
}
