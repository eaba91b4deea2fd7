//! The swap journal on a simulated host: written before the unload, removed once a module is
//! loaded again, kept while none is, and what a later attempt does with it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::time::{Duration, Instant};

use fixture::{Fixture, v};
use ttdp_kmod::{FileLock, KmodError, ResumeOutcome, SwapOptions, SwapPhase};

#[test]
fn a_settled_swap_leaves_no_journal_and_an_unsettled_one_is_resumed_later() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    let with = |params: &str| SwapOptions {
        params: params.into(),
        ..SwapOptions::default()
    };
    installer.swap(&v("2.0.0"), &with("reset_limit=5")).unwrap();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    assert!(installer.swap_journal().unwrap().is_none(), "settled");
    installer.swap(&v("2.0.0"), &with("reset_limit=5")).unwrap();

    // 1.0.0 fails to load and 2.0.0 fails to load back: nothing is loaded, the journal stays
    fx.kernel().fail_load("1.0.0", true).unwrap();
    fx.kernel().fail_load("2.0.0", true).unwrap();
    let err = installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert!(matches!(err, KmodError::RollbackFailed { .. }), "{err}");
    let journal = installer.swap_journal().unwrap().expect("a journal");
    assert_eq!(
        (journal.previous.as_deref(), journal.target.as_str()),
        (Some("2.0.0"), "1.0.0")
    );
    assert_eq!(journal.previous_parameters, "reset_limit=5");
    assert_eq!(journal.phase, SwapPhase::Replacing);

    // neither can be loaded: the failure says so, and the journal stays for the next attempt
    let err = installer.resume_swap(None).unwrap_err();
    assert_eq!(err.reason(), "SwapResumeFailed");
    assert!(
        err.to_string().contains("no tenstorrent module is loaded"),
        "{err}"
    );
    assert!(installer.swap_journal().unwrap().is_some());

    // once the previous version can be had again, the next attempt loads it back
    fx.kernel().fail_load("2.0.0", false).unwrap();
    installer.ensure_ko(&v("2.0.0")).unwrap();
    let resumed = installer.resume_swap(None).unwrap().expect("resumed");
    let ResumeOutcome::Restored { why } = resumed.outcome else {
        panic!("{:?}", resumed.outcome)
    };
    assert!(why.contains("no .ko of 1.0.0"), "{why}");
    let status = installer.status().unwrap();
    assert_eq!(status.loaded_version(), Some("2.0.0"));
    assert_eq!(status.applied_parameters.as_deref(), Some("reset_limit=5"));
    assert!(installer.swap_journal().unwrap().is_none());
    assert!(
        installer.resume_swap(None).unwrap().is_none(),
        "nothing left"
    );
}

#[test]
fn a_journal_of_a_swap_still_running_elsewhere_is_left_to_it() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().fail_load("2.0.0", true).unwrap();
    fx.kernel().fail_load("1.0.0", true).unwrap();
    installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert!(installer.swap_journal().unwrap().is_some());
    fx.kernel().fail_load("1.0.0", false).unwrap();
    installer.ensure_ko(&v("1.0.0")).unwrap();

    // another process holds the module lock: its swap is running, the journal is its own
    let running = FileLock::acquire(&installer.module_lock_path(), Duration::from_secs(5)).unwrap();
    let started = Instant::now();
    assert!(installer.resume_swap(None).unwrap().is_none());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no wait for the lock"
    );
    assert!(
        installer.swap_journal().unwrap().is_some(),
        "left to its owner"
    );
    assert_eq!(installer.status().unwrap().loaded_version(), None);

    drop(running);
    let resumed = installer
        .resume_swap(None)
        .unwrap()
        .expect("settled once the lock is free");
    assert!(matches!(resumed.outcome, ResumeOutcome::Restored { .. }));
    assert_eq!(installer.status().unwrap().loaded_version(), Some("1.0.0"));
}
