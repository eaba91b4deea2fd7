//! The swap journal: what a swap writes down before it unloads a working module, so that a
//! process killed half-way (between the unload and the load, or during a validation rollback)
//! leaves behind which driver the node had and which one was coming.
//!
//! It is one JSON file beside the module lock (`<lock dir>/<module>.swap`, on the host's
//! `/run/ttdp`), written atomically under the module lock before the unload and removed once the
//! swap is settled (a module is loaded again). `/run` is a tmpfs: a reboot, which unloads the
//! module anyway, clears it. Reading it back is [`crate::ModuleInstaller::resume_swap`].

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::KmodError;
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::status::{ModuleStatus, is_loaded};

/// Where an interrupted swap was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SwapPhase {
    /// Replacing the previous module by the target.
    Replacing,
    /// The target failed its post-load validation: loading the previous module back.
    RollingBack,
}

/// One swap in progress, as written before its unload.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapJournal {
    /// The version loaded before the swap (sysfs), `None` when it declared none.
    pub previous: Option<String>,
    /// The parameters the previous module was loaded with (ttdp's record; empty without one).
    pub previous_parameters: String,
    /// The verified cache entry of the previous version, when there is one (informative: it is
    /// looked up and verified again before it is loaded back).
    pub previous_ko: Option<PathBuf>,
    /// The version being installed.
    pub target: String,
    /// The parameters it is loaded with.
    pub target_parameters: String,
    /// Where the swap is.
    pub phase: SwapPhase,
    /// The process swapping.
    pub pid: u32,
    /// When the swap began to unload.
    pub started_at: jiff::Timestamp,
    /// ttdp's udev rule file as the swap found it (`None`: there was none), put back when the
    /// swap rolls back to a version whose rule is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_udev_rule: Option<String>,
}

impl SwapJournal {
    /// The module's status as it was before the swap, as far as the journal knows it: what
    /// the rollback rules of a swap look at.
    pub(crate) fn status_before(&self, module: &str) -> ModuleStatus {
        ModuleStatus {
            name: module.to_string(),
            loaded: true,
            version: self.previous.clone(),
            srcversion: None,
            refcnt: None,
            initstate: Some("live".into()),
            module_holders: Vec::new(),
            device_holders: Vec::new(),
            parameters: Default::default(),
            applied_parameters: Some(self.previous_parameters.clone()),
            source_commit: None,
            udev_rule: None,
            signer: None,
        }
    }
}

impl<K: Kernel> ModuleInstaller<K> {
    /// The swap journal: `<lock dir>/<module>.swap`.
    pub fn swap_journal_path(&self) -> PathBuf {
        let lock = self.module_lock_path();
        let dir = lock.parent().unwrap_or(Path::new("/"));
        dir.join(format!("{}.swap", self.config().module))
    }

    /// The journal of a swap that has not settled, `None` when there is none. A swap running in
    /// another process has one too: only a caller holding the module lock knows it was left by
    /// a process that stopped.
    pub fn swap_journal(&self) -> Result<Option<SwapJournal>, KmodError> {
        let path = self.swap_journal_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(KmodError::io("read", &path, e)),
        };
        serde_json::from_str(&text).map(Some).map_err(|e| {
            KmodError::io(
                "parse",
                &path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })
    }

    /// Writes `journal` atomically (a synced temporary file renamed over the journal).
    pub(crate) fn write_swap_journal(&self, journal: &SwapJournal) -> Result<(), KmodError> {
        let path = self.swap_journal_path();
        let dir = path.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(dir).map_err(|e| KmodError::io("create", dir, e))?;
        let text = serde_json::to_vec_pretty(journal).map_err(|e| {
            KmodError::io(
                "serialize",
                &path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".swap-journal.")
            .tempfile_in(dir)
            .map_err(|e| KmodError::io("create a temporary file in", dir, e))?;
        tmp.write_all(&text)
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|e| KmodError::io("write", tmp.path(), e))?;
        tmp.persist(&path)
            .map_err(|e| KmodError::io("rename into", &path, e.error))?;
        Ok(())
    }

    /// The journal of a swap of `status` (loaded now) to `target` with `params`.
    pub(crate) fn journal_for(
        &self,
        status: &ModuleStatus,
        target: &str,
        params: &str,
    ) -> SwapJournal {
        let previous_ko = status
            .loaded_version()
            .and_then(|v| v.parse().ok())
            .and_then(|v| match self.cache().lookup(self.release(), &v) {
                Ok(crate::CacheLookup::Hit(ko)) => Some(ko.path),
                _ => None,
            });
        SwapJournal {
            previous: status.version.clone(),
            previous_parameters: status.applied_parameters.clone().unwrap_or_default(),
            previous_ko,
            target: target.to_string(),
            target_parameters: params.to_string(),
            phase: SwapPhase::Replacing,
            pid: std::process::id(),
            started_at: jiff::Timestamp::now(),
            previous_udev_rule: self.udev_rule_before_swap(),
        }
    }

    /// Marks the journal's swap as rolling back (when there is a journal).
    pub(crate) fn journal_rolling_back(&self) -> Result<(), KmodError> {
        match self.swap_journal()? {
            Some(mut journal) => {
                journal.phase = SwapPhase::RollingBack;
                self.write_swap_journal(&journal)
            }
            None => Ok(()),
        }
    }

    /// Removes the journal once a module is loaded again: the swap is settled whatever its
    /// outcome. With no module loaded it stays, for the next attempt to find.
    pub(crate) fn settle_swap_journal(&self) -> Result<(), KmodError> {
        if !is_loaded(self.host(), &self.config().module)? {
            return Ok(());
        }
        let path = self.swap_journal_path();
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(KmodError::io("remove", &path, e))
            }
            _ => Ok(()),
        }
    }
}
