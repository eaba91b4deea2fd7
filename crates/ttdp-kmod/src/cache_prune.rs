//! Pruning the `.ko` cache: entries of kernels no longer installed go, and the cache is kept
//! under a size limit. [`prune_plan`] decides (pure); [`ModuleInstaller::prune_cache`] looks at
//! the cache and the node, and removes what the plan names.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use crate::KmdVersion;
use crate::KmodError;
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::status::loaded_version;

/// One cache entry as pruning sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// The kernel release it is for.
    pub release: String,
    /// The tt-kmd version.
    pub version: KmdVersion,
    /// Its size on disk.
    pub bytes: u64,
    /// When its `.ko` was written (`None`: unknown, taken as oldest).
    pub written: Option<SystemTime>,
}

/// What must stay, and how much the cache may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneRules {
    /// The running kernel: its entries go only for the size limit, and never its target or
    /// loaded version's.
    pub running: String,
    /// The version loaded now, the running kernel's rollback path (`None`: nothing loaded).
    pub loaded: Option<KmdVersion>,
    /// The version the node should run: no installed kernel's entry of it goes.
    pub target: KmdVersion,
    /// Every kernel installed on the host (the running one may be among them).
    pub installed: BTreeSet<String>,
    /// The most the cache may hold, in bytes.
    pub limit_bytes: u64,
}

/// Why an entry is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneReason {
    /// Its kernel is no longer installed (and is not running).
    KernelRemoved,
    /// The cache was over its size limit and this was among the oldest entries that may go.
    OverSizeLimit,
}

/// One entry to remove, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunedEntry {
    /// The entry.
    pub entry: CacheEntry,
    /// Why it goes.
    pub reason: PruneReason,
}

impl PruneRules {
    /// Whether `entry` must never go: the running kernel's target or loaded version, or the
    /// target of an installed kernel (the node would boot without its driver).
    fn keeps(&self, entry: &CacheEntry) -> bool {
        let running = entry.release == self.running;
        (running && self.loaded.as_ref() == Some(&entry.version))
            || ((running || self.installed.contains(&entry.release))
                && entry.version == self.target)
    }

    fn kernel_gone(&self, entry: &CacheEntry) -> bool {
        entry.release != self.running && !self.installed.contains(&entry.release)
    }
}

/// The entries to remove from `entries` under `rules`: every entry of a kernel neither running
/// nor installed, then, while the rest is over the size limit, the oldest entries that may go
/// (never one [`PruneRules`] keeps: when those alone are over the limit, the cache stays over
/// it).
pub fn prune_plan(entries: &[CacheEntry], rules: &PruneRules) -> Vec<PrunedEntry> {
    let (gone, mut rest): (Vec<&CacheEntry>, Vec<&CacheEntry>) =
        entries.iter().partition(|e| rules.kernel_gone(e));
    let mut plan: Vec<PrunedEntry> = gone
        .into_iter()
        .map(|entry| PrunedEntry {
            entry: entry.clone(),
            reason: PruneReason::KernelRemoved,
        })
        .collect();
    let mut total: u64 = rest.iter().map(|e| e.bytes).sum();
    rest.retain(|e| !rules.keeps(e));
    rest.sort_by(|a, b| {
        (a.written, &a.release, &a.version).cmp(&(b.written, &b.release, &b.version))
    });
    for entry in rest {
        if total <= rules.limit_bytes {
            break;
        }
        total = total.saturating_sub(entry.bytes);
        plan.push(PrunedEntry {
            entry: entry.clone(),
            reason: PruneReason::OverSizeLimit,
        });
    }
    plan
}

impl<K: Kernel> ModuleInstaller<K> {
    /// Every entry in the cache, for [`prune_plan`].
    pub fn cache_entries(&self) -> Vec<CacheEntry> {
        let cache = self.cache();
        cache
            .releases()
            .into_iter()
            .flat_map(|release| {
                cache
                    .versions(&release)
                    .into_iter()
                    .map(move |version| (release.clone(), version))
            })
            .map(|(release, version)| CacheEntry {
                bytes: cache.entry_bytes(&release, &version),
                written: cache.entry_written(&release, &version),
                release,
                version,
            })
            .collect()
    }

    /// Removes the entries of kernels not in `installed` (and not running), then the oldest
    /// entries while the cache is over `limit_bytes`, never the running kernel's entry of
    /// `target` or of the loaded version, nor an installed kernel's entry of `target` (see
    /// [`prune_plan`]). Decided under the module lock, so no swap is under way and the loaded
    /// version is its rollback path; `Ok(None)` when another installer holds that lock (try
    /// again later). An entry being built or read under its own lock is skipped. Returns what
    /// was removed. Never touches the loaded module.
    pub fn prune_cache(
        &self,
        target: &KmdVersion,
        installed: &BTreeSet<String>,
        limit_bytes: u64,
    ) -> Result<Option<Vec<PrunedEntry>>, KmodError> {
        let Some(_module_lock) = self.try_lock_module()? else {
            return Ok(None);
        };
        // sysfs alone: the holders do not matter here
        let loaded = loaded_version(self.host(), &self.config().module)?
            .and_then(|v| v.parse::<KmdVersion>().ok());
        let rules = PruneRules {
            running: self.release().to_string(),
            loaded,
            target: target.clone(),
            installed: installed.clone(),
            limit_bytes,
        };
        let mut removed = Vec::new();
        for pruned in prune_plan(&self.cache_entries(), &rules) {
            let (release, version) = (&pruned.entry.release, &pruned.entry.version);
            let Ok(_entry_lock) = self.cache().lock_entry(release, version, Duration::ZERO) else {
                continue;
            };
            self.cache().remove_entry(release, version)?;
            removed.push(pruned);
        }
        Ok(Some(removed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> KmdVersion {
        text.parse().unwrap()
    }

    fn entry(release: &str, version: &str, bytes: u64, age_s: u64) -> CacheEntry {
        CacheEntry {
            release: release.into(),
            version: v(version),
            bytes,
            written: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - age_s)),
        }
    }

    fn rules(installed: &[&str], limit_bytes: u64) -> PruneRules {
        PruneRules {
            running: "6.1.0-57-amd64".into(),
            loaded: Some(v("2.7.0")),
            target: v("2.8.0"),
            installed: installed.iter().map(|s| s.to_string()).collect(),
            limit_bytes,
        }
    }

    fn removed(plan: &[PrunedEntry]) -> Vec<(String, String, PruneReason)> {
        plan.iter()
            .map(|p| {
                (
                    p.entry.release.clone(),
                    p.entry.version.to_string(),
                    p.reason,
                )
            })
            .collect()
    }

    #[test]
    fn entries_of_removed_kernels_go_and_the_running_kernel_stays() {
        let entries = [
            entry("6.1.0-57-amd64", "2.8.0", 10, 5),
            entry("6.1.0-57-amd64", "2.7.0", 10, 50),
            entry("6.1.0-58-amd64", "2.8.0", 10, 5),
            entry("6.1.0-31-amd64", "2.8.0", 10, 500),
            entry("6.1.0-31-amd64", "2.7.0", 10, 600),
        ];
        // the running kernel is not listed as installed (its headers went): it stays all the same
        let plan = prune_plan(&entries, &rules(&["6.1.0-58-amd64"], u64::MAX));
        assert_eq!(
            removed(&plan),
            vec![
                (
                    "6.1.0-31-amd64".into(),
                    "2.8.0".into(),
                    PruneReason::KernelRemoved
                ),
                (
                    "6.1.0-31-amd64".into(),
                    "2.7.0".into(),
                    PruneReason::KernelRemoved
                ),
            ]
        );
    }

    #[test]
    fn over_the_limit_the_oldest_entries_that_may_go_go_first() {
        let entries = [
            entry("6.1.0-57-amd64", "2.8.0", 100, 1),
            entry("6.1.0-57-amd64", "2.7.0", 100, 900),
            entry("6.1.0-57-amd64", "2.5.0", 100, 800),
            entry("6.1.0-57-amd64", "2.6.0", 100, 700),
            entry("6.1.0-58-amd64", "2.8.0", 100, 1000),
            entry("6.1.0-58-amd64", "2.6.0", 100, 10),
        ];
        let installed = ["6.1.0-57-amd64", "6.1.0-58-amd64"];
        // 600 bytes, limit 350: 2.5.0 (oldest that may go), then 2.6.0 on 57, then 2.6.0 on 58
        let plan = prune_plan(&entries, &rules(&installed, 350));
        assert_eq!(
            removed(&plan),
            vec![
                (
                    "6.1.0-57-amd64".into(),
                    "2.5.0".into(),
                    PruneReason::OverSizeLimit
                ),
                (
                    "6.1.0-57-amd64".into(),
                    "2.6.0".into(),
                    PruneReason::OverSizeLimit
                ),
                (
                    "6.1.0-58-amd64".into(),
                    "2.6.0".into(),
                    PruneReason::OverSizeLimit
                ),
            ]
        );
        // what is kept alone is over the limit: the rest goes, the kept entries stay
        let plan = prune_plan(&entries, &rules(&installed, 0));
        assert_eq!(plan.len(), 3);
        assert!(plan.iter().all(|p| !rules(&installed, 0).keeps(&p.entry)));
        // under the limit nothing goes
        assert!(prune_plan(&entries, &rules(&installed, 600)).is_empty());
    }

    #[test]
    fn removed_kernels_count_before_the_limit_is_checked() {
        let entries = [
            entry("6.1.0-57-amd64", "2.6.0", 100, 10),
            entry("6.1.0-31-amd64", "2.8.0", 300, 5),
        ];
        let plan = prune_plan(&entries, &rules(&[], 100));
        assert_eq!(
            removed(&plan),
            vec![(
                "6.1.0-31-amd64".into(),
                "2.8.0".into(),
                PruneReason::KernelRemoved
            )]
        );
    }

    proptest::proptest! {
        /// Whatever the cache holds: kept entries never go, removed kernels' entries always
        /// go, and the rest is under the limit unless only kept entries are left.
        #[test]
        fn the_plan_keeps_what_must_stay_and_meets_the_limit(
            raw in proptest::collection::vec((0u8..4, 0u8..4, 1u64..100, 0u64..50), 0..12),
            installed_mask in 0u8..16,
            loaded in proptest::option::of(0u8..4),
            limit_bytes in 0u64..400,
        ) {
            let release = |i: u8| format!("6.1.0-{}-amd64", 50 + i);
            let version = |i: u8| v(&format!("2.{i}.0"));
            let mut seen = BTreeSet::new();
            let entries: Vec<CacheEntry> = raw
                .iter()
                .filter(|(r, ver, _, _)| seen.insert((*r, *ver)))
                .map(|(r, ver, bytes, age)| CacheEntry {
                    release: release(*r),
                    version: version(*ver),
                    bytes: *bytes,
                    written: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(*age)),
                })
                .collect();
            let rules = PruneRules {
                running: release(0),
                loaded: loaded.map(version),
                target: version(1),
                installed: (0u8..4).filter(|i| installed_mask & (1u8 << *i) != 0).map(release).collect(),
                limit_bytes,
            };
            let plan = prune_plan(&entries, &rules);
            let removed: Vec<&CacheEntry> = plan.iter().map(|p| &p.entry).collect();
            for entry in &entries {
                let gone = removed.contains(&entry);
                proptest::prop_assert!(!(gone && rules.keeps(entry)), "kept entry removed: {entry:?}");
                if rules.kernel_gone(entry) {
                    proptest::prop_assert!(gone, "entry of a removed kernel stayed: {entry:?}");
                }
            }
            let left: Vec<&CacheEntry> = entries.iter().filter(|e| !removed.contains(e)).collect();
            let total: u64 = left.iter().map(|e| e.bytes).sum();
            proptest::prop_assert!(
                total <= rules.limit_bytes || left.iter().all(|e| rules.keeps(e)),
                "over the limit with removable entries left"
            );
            proptest::prop_assert_eq!(removed.len(), plan.len());
        }
    }
}
