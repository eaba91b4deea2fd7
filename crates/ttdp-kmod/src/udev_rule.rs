//! tt-kmd's udev rule on the host: the rule a version ships (`udev-50-tenstorrent.rules` at the
//! root of its source tree, which tt-kmd's own install copies to
//! `/etc/udev/rules.d/50-tenstorrent.rules`) follows the module ttdp loads, so the device nodes
//! the module creates get the version's mode and links.
//!
//! The rule is kept in the `.ko`'s cache record ([`crate::KoRecord::udev_rule`]), so a cache hit,
//! a rollback and a resumed swap know it without the source. Before every load the installer
//! writes the rule of the version it is about to load (or removes the one it wrote, when that
//! version ships none) and asks udev to reload its rules, so the nodes the load creates get the
//! new mode; after a load that changed the rule it re-triggers the device's events, for nodes
//! that exist already. A file without ttdp's header line is the administrator's: ttdp never
//! overwrites or removes it. Reloading udev is best-effort: a host without udevadm or udevd
//! keeps its rule file in place and loses nothing else.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::KmdVersion;
use crate::KmodError;
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::ko_cache::{CacheLookup, CachedKo};
use crate::source_build::{fetch_source, work_dir};
use crate::timed_command::{log_tail, run_logged};

/// Where tt-kmd keeps its rule in its source tree.
pub const UDEV_RULE_SOURCE: &str = "udev-50-tenstorrent.rules";
/// Host directory of local udev rules.
pub const UDEV_RULES_DIR: &str = "/etc/udev/rules.d";
/// The rule's file name on the host, as tt-kmd's own install names it.
pub const UDEV_RULE_FILE_NAME: &str = "50-tenstorrent.rules";
/// The first line of every rule ttdp writes, followed by the version: how ttdp tells its own
/// file from one an administrator put there.
pub const UDEV_RULE_HEADER: &str = "# installed by ttdp for tt-kmd ";
/// How long one `udevadm` call may take.
const UDEVADM_TIMEOUT: Duration = Duration::from_secs(30);
/// The device subsystem (class) tt-kmd registers its nodes under.
const DEVICE_SUBSYSTEM: &str = "tenstorrent";

/// The udev rule one version of tt-kmd ships.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ShippedUdevRule {
    /// Not known: a prebuilt module (the download is the `.ko` alone) or a cache entry written
    /// before ttdp kept rules. Loading such a version leaves the rules directory as it is.
    #[default]
    Unknown,
    /// The version's source tree has no rule: loading it removes the rule ttdp wrote.
    None,
    /// The rule's text, as the source tree has it.
    Rule(String),
}

impl ShippedUdevRule {
    /// What the source tree at `src` ships: its rule file, or [`ShippedUdevRule::None`].
    pub fn from_source_tree(src: &Path) -> Result<Self, KmodError> {
        let path = src.join(UDEV_RULE_SOURCE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Self::Rule(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::None),
            Err(e) => Err(KmodError::io("read", &path, e)),
        }
    }
}

/// What to do with the rule file before loading a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UdevRuleChange {
    /// The file is already right, is the administrator's, or the version's rule is unknown.
    Keep,
    /// Write this text (ttdp's header, then the version's rule).
    Write(String),
    /// Remove ttdp's rule: the version ships none.
    Remove,
}

/// The text ttdp writes for `version`'s `rule`: its header line, then the rule as shipped.
pub fn rule_file_text(version: &KmdVersion, rule: &str) -> String {
    format!(
        "{UDEV_RULE_HEADER}{version}; replaced or removed on every driver change\n{rule}{}",
        if rule.ends_with('\n') { "" } else { "\n" }
    )
}

/// The tt-kmd version named in ttdp's header of an installed rule file; `None` when the file is
/// not ttdp's.
pub fn installed_by_ttdp(text: &str) -> Option<&str> {
    let rest = text.lines().next()?.strip_prefix(UDEV_RULE_HEADER)?;
    Some(rest.split(';').next().unwrap_or(rest).trim())
}

/// What loading `version`, which ships `shipped`, does to the rule file that reads `installed`
/// (`None`: no file). An administrator's file (no ttdp header) is never touched.
pub fn plan_rule_change(
    version: &KmdVersion,
    shipped: &ShippedUdevRule,
    installed: Option<&str>,
) -> UdevRuleChange {
    if installed.is_some_and(|text| installed_by_ttdp(text).is_none()) {
        return UdevRuleChange::Keep;
    }
    match shipped {
        ShippedUdevRule::Unknown => UdevRuleChange::Keep,
        ShippedUdevRule::None if installed.is_some() => UdevRuleChange::Remove,
        ShippedUdevRule::None => UdevRuleChange::Keep,
        ShippedUdevRule::Rule(rule) => {
            let wanted = rule_file_text(version, rule);
            if installed == Some(wanted.as_str()) {
                UdevRuleChange::Keep
            } else {
                UdevRuleChange::Write(wanted)
            }
        }
    }
}

/// Where the rule goes and how udev is told.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UdevConfig {
    /// The rules directory as this process sees it; `None` is [`UDEV_RULES_DIR`] under the host
    /// root.
    pub rules_dir: Option<PathBuf>,
    /// The `udevadm` to run (a name looked up on `PATH`, or a path); `None` writes the rule
    /// without asking udev to reload (tests, simulated kernels).
    pub udevadm: Option<PathBuf>,
}

/// The rule file on the host, as the node's status shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstalledUdevRule {
    /// Its path on the host (`/etc/udev/rules.d/50-tenstorrent.rules`).
    pub host_path: PathBuf,
    /// The tt-kmd version whose rule ttdp wrote there; `None` for the administrator's own file.
    pub version: Option<String>,
}

impl InstalledUdevRule {
    /// One line for an administrator, e.g. `/etc/udev/rules.d/50-tenstorrent.rules (tt-kmd
    /// 2.0.0)`.
    pub fn summary(&self) -> String {
        match &self.version {
            Some(v) => format!("{} (tt-kmd {v})", self.host_path.display()),
            None => format!("{} (not ttdp's, left as is)", self.host_path.display()),
        }
    }
}

impl<K: Kernel> ModuleInstaller<K> {
    /// The rule file as this process sees it.
    pub fn udev_rule_path(&self) -> PathBuf {
        let dir = match &self.config().udev.rules_dir {
            Some(dir) => dir.clone(),
            None => self.host().path(UDEV_RULES_DIR),
        };
        dir.join(UDEV_RULE_FILE_NAME)
    }

    /// The rule file on the host, if there is one.
    pub fn installed_udev_rule(&self) -> Option<InstalledUdevRule> {
        let text = std::fs::read_to_string(self.udev_rule_path()).ok()?;
        Some(InstalledUdevRule {
            host_path: Path::new(UDEV_RULES_DIR).join(UDEV_RULE_FILE_NAME),
            version: installed_by_ttdp(&text).map(str::to_string),
        })
    }

    /// Puts the rule of the version in `ko` in place before it is loaded, and has udev reload
    /// its rules when the file changed, so the device nodes the load creates get its mode.
    /// `restore` is the file a swap found before it began, used when `ko`'s rule is unknown (a
    /// rollback to such a version puts back what the node had). Returns whether the file
    /// changed. Never fails: the module matters more than its rule, so a rule that cannot be
    /// written or a udev that cannot be told is recorded ([`ModuleInstaller::take_udev_problem`])
    /// and the load goes on.
    pub(crate) fn place_udev_rule(&self, ko: &CachedKo, restore: Option<&Option<String>>) -> bool {
        match self.write_udev_rule(ko, restore) {
            Ok(changed) => {
                if changed {
                    self.run_udevadm(&["control", "--reload-rules"]);
                }
                changed
            }
            Err(e) => {
                self.note_udev_problem(format!("the udev rule was not put in place: {e}"));
                false
            }
        }
    }

    fn write_udev_rule(
        &self,
        ko: &CachedKo,
        restore: Option<&Option<String>>,
    ) -> Result<bool, KmodError> {
        let path = self.udev_rule_path();
        let installed = read_optional(&path)?;
        let version = &ko.record.version;
        let change = match (&ko.record.udev_rule, restore) {
            (ShippedUdevRule::Unknown, Some(before)) => {
                restore_change(installed.as_deref(), before)
            }
            (shipped, _) => plan_rule_change(version, shipped, installed.as_deref()),
        };
        match change {
            UdevRuleChange::Keep => return Ok(false),
            UdevRuleChange::Write(text) => write_rule(&path, &text)?,
            UdevRuleChange::Remove => std::fs::remove_file(&path)
                .or_else(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Ok(()),
                    _ => Err(e),
                })
                .map_err(|e| KmodError::io("remove", &path, e))?,
        }
        Ok(true)
    }

    /// Has udev apply the rules again to the device nodes that exist (after a load that changed
    /// the rule, or a rule put in place for a module already loaded).
    pub(crate) fn retrigger_devices(&self) {
        self.run_udevadm(&[
            "trigger",
            "--action=change",
            &format!("--subsystem-match={DEVICE_SUBSYSTEM}"),
        ]);
    }

    /// ttdp's rule file as a swap finds it before it begins (`None`: no file of ttdp's), to put
    /// back if the swap rolls back to a version whose rule is unknown; the administrator's file
    /// is never touched, so it needs nothing.
    pub(crate) fn udev_rule_before_swap(&self) -> Option<String> {
        read_optional(&self.udev_rule_path())
            .ok()
            .flatten()
            .filter(|text| installed_by_ttdp(text).is_some())
    }

    /// Puts the rule of the loaded `ko` in place when it is missing or stale (a module loaded
    /// before ttdp kept rules, or a file removed by hand), and re-triggers the device's events
    /// so the existing nodes get its mode. Returns whether anything changed; problems are recorded
    /// as in a load ([`ModuleInstaller::take_udev_problem`]).
    pub fn sync_loaded_udev_rule(&self, ko: &CachedKo) -> bool {
        let changed = self.place_udev_rule(ko, None);
        if changed {
            self.retrigger_devices();
        }
        changed
    }

    /// Records the rule `version` ships in its cache entry when the entry does not know it
    /// (cached by a ttdp older than this one) but says which commit of which repository it was
    /// built from: that tag is fetched again, and its rule recorded only when the tag still
    /// points at that commit. Returns whether the record changed; `Ok(false)` for an entry that
    /// knows its rule, a prebuilt one (no commit) or a tag that moved. Never touches the loaded
    /// module.
    pub fn learn_udev_rule(&self, version: &KmdVersion) -> Result<bool, KmodError> {
        let cache = self.cache();
        let _lock = cache.lock_entry(self.release(), version, self.config().cache_lock_timeout)?;
        let CacheLookup::Hit(ko) = cache.lookup(self.release(), version)? else {
            return Ok(false);
        };
        let Some(commit) = ko.record.source_commit.clone() else {
            return Ok(false);
        };
        if ko.record.udev_rule != ShippedUdevRule::Unknown {
            return Ok(false);
        }
        let options = &self.config().build;
        let work = work_dir(options)?;
        let src = work.path().join("tt-kmd");
        let (found, _log) = fetch_source(
            &ko.record.source_repository,
            version,
            &src,
            options.fetch_timeout,
        )?;
        if !found.eq_ignore_ascii_case(&commit) {
            return Ok(false);
        }
        let mut record = ko.record;
        record.udev_rule = ShippedUdevRule::from_source_tree(&src)?;
        cache.write_record(&record)?;
        Ok(true)
    }

    /// The last problem asking udev to reload (no udevadm, no udevd), taken once.
    pub fn take_udev_problem(&self) -> Option<String> {
        self.udev_problem
            .lock()
            .map(|mut problem| problem.take())
            .unwrap_or_default()
    }

    fn run_udevadm(&self, args: &[&str]) {
        let Some(udevadm) = &self.config().udev.udevadm else {
            return;
        };
        let mut command = Command::new(udevadm);
        command.args(args);
        let problem = match run_logged(command, "udevadm", UDEVADM_TIMEOUT) {
            Ok(run) if run.success => return,
            Ok(run) => format!(
                "`udevadm {}` failed ({}): {}",
                args.join(" "),
                run.status,
                log_tail(&run.log, 5)
            ),
            Err(e) => format!("`udevadm {}` could not run: {e}", args.join(" ")),
        };
        self.note_udev_problem(problem);
    }

    fn note_udev_problem(&self, problem: String) {
        if let Ok(mut slot) = self.udev_problem.lock() {
            *slot = Some(problem);
        }
    }
}

/// The change that puts the file back to `before` (ttdp's text, or no ttdp file); an
/// administrator's file stays.
fn restore_change(installed: Option<&str>, before: &Option<String>) -> UdevRuleChange {
    if installed.is_some_and(|text| installed_by_ttdp(text).is_none()) {
        return UdevRuleChange::Keep;
    }
    match (before, installed) {
        (Some(text), Some(now)) if text == now => UdevRuleChange::Keep,
        (Some(text), _) => UdevRuleChange::Write(text.clone()),
        (None, Some(_)) => UdevRuleChange::Remove,
        (None, None) => UdevRuleChange::Keep,
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, KmodError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(KmodError::io("read", path, e)),
    }
}

/// Writes the rule atomically, world-readable as udev's rule files are.
fn write_rule(path: &Path, text: &str) -> Result<(), KmodError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(|e| KmodError::io("create", dir, e))?;
    let mut tmp = tempfile::Builder::new()
        // udev reads only files ending in .rules: a temporary file is never taken for a rule
        .prefix(".ttdp-rule.")
        .tempfile_in(dir)
        .map_err(|e| KmodError::io("create a temporary file in", dir, e))?;
    tmp.write_all(text.as_bytes())
        .and_then(|()| {
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(0o644))
        })
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| KmodError::io("write", tmp.path(), e))?;
    tmp.persist(path)
        .map_err(|e| KmodError::io("rename into", path, e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> KmdVersion {
        s.parse().unwrap()
    }

    const RULE: &str = "KERNEL==\"tenstorrent*\", MODE=\"0666\", SYMLINK+=\"tenstorrent-%n\"\n";

    #[test]
    fn a_shipped_rule_is_written_with_the_header_naming_its_version() {
        let shipped = ShippedUdevRule::Rule(RULE.into());
        let UdevRuleChange::Write(text) = plan_rule_change(&v("2.0.0"), &shipped, None) else {
            panic!("expected a write");
        };
        assert!(text.ends_with(RULE));
        assert_eq!(installed_by_ttdp(&text), Some("2.0.0"));
        assert_eq!(
            plan_rule_change(&v("2.0.0"), &shipped, Some(&text)),
            UdevRuleChange::Keep,
            "the right file is left alone"
        );
    }

    #[test]
    fn another_versions_rule_is_replaced_even_with_the_same_text() {
        let shipped = ShippedUdevRule::Rule(RULE.into());
        let old = rule_file_text(&v("1.0.0"), RULE);
        assert_eq!(
            plan_rule_change(&v("2.0.0"), &shipped, Some(&old)),
            UdevRuleChange::Write(rule_file_text(&v("2.0.0"), RULE))
        );
    }

    #[test]
    fn a_version_without_a_rule_removes_ttdps_and_keeps_the_admins() {
        let ours = rule_file_text(&v("1.0.0"), RULE);
        assert_eq!(
            plan_rule_change(&v("2.0.0"), &ShippedUdevRule::None, Some(&ours)),
            UdevRuleChange::Remove
        );
        assert_eq!(
            plan_rule_change(&v("2.0.0"), &ShippedUdevRule::None, None),
            UdevRuleChange::Keep
        );
        assert_eq!(
            plan_rule_change(&v("2.0.0"), &ShippedUdevRule::None, Some(RULE)),
            UdevRuleChange::Keep,
            "a file without ttdp's header is the administrator's"
        );
    }

    #[test]
    fn the_admins_file_is_never_overwritten() {
        let shipped = ShippedUdevRule::Rule(RULE.into());
        let admins = "KERNEL==\"tenstorrent*\", MODE=\"0660\", GROUP=\"tt\"\n";
        assert_eq!(
            plan_rule_change(&v("2.0.0"), &shipped, Some(admins)),
            UdevRuleChange::Keep
        );
    }

    #[test]
    fn an_unknown_rule_leaves_the_file_as_it_is() {
        let ours = rule_file_text(&v("1.0.0"), RULE);
        for installed in [None, Some(ours.as_str())] {
            assert_eq!(
                plan_rule_change(&v("2.0.0"), &ShippedUdevRule::Unknown, installed),
                UdevRuleChange::Keep
            );
        }
    }

    #[test]
    fn a_restore_puts_back_what_the_swap_found() {
        let before = rule_file_text(&v("1.0.0"), RULE);
        let after = rule_file_text(&v("2.0.0"), "KERNEL==\"tenstorrent*\", MODE=\"0600\"\n");
        assert_eq!(
            restore_change(Some(&after), &Some(before.clone())),
            UdevRuleChange::Write(before.clone())
        );
        assert_eq!(restore_change(Some(&after), &None), UdevRuleChange::Remove);
        assert_eq!(
            restore_change(Some(&before), &Some(before.clone())),
            UdevRuleChange::Keep
        );
        assert_eq!(restore_change(Some(RULE), &None), UdevRuleChange::Keep);
    }

    #[test]
    fn the_header_is_read_back_and_a_plain_file_is_not_ttdps() {
        assert_eq!(
            installed_by_ttdp(&rule_file_text(&v("2.8.0"), "x")),
            Some("2.8.0")
        );
        assert_eq!(installed_by_ttdp(RULE), None);
        assert_eq!(installed_by_ttdp(""), None);
    }

    #[test]
    fn a_source_tree_ships_its_rule_file_or_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            ShippedUdevRule::from_source_tree(dir.path()).unwrap(),
            ShippedUdevRule::None
        );
        std::fs::write(dir.path().join(UDEV_RULE_SOURCE), RULE).unwrap();
        assert_eq!(
            ShippedUdevRule::from_source_tree(dir.path()).unwrap(),
            ShippedUdevRule::Rule(RULE.into())
        );
    }

    #[test]
    fn an_old_record_without_the_field_reads_as_unknown() {
        #[derive(serde::Deserialize)]
        struct Record {
            #[serde(default)]
            rule: ShippedUdevRule,
        }
        let r: Record = serde_json::from_str("{}").unwrap();
        assert_eq!(r.rule, ShippedUdevRule::Unknown);
        let none: ShippedUdevRule = serde_json::from_str("\"none\"").unwrap();
        assert_eq!(none, ShippedUdevRule::None);
        let rule: ShippedUdevRule = serde_json::from_str(r#"{"rule":"x"}"#).unwrap();
        assert_eq!(rule, ShippedUdevRule::Rule("x".into()));
    }
}
