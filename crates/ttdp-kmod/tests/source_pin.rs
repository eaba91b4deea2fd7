//! `spec.source.commit`: the build checks that the release tag still points at the pinned
//! commit. A tag that moved is refused with a message naming both commits, before anything is
//! built, loaded or unloaded; the cache record keeps the commit a `.ko` was built from.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use fixture::{Fixture, RELEASE, v};
use ttdp_kmod::{CacheLookup, CacheOutcome, KmodError, SwapOptions};

fn pinned_to(commit: &str) -> SwapOptions {
    SwapOptions {
        source_commit: Some(commit.to_string()),
        ..SwapOptions::default()
    }
}

#[test]
fn a_pinned_commit_that_moved_is_refused_and_the_working_driver_stays() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    let original = fx.repo.tag_commit("2.0.0").unwrap();
    let moved = fx.repo.move_tag("2.0.0").unwrap();
    assert_ne!(original, moved);

    let err = installer
        .swap(&v("2.0.0"), &pinned_to(&original))
        .unwrap_err();
    let KmodError::SourceCommitMoved { pinned, found, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        (pinned.as_str(), found.as_str()),
        (original.as_str(), moved.as_str())
    );
    assert_eq!(err.reason(), "SourceCommitMoved");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "tag ttkmd-2.0.0 in {} points at commit {moved}",
            fx.repo.url()
        )) && msg.contains(&format!("not at the pinned commit {original}"))
            && msg.contains("nothing was built, loaded or unloaded"),
        "{msg}"
    );
    assert_eq!(
        installer.status().unwrap().loaded_version(),
        Some("1.0.0"),
        "the working driver is never unloaded for a moved tag"
    );
    assert_eq!(
        installer.cache().lookup(RELEASE, &v("2.0.0")).unwrap(),
        CacheLookup::Miss,
        "nothing of the moved tag was cached"
    );

    // pinning the commit the tag points at now builds, and the record keeps it
    installer.swap(&v("2.0.0"), &pinned_to(&moved)).unwrap();
    assert_eq!(installer.status().unwrap().loaded_version(), Some("2.0.0"));
    let CacheLookup::Hit(ko) = installer.cache().lookup(RELEASE, &v("2.0.0")).unwrap() else {
        panic!("2.0.0 is cached")
    };
    assert_eq!(ko.record.source_commit.as_deref(), Some(moved.as_str()));
}

#[test]
fn a_cached_module_built_from_another_commit_is_rebuilt_from_the_pin() {
    let fx = Fixture::new(&["1.0.0"]);
    let installer = fx.installer();
    let first = fx.repo.tag_commit("1.0.0").unwrap();
    installer.ensure_ko(&v("1.0.0")).unwrap();
    let moved = fx.repo.move_tag("1.0.0").unwrap();
    // the cached build is of the old commit: with the new pin it is rebuilt, not trusted
    let ensured = installer
        .ensure_pinned_ko(&v("1.0.0"), Some(&moved))
        .unwrap();
    let CacheOutcome::Rebuilt { reason } = &ensured.cache else {
        panic!("{:?}", ensured.cache)
    };
    assert!(
        reason.contains(&first) && reason.contains(&moved),
        "{reason}"
    );
    assert_eq!(
        ensured.ko.record.source_commit.as_deref(),
        Some(moved.as_str())
    );
    // and the unpinned default keeps using what is cached
    assert_eq!(
        installer.ensure_ko(&v("1.0.0")).unwrap().cache,
        CacheOutcome::Hit
    );
}
