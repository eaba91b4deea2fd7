//! tt-kmd's udev rule follows the module ttdp loads: the rule a version's source tree ships is
//! kept in its cache record and put in place before every load of that version, a version
//! without one removes ttdp's, a failed load or validation brings the previous rule back, and an
//! administrator's own file is never touched. A kernel that records the rule file at each load
//! shows the order: the rule is there before the module creates its device nodes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fixture::{Fixture, RELEASE, v};
use ttdp_kmod::udev_rule::{UDEV_RULE_FILE_NAME, UDEV_RULES_DIR, rule_file_text};
use ttdp_kmod::{
    InstallerConfig, Kernel, KmodError, ModuleInstaller, ShippedUdevRule, SimKernel, SwapOptions,
    UdevConfig,
};

const RULE_1: &str = "KERNEL==\"tenstorrent*\", MODE=\"0660\", SYMLINK+=\"tenstorrent-%n\"\n";
const RULE_2: &str = "KERNEL==\"tenstorrent*\", MODE=\"0666\", SYMLINK+=\"tenstorrent-%n\"\n";

/// One load as the kernel saw it: the version loaded and the rule file then (`None`: none).
type SeenLoad = (String, Option<String>);

/// The simulated kernel, noting the rule file as it is at each load.
#[derive(Clone)]
struct RuleWatchingKernel {
    inner: SimKernel,
    rule_file: PathBuf,
    seen: Arc<Mutex<Vec<SeenLoad>>>,
}

impl Kernel for RuleWatchingKernel {
    fn load(&self, ko: &Path, params: &str) -> io::Result<()> {
        let version = ko
            .parent()
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let rule = std::fs::read_to_string(&self.rule_file).ok();
        self.seen.lock().unwrap().push((version, rule));
        self.inner.load(ko, params)
    }
    fn unload(&self, name: &str) -> io::Result<()> {
        self.inner.unload(name)
    }
    fn kill(&self, pid: i32) -> io::Result<()> {
        self.inner.kill(pid)
    }
}

/// A repository whose 1.0.0 ships RULE_1, 2.0.0 ships RULE_2 and 3.0.0 ships none.
fn fixture() -> Fixture {
    let fx = Fixture::new(&[]);
    fx.repo
        .add_version_with_udev_rule("1.0.0", Some(RULE_1))
        .unwrap();
    fx.repo
        .add_version_with_udev_rule("2.0.0", Some(RULE_2))
        .unwrap();
    fx.repo.add_version_with_udev_rule("3.0.0", None).unwrap();
    fx
}

fn rule_file(fx: &Fixture) -> PathBuf {
    fx.sim.host().path(UDEV_RULES_DIR).join(UDEV_RULE_FILE_NAME)
}

fn installer(
    fx: &Fixture,
    udevadm: Option<PathBuf>,
) -> (ModuleInstaller<RuleWatchingKernel>, RuleWatchingKernel) {
    let kernel = RuleWatchingKernel {
        inner: fx.kernel(),
        rule_file: rule_file(fx),
        seen: Arc::default(),
    };
    let config = InstallerConfig {
        build: fx.build_options(),
        cache_lock_timeout: Duration::from_secs(60),
        udev: UdevConfig {
            rules_dir: None,
            udevadm,
        },
        ..InstallerConfig::default()
    };
    let installer = ModuleInstaller::new(fx.sim.host().clone(), kernel.clone(), config).unwrap();
    (installer, kernel)
}

fn installed(fx: &Fixture) -> Option<String> {
    std::fs::read_to_string(rule_file(fx)).ok()
}

fn seen(kernel: &RuleWatchingKernel) -> Vec<SeenLoad> {
    kernel.seen.lock().unwrap().clone()
}

fn text(version: &str, rule: &str) -> Option<String> {
    Some(rule_file_text(&v(version), rule))
}

#[test]
fn a_built_version_records_its_rule_and_puts_it_in_place_before_the_load() {
    let fx = fixture();
    let (installer, kernel) = installer(&fx, None);
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    let record = installer.cache().record(RELEASE, &v("1.0.0")).unwrap();
    assert_eq!(record.udev_rule, ShippedUdevRule::Rule(RULE_1.into()));
    assert_eq!(installed(&fx), text("1.0.0", RULE_1));
    assert_eq!(seen(&kernel), vec![("1.0.0".into(), text("1.0.0", RULE_1))]);
    let status = installer.status().unwrap();
    let shown = status.udev_rule.unwrap();
    assert_eq!(
        shown.summary(),
        "/etc/udev/rules.d/50-tenstorrent.rules (tt-kmd 1.0.0)"
    );
}

#[test]
fn an_upgrade_replaces_the_rule_and_a_version_without_one_removes_it() {
    let fx = fixture();
    let (installer, kernel) = installer(&fx, None);
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(installed(&fx), text("2.0.0", RULE_2));
    installer
        .swap(&v("3.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(
        installer
            .cache()
            .record(RELEASE, &v("3.0.0"))
            .unwrap()
            .udev_rule,
        ShippedUdevRule::None
    );
    assert_eq!(installed(&fx), None, "ttdp's rule is removed");
    assert_eq!(
        seen(&kernel).last(),
        Some(&("3.0.0".into(), None)),
        "removed before 3.0.0 was loaded"
    );
    assert_eq!(installer.status().unwrap().udev_rule, None);
}

#[test]
fn a_failed_load_brings_the_previous_rule_back() {
    let fx = fixture();
    let (installer, kernel) = installer(&fx, None);
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().fail_load("2.0.0", true).unwrap();
    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert!(matches!(err, KmodError::RolledBack { .. }), "{err}");
    assert_eq!(
        seen(&kernel),
        vec![
            ("1.0.0".into(), text("1.0.0", RULE_1)),
            ("2.0.0".into(), text("2.0.0", RULE_2)),
            ("1.0.0".into(), text("1.0.0", RULE_1)),
        ]
    );
    assert_eq!(installed(&fx), text("1.0.0", RULE_1));
}

#[test]
fn a_failed_validation_brings_the_previous_rule_back() {
    let fx = fixture();
    let (installer, _kernel) = installer(&fx, None);
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    let failing = |_: &ttdp_kmod::ModuleStatus| Err::<String, String>("no chips answered".into());
    let err = installer
        .swap_validated(&v("2.0.0"), &SwapOptions::default(), &failing)
        .unwrap_err();
    assert!(
        matches!(err, KmodError::ValidationFailedRolledBack { .. }),
        "{err}"
    );
    assert_eq!(installed(&fx), text("1.0.0", RULE_1));
}

#[test]
fn an_administrators_own_rule_is_never_touched() {
    let fx = fixture();
    let (installer, _kernel) = installer(&fx, None);
    let admins = "KERNEL==\"tenstorrent*\", MODE=\"0660\", GROUP=\"tt\"\n";
    std::fs::create_dir_all(rule_file(&fx).parent().unwrap()).unwrap();
    std::fs::write(rule_file(&fx), admins).unwrap();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(installed(&fx).as_deref(), Some(admins));
    installer
        .swap(&v("3.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(installed(&fx).as_deref(), Some(admins));
    let shown = installer.status().unwrap().udev_rule.unwrap();
    assert_eq!(shown.version, None);
}

#[test]
fn a_rollback_to_a_version_whose_rule_is_unknown_puts_back_the_file_the_swap_found() {
    let fx = fixture();
    let (installer, _kernel) = installer(&fx, None);
    // 1.0.0 cached by an older ttdp: a record without its rule
    let built =
        ttdp_kmod::build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap();
    let unknown = installer
        .cache()
        .store_file(&built.ko_path, RELEASE, &v("1.0.0"), "old", "abc")
        .unwrap();
    assert_eq!(unknown.record.udev_rule, ShippedUdevRule::Unknown);
    let before = rule_file_text(&v("0.9.0"), RULE_1);
    std::fs::create_dir_all(rule_file(&fx).parent().unwrap()).unwrap();
    std::fs::write(rule_file(&fx), &before).unwrap();
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(
        installed(&fx).as_deref(),
        Some(before.as_str()),
        "an unknown rule leaves the file"
    );
    fx.kernel().fail_load("2.0.0", true).unwrap();
    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert!(matches!(err, KmodError::RolledBack { .. }), "{err}");
    assert_eq!(installed(&fx).as_deref(), Some(before.as_str()));
}

#[test]
fn udev_is_told_to_reload_before_the_load_and_to_trigger_after_it() {
    let fx = fixture();
    let log = fx.dir.path().join("udevadm.log");
    let udevadm = fx.dir.path().join("udevadm");
    std::fs::write(
        &udevadm,
        format!("#!/bin/sh\necho \"$*\" >>{}\n", log.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&udevadm, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (installer, _kernel) = installer(&fx, Some(udevadm));
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "control --reload-rules\ntrigger --action=change --subsystem-match=tenstorrent\n"
    );
    assert_eq!(installer.take_udev_problem(), None);
    installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap();
    installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&log).unwrap().lines().count(),
        4,
        "told once per change, not when the rule is already right"
    );
}

#[test]
fn a_host_without_udevadm_still_gets_the_rule_and_the_module() {
    let fx = fixture();
    let missing = fx.dir.path().join("no-such-udevadm");
    let (installer, _kernel) = installer(&fx, Some(missing));
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(installed(&fx), text("1.0.0", RULE_1));
    let problem = installer.take_udev_problem().unwrap();
    assert!(problem.contains("udevadm"), "{problem}");
    assert_eq!(installer.take_udev_problem(), None, "taken once");
}

#[test]
fn a_loaded_module_missing_its_rule_gets_it_put_back() {
    let fx = fixture();
    let (installer, _kernel) = installer(&fx, None);
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    std::fs::remove_file(rule_file(&fx)).unwrap();
    let ko = installer.cached_ko(&v("1.0.0"), None).unwrap().ko;
    assert!(installer.sync_loaded_udev_rule(&ko));
    assert_eq!(installed(&fx), text("1.0.0", RULE_1));
    assert!(!installer.sync_loaded_udev_rule(&ko), "nothing to do twice");
}

#[test]
fn an_entry_cached_without_its_rule_learns_it_from_the_tag_it_was_built_from() {
    let fx = fixture();
    let (installer, _kernel) = installer(&fx, None);
    let built =
        ttdp_kmod::build_module(fx.sim.host(), RELEASE, &v("1.0.0"), &fx.build_options()).unwrap();
    let commit = fx.repo.tag_commit("1.0.0").unwrap();
    let cache = installer.cache();
    cache
        .store_file(
            &built.ko_path,
            RELEASE,
            &v("1.0.0"),
            &fx.repo.url(),
            &commit,
        )
        .unwrap();
    assert!(installer.learn_udev_rule(&v("1.0.0")).unwrap());
    assert_eq!(
        cache.record(RELEASE, &v("1.0.0")).unwrap().udev_rule,
        ShippedUdevRule::Rule(RULE_1.into())
    );
    assert!(
        !installer.learn_udev_rule(&v("1.0.0")).unwrap(),
        "known now"
    );

    // a tag that moved since the entry was built: its tree is not what was built
    let built =
        ttdp_kmod::build_module(fx.sim.host(), RELEASE, &v("2.0.0"), &fx.build_options()).unwrap();
    let old_commit = fx.repo.tag_commit("2.0.0").unwrap();
    cache
        .store_file(
            &built.ko_path,
            RELEASE,
            &v("2.0.0"),
            &fx.repo.url(),
            &old_commit,
        )
        .unwrap();
    fx.repo.move_tag("2.0.0").unwrap();
    assert!(!installer.learn_udev_rule(&v("2.0.0")).unwrap());
    assert_eq!(
        cache.record(RELEASE, &v("2.0.0")).unwrap().udev_rule,
        ShippedUdevRule::Unknown
    );
}
