//! Swapping versions on a simulated host: the real build path against the simulated build tree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use fixture::Fixture;
use ttdp_kmod::{CacheOutcome, SwapOptions, SwapOutcome};

#[test]
fn first_install_builds_caches_and_loads() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    let report = installer.swap("1.0.0", &SwapOptions::default()).unwrap();
    assert_eq!(report.outcome, SwapOutcome::Installed);
    assert_eq!(report.cache, Some(CacheOutcome::Miss));
    let status = installer.status().unwrap();
    assert_eq!(status.loaded_version(), Some("1.0.0"));
    assert_eq!(status.refcnt, Some(0));
    assert!(fx.sim.host().path("/var/cache/tt-kmd/6.8.0-sim/1.0.0/tenstorrent.ko").is_file());
    assert!(fx.sim.host().path("/var/cache/tt-kmd/6.8.0-sim/1.0.0/tenstorrent.ko.json").is_file());
}
