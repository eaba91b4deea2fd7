//! The `.ko` cache: verified hits, corrupt or mismatched entries rebuilt and never loaded, a lock
//! between agents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::collections::BTreeSet;

use fixture::{Fixture, RELEASE, v};
use sha2::{Digest, Sha256};
use ttdp_kmod::{CacheLookup, CacheOutcome, KoCache, build_module};

fn copy_entry(cache: &KoCache, from: (&str, &str), to: (&str, &str)) {
    let src = cache.ko_path(from.0, &v(from.1));
    let dst = cache.ko_path(to.0, &v(to.1));
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    std::fs::copy(&src, &dst).unwrap();
    let mut record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.with_extension("ko.json")).unwrap())
            .unwrap();
    record["version"] = to.1.into();
    record["kernelRelease"] = to.0.into();
    std::fs::write(dst.with_extension("ko.json"), record.to_string()).unwrap();
}

#[test]
fn a_stored_module_is_a_verified_hit_with_its_provenance() {
    let fx = Fixture::new(&["1.0.0"]);
    let cache = KoCache::new(fx.sim.host());
    assert_eq!(
        cache.lookup(RELEASE, &v("1.0.0")).unwrap(),
        CacheLookup::Miss
    );
    let built = build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap();
    let stored = cache.store(&built).unwrap();
    assert_eq!(
        stored.path,
        fx.sim
            .host()
            .path("/var/cache/tt-kmd/6.8.0-sim/1.0.0/tenstorrent.ko")
    );
    let CacheLookup::Hit(hit) = cache.lookup(RELEASE, &v("1.0.0")).unwrap() else {
        panic!("expected a hit")
    };
    assert_eq!(hit, stored);
    let bytes = std::fs::read(&hit.path).unwrap();
    assert_eq!(hit.record.sha256, hex::encode(Sha256::digest(&bytes)));
    assert_eq!(hit.record.vermagic, "6.8.0-sim SMP mod_unload ");
    assert_eq!(hit.record.srcversion.as_deref(), built.modinfo.srcversion());
    assert_eq!(
        hit.record.source_commit.as_deref(),
        Some(built.source_commit.as_str())
    );
    assert_eq!(hit.record.source_repository, fx.repo.url());
    assert_eq!(cache.versions(RELEASE), ["1.0.0"]);
    // atomic writes leave no temporary files behind
    let mut names: Vec<String> = std::fs::read_dir(hit.path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, vec!["tenstorrent.ko", "tenstorrent.ko.json"]);
}

#[test]
fn a_hit_is_used_without_fetching_or_building() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    assert_eq!(
        installer.ensure_ko(&v("1.0.0")).unwrap().cache,
        CacheOutcome::Miss
    );
    std::fs::remove_dir_all(fx.repo.dir()).unwrap();
    fx.sim.remove_headers().unwrap();
    let again = installer.ensure_ko(&v("1.0.0")).unwrap();
    assert_eq!(again.cache, CacheOutcome::Hit);
    assert_eq!((again.fetch_ms, again.build_ms), (0, 0));
}

#[test]
fn a_corrupt_module_is_rebuilt() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    let first = installer.ensure_ko(&v("1.0.0")).unwrap();
    let mut bytes = std::fs::read(&first.ko.path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&first.ko.path, bytes).unwrap();
    let CacheLookup::Invalid { reason } = installer.cache().lookup(RELEASE, &v("1.0.0")).unwrap()
    else {
        panic!("a corrupt entry must not be a hit")
    };
    assert!(reason.contains("checksum"), "{reason}");
    let again = installer.ensure_ko(&v("1.0.0")).unwrap();
    assert!(
        matches!(&again.cache, CacheOutcome::Rebuilt { reason } if reason.contains("checksum")),
        "{:?}",
        again.cache
    );
    assert!(matches!(
        installer.cache().lookup(RELEASE, &v("1.0.0")).unwrap(),
        CacheLookup::Hit(_)
    ));
}

#[test]
fn a_missing_or_garbled_record_is_rebuilt() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    let first = installer.ensure_ko(&v("1.0.0")).unwrap();
    let record = first.ko.path.with_extension("ko.json");
    std::fs::remove_file(&record).unwrap();
    assert!(matches!(
        installer.ensure_ko(&v("1.0.0")).unwrap().cache,
        CacheOutcome::Rebuilt { .. }
    ));
    std::fs::write(&record, "{not json").unwrap();
    let CacheLookup::Invalid { reason } = installer.cache().lookup(RELEASE, &v("1.0.0")).unwrap()
    else {
        panic!()
    };
    assert!(reason.contains("not a valid record"), "{reason}");
    assert!(matches!(
        installer.ensure_ko(&v("1.0.0")).unwrap().cache,
        CacheOutcome::Rebuilt { .. }
    ));
    // a .ko without its record is invalid too
    std::fs::remove_file(&first.ko.path).unwrap();
    let CacheLookup::Invalid { reason } = installer.cache().lookup(RELEASE, &v("1.0.0")).unwrap()
    else {
        panic!()
    };
    assert!(reason.contains("tenstorrent.ko is missing"), "{reason}");
}

#[test]
fn an_entry_for_another_kernel_or_version_is_never_a_hit() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    installer.ensure_ko(&v("1.0.0")).unwrap();
    let cache = installer.cache();
    copy_entry(cache, (RELEASE, "1.0.0"), ("6.9.0-other", "1.0.0"));
    let CacheLookup::Invalid { reason } = cache.lookup("6.9.0-other", &v("1.0.0")).unwrap() else {
        panic!()
    };
    assert!(reason.contains("vermagic"), "{reason}");
    copy_entry(cache, (RELEASE, "1.0.0"), (RELEASE, "2.0.0"));
    let CacheLookup::Invalid { reason } = cache.lookup(RELEASE, &v("2.0.0")).unwrap() else {
        panic!()
    };
    assert!(reason.contains("version"), "{reason}");
    cache.evict(RELEASE, &v("2.0.0")).unwrap();
    assert_eq!(
        cache.lookup(RELEASE, &v("2.0.0")).unwrap(),
        CacheLookup::Miss
    );
    cache.evict(RELEASE, &v("2.0.0")).unwrap();
}

#[test]
fn two_agents_ensuring_at_once_build_only_once() {
    let fx = Fixture::new(&["1.0.0"]);
    let outcomes: BTreeSet<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| s.spawn(|| fx.installer().ensure_ko(&v("1.0.0")).unwrap()))
            .collect();
        handles
            .into_iter()
            .map(|h| format!("{:?}", h.join().unwrap().cache))
            .collect()
    });
    assert_eq!(
        outcomes,
        BTreeSet::from(["Hit".to_string(), "Miss".to_string()])
    );
}

#[test]
fn a_held_cache_lock_times_out_with_a_clear_error() {
    let fx = Fixture::new(&["1.0.0"]);
    let cache = KoCache::new(fx.sim.host());
    let _held = cache.lock(std::time::Duration::from_secs(1)).unwrap();
    let err = cache
        .lock(std::time::Duration::from_millis(20))
        .unwrap_err();
    assert_eq!(err.reason(), "LockTimeout");
    assert!(err.to_string().contains("another agent"), "{err}");
}

#[test]
fn a_module_built_elsewhere_can_be_stored_but_only_under_its_own_version_and_kernel() {
    let fx = Fixture::new(&["1.0.0"]);
    let built = build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap();
    let cache = KoCache::new(fx.sim.host());
    let wrong_version = cache
        .store_file(&built.ko_path, RELEASE, &v("2.0.0"), "vm", "abc")
        .unwrap_err();
    assert_eq!(wrong_version.reason(), "BuiltWrongModule");
    let wrong_kernel = cache
        .store_file(&built.ko_path, "6.1.0-31-amd64", &v("1.0.0"), "vm", "abc")
        .unwrap_err();
    assert_eq!(wrong_kernel.reason(), "BuiltWrongModule");
    let junk = fx.dir.path().join("junk.ko");
    std::fs::write(&junk, "junk").unwrap();
    assert_eq!(
        cache
            .store_file(&junk, RELEASE, &v("1.0.0"), "vm", "abc")
            .unwrap_err()
            .reason(),
        "InvalidModuleFile"
    );
    assert_eq!(
        cache.lookup(RELEASE, &v("1.0.0")).unwrap(),
        CacheLookup::Miss
    );
    let stored = cache
        .store_file(&built.ko_path, RELEASE, &v("1.0.0"), "vm", "abc")
        .unwrap();
    assert_eq!(
        (
            stored.record.source_repository.as_str(),
            stored.record.source_commit.as_deref().unwrap_or_default()
        ),
        ("vm", "abc")
    );
    assert_eq!(
        cache.lookup(RELEASE, &v("1.0.0")).unwrap(),
        CacheLookup::Hit(stored)
    );
}

#[test]
fn an_unwritable_cache_is_an_io_error_and_nothing_is_loaded() {
    let fx = Fixture::new(&["1.0.0"]);
    std::fs::write(
        fx.sim.host().path("/var/cache/tt-kmd"),
        "a file where the cache should be",
    )
    .unwrap();
    let installer = fx.installer();
    let err = installer
        .swap(&v("1.0.0"), &ttdp_kmod::SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "IoError");
    assert!(
        err.to_string().contains("tt-kmd") && err.to_string().contains("read-write"),
        "{err}"
    );
    assert!(!installer.status().unwrap().loaded);
}

#[test]
fn cached_versions_are_read_as_versions_in_numeric_order() {
    let fx = Fixture::new(&["1.0.0"]);
    let cache = KoCache::new(fx.sim.host());
    for dir in ["2.10.0", "2.9.0", "not-a-version", "2.9.0-rc1"] {
        let entry = cache.dir().join(RELEASE).join(dir);
        std::fs::create_dir_all(&entry).unwrap();
        std::fs::write(entry.join("tenstorrent.ko"), "").unwrap();
    }
    // a directory that is no version cannot be an entry of this cache: it is left out
    assert_eq!(cache.versions(RELEASE), ["2.9.0", "2.10.0"]);
}

#[test]
fn a_record_naming_no_release_version_is_invalid_and_rebuilt() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    let first = installer.ensure_ko(&v("1.0.0")).unwrap();
    let record = first.ko.path.with_extension("ko.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    json["version"] = "../1.0.0".into();
    std::fs::write(&record, json.to_string()).unwrap();
    let CacheLookup::Invalid { reason } = installer.cache().lookup(RELEASE, &v("1.0.0")).unwrap()
    else {
        panic!("a record with an invalid version must not be a hit")
    };
    assert!(
        reason.contains("not a valid record") && reason.contains("invalid tt-kmd version"),
        "{reason}"
    );
    assert!(matches!(
        installer.ensure_ko(&v("1.0.0")).unwrap().cache,
        CacheOutcome::Rebuilt { .. }
    ));
}
