//! A swap whose loaded module must prove it works before the swap returns: on a simulated host
//! whose driver binds its PCI functions, a failed check brings the previous version back and
//! never leaves the node without a driver it had.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use fixture::{Fixture, v};
use ttdp_hostprobe::device_bindings;
use ttdp_kmod::{KmodError, ModuleStatus, SwapOptions, SwapOutcome};

/// Every Tenstorrent function bound to `tenstorrent` with its node, else how many are.
fn all_bound(fx: &Fixture) -> impl Fn(&ModuleStatus) -> Result<String, String> + Sync + '_ {
    move |_status: &ModuleStatus| {
        let bindings = device_bindings(fx.sim.host()).map_err(|e| e.to_string())?;
        let working = bindings
            .iter()
            .filter(|b| b.bound_to_tenstorrent() && b.char_devices_present())
            .count();
        if working == bindings.len() {
            Ok(format!("{working} of {} devices bound", bindings.len()))
        } else {
            Err(format!("{working} of {} devices bound", bindings.len()))
        }
    }
}

#[test]
fn a_module_that_binds_every_device_passes_and_says_what_it_proved() {
    let fx = Fixture::new(&["1.0.0"]);
    fx.sim.add_pci_device("0000:02:00.0", 0xb140).unwrap();
    let check = all_bound(&fx);
    let report = fx
        .installer()
        .swap_validated(&v("1.0.0"), &SwapOptions::default(), &check)
        .unwrap();
    assert_eq!(report.outcome, SwapOutcome::Installed);
    assert_eq!(report.validation.as_deref(), Some("2 of 2 devices bound"));
    let bindings = device_bindings(fx.sim.host()).unwrap();
    let nodes: Vec<_> = bindings
        .iter()
        .flat_map(|b| b.char_devices.iter().map(|c| c.path.display().to_string()))
        .collect();
    assert_eq!(nodes, vec!["/dev/tenstorrent/0", "/dev/tenstorrent/1"]);

    // unloading unbinds every function and removes the nodes
    fx.installer()
        .unload(&ttdp_kmod::UnloadOptions::default())
        .unwrap();
    let after = device_bindings(fx.sim.host()).unwrap();
    assert!(
        after
            .iter()
            .all(|b| b.driver.is_none() && b.char_devices.is_empty())
    );
}

#[test]
fn an_upgrade_that_cannot_see_the_cards_is_rolled_back() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    for address in ["0000:02:00.0", "0000:03:00.0", "0000:04:00.0"] {
        fx.sim.add_pci_device(address, 0x401e).unwrap();
    }
    let installer = fx.installer();
    let check = all_bound(&fx);
    installer
        .swap_validated(&v("1.0.0"), &SwapOptions::default(), &check)
        .unwrap();
    fx.kernel().limit_binding("2.0.0", Some(2)).unwrap();

    let err = installer
        .swap_validated(&v("2.0.0"), &SwapOptions::default(), &check)
        .unwrap_err();

    assert!(
        matches!(&err, KmodError::ValidationFailedRolledBack { previous, .. } if previous == "1.0.0"),
        "{err:?}"
    );
    assert_eq!(err.reason(), "ValidationFailedRolledBack");
    let message = err.to_string();
    assert!(
        message.contains("tenstorrent 2.0.0 loaded but does not work: 2 of 4 devices bound")
            && message.contains("tenstorrent 1.0.0 was loaded back"),
        "{message}"
    );
    assert_eq!(installer.status().unwrap().loaded_version(), Some("1.0.0"));
    assert_eq!(
        check(&installer.status().unwrap()).unwrap(),
        "4 of 4 devices bound"
    );
}

#[test]
fn a_first_install_that_fails_validation_stays_loaded() {
    let fx = Fixture::new(&["1.0.0"]);
    fx.kernel().limit_binding("1.0.0", Some(0)).unwrap();
    let installer = fx.installer();
    let err = installer
        .swap_validated(&v("1.0.0"), &SwapOptions::default(), &all_bound(&fx))
        .unwrap_err();
    assert_eq!(err.reason(), "ValidationFailed");
    assert!(
        err.to_string().contains(
            "0 of 1 devices bound; it stays loaded because no module was loaded before it"
        ),
        "{err}"
    );
    assert_eq!(installer.status().unwrap().loaded_version(), Some("1.0.0"));
}

#[test]
fn when_the_previous_version_no_longer_loads_the_new_one_is_loaded_again() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().fail_load("1.0.0", true).unwrap();
    let refuse = |_: &ModuleStatus| Err("the validation command exited with status 3".to_string());

    let err = installer
        .swap_validated(&v("2.0.0"), &SwapOptions::default(), &refuse)
        .unwrap_err();

    assert_eq!(err.reason(), "ValidationFailedRollbackFailed");
    assert!(
        err.to_string()
            .contains("tenstorrent 2.0.0 was loaded again so the node keeps a driver"),
        "{err}"
    );
    assert_eq!(installer.status().unwrap().loaded_version(), Some("2.0.0"));
}

#[test]
fn a_module_that_cannot_be_unloaded_after_failing_stays_loaded() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = fx.installer();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    let kernel = fx.kernel();
    // the check leaves a process holding the new module's device
    let hold = |_: &ModuleStatus| {
        kernel.hold(4242, "tt-smi").unwrap();
        Err("the validation command timed out".to_string())
    };

    let err = installer
        .swap_validated(&v("2.0.0"), &SwapOptions::default(), &hold)
        .unwrap_err();

    assert_eq!(err.reason(), "ValidationFailed");
    assert!(
        err.to_string().contains("it could not be unloaded"),
        "{err}"
    );
    assert_eq!(installer.status().unwrap().loaded_version(), Some("2.0.0"));
}
