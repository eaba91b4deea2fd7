//! Module parameters on a simulated host: passed to the load, read back from
//! `/sys/module/tenstorrent/parameters/`, part of "already at target", and restored with the
//! previous module on a rollback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use fixture::{Fixture, v};
use ttdp_kmod::{KmodError, SwapOptions, SwapOutcome};

fn with(params: &str) -> SwapOptions {
    SwapOptions {
        params: params.into(),
        ..SwapOptions::default()
    }
}

#[test]
fn parameters_reach_the_module_and_a_change_alone_reloads_it() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    let report = installer.swap(&v("1.0.0"), &with("reset_limit=5")).unwrap();
    assert_eq!(report.outcome, SwapOutcome::Installed);
    let status = installer.status().unwrap();
    assert_eq!(
        status.parameters.get("reset_limit").map(String::as_str),
        Some("5")
    );
    assert_eq!(status.applied_parameters.as_deref(), Some("reset_limit=5"));
    assert!(status.at_target("1.0.0", "reset_limit=5"));

    let again = installer.swap(&v("1.0.0"), &with("reset_limit=5")).unwrap();
    assert_eq!(again.outcome, SwapOutcome::AlreadyLoaded);

    let changed = installer.swap(&v("1.0.0"), &with("reset_limit=7")).unwrap();
    assert_eq!(
        changed.outcome,
        SwapOutcome::Replaced,
        "same version, new parameters"
    );
    let status = installer.status().unwrap();
    assert_eq!(
        status.parameters.get("reset_limit").map(String::as_str),
        Some("7")
    );

    let dropped = installer.swap(&v("1.0.0"), &with("")).unwrap();
    assert_eq!(
        dropped.outcome,
        SwapOutcome::Replaced,
        "a dropped parameter reloads"
    );
    let status = installer.status().unwrap();
    assert!(status.parameters.is_empty(), "{:?}", status.parameters);
    assert!(status.at_target("1.0.0", ""));
}

#[test]
fn a_rollback_loads_the_previous_module_with_its_own_parameters() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer.swap(&v("1.0.0"), &with("reset_limit=5")).unwrap();
    fx.kernel().fail_load("2.0.0", true).unwrap();
    let err = installer
        .swap(&v("2.0.0"), &with("reset_limit=9 debug=1"))
        .unwrap_err();
    assert!(matches!(err, KmodError::RolledBack { .. }), "{err}");
    let status = installer.status().unwrap();
    assert_eq!(status.loaded_version(), Some("1.0.0"));
    assert_eq!(
        status.parameters.get("reset_limit").map(String::as_str),
        Some("5"),
        "the previous module came back as it was"
    );
    assert_eq!(status.parameters.get("debug"), None);
    assert_eq!(status.applied_parameters.as_deref(), Some("reset_limit=5"));
}
