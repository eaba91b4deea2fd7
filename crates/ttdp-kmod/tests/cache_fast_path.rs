//! The answers an agent takes from the cache alone, without a thread, the cache lock or a
//! build: they must be exactly what the full step would return on a verified hit, and nothing
//! at all (so the full step runs) for anything else.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use fixture::{Fixture, RELEASE, v};
use ttdp_kmod::{CacheOutcome, SwapOptions};

#[test]
fn the_cache_answers_for_the_target_only_with_a_verified_entry_its_pin_accepts() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    assert!(
        installer.cached_ko(&v("1.0.0"), None).is_none(),
        "a miss is for the full step to build"
    );

    let ensured = installer.ensure_ko(&v("1.0.0")).unwrap();
    let cached = installer.cached_ko(&v("1.0.0"), None).unwrap();
    assert_eq!(
        (&cached.ko, &cached.cache),
        (&ensured.ko, &CacheOutcome::Hit)
    );
    let built_from = ensured.ko.record.source_commit.clone().unwrap();
    assert!(
        installer
            .cached_ko(&v("1.0.0"), Some(&built_from))
            .is_some()
    );
    assert!(
        installer
            .cached_ko(&v("1.0.0"), Some(&"0".repeat(40)))
            .is_none(),
        "an entry built from another commit than the pinned one is for the full step to rebuild"
    );

    std::fs::write(&ensured.ko.path, b"not a module").unwrap();
    assert!(
        installer.cached_ko(&v("1.0.0"), None).is_none(),
        "a corrupt entry is never taken from the cache"
    );
}

#[test]
fn the_cache_answers_for_the_way_back_only_when_it_is_verified() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    let nothing_loaded = installer.status().unwrap();
    assert_eq!(
        installer.cached_rollback_ko(&nothing_loaded, &v("2.0.0")),
        Some(None),
        "with nothing loaded there is nothing to go back to"
    );

    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    let status = installer.status().unwrap();
    let cached = installer
        .cached_rollback_ko(&status, &v("2.0.0"))
        .unwrap()
        .unwrap();
    assert_eq!(cached.ko.record.version, v("1.0.0"));
    assert_eq!(
        installer.cached_rollback_ko(&status, &v("1.0.0")),
        Some(None),
        "the target loaded needs no way back"
    );

    installer.cache().evict(RELEASE, &v("1.0.0")).unwrap();
    assert_eq!(
        installer.cached_rollback_ko(&status, &v("2.0.0")),
        None,
        "an uncached way back is for the full step to build"
    );
    let mut custom = status.clone();
    custom.version = Some("1.0.0-custom".into());
    assert_eq!(
        installer.cached_rollback_ko(&custom, &v("2.0.0")),
        None,
        "a custom build is for the full step to refuse, with its reason"
    );
}

#[test]
fn the_module_lock_is_taken_at_once_only_when_free() {
    let fx = Fixture::new(&[]);
    let installer = fx.installer();
    let held = installer.try_lock_module().unwrap().unwrap();
    assert!(
        installer.try_lock_module().unwrap().is_none(),
        "held by another installer: the caller must wait"
    );
    drop(held);
    assert!(installer.try_lock_module().unwrap().is_some());
}
