//! Who signed the module that is loaded: recorded when ttdp loads it, because the cache entry it
//! was loaded from may be re-signed afterwards (a new key in `spec.module.signing`) without the
//! module being reloaded, and the kernel does not say which key a loaded module carried.
//!
//! The record is `<lock dir>/<module>.signer` (on the host's `/run/ttdp`, a tmpfs a reboot
//! clears together with the module): the loaded module's `srcversion` as sysfs showed it right
//! after the load, then the signer's name (empty: unsigned).

use std::path::{Path, PathBuf};

use crate::KmodError;
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::ko_cache::write_atomically;
use crate::module_signature::appended_signature;
use crate::status::ModuleStatus;

/// What the record says of the loaded module: its srcversion and signer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SignerRecord {
    srcversion: Option<String>,
    signer: Option<String>,
}

impl SignerRecord {
    fn parse(text: &str) -> Self {
        let mut lines = text.lines().map(str::trim);
        let mut next = || lines.next().filter(|l| !l.is_empty()).map(str::to_owned);
        Self {
            srcversion: next(),
            signer: next(),
        }
    }

    fn text(&self) -> String {
        format!(
            "{}\n{}\n",
            self.srcversion.as_deref().unwrap_or_default(),
            self.signer.as_deref().unwrap_or_default()
        )
    }
}

/// The signer named by the signature appended to the module file at `path`; `None` when it is
/// unsigned or its signature cannot be read.
fn file_signer(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    appended_signature(&bytes)
        .ok()
        .flatten()
        .map(|s| s.signer.name)
}

impl<K: Kernel> ModuleInstaller<K> {
    /// The record of who signed the module ttdp loaded: `<lock dir>/<module>.signer`.
    pub fn signer_record_path(&self) -> PathBuf {
        let lock = self.module_lock_path();
        let dir = lock.parent().unwrap_or(Path::new("/"));
        dir.join(format!("{}.signer", self.config().module))
    }

    /// Records the signer of the module file at `path`, just loaded.
    pub(crate) fn record_loaded_signer(&self, path: &Path) -> Result<(), KmodError> {
        let sysfs = self
            .host()
            .path(format!("/sys/module/{}/srcversion", self.config().module));
        let record = SignerRecord {
            srcversion: std::fs::read_to_string(sysfs)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty()),
            signer: file_signer(path),
        };
        let target = self.signer_record_path();
        let dir = target.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(dir).map_err(|e| KmodError::io("create", dir, e))?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        write_atomically(dir, &name, record.text().as_bytes())
    }

    /// The signer of the loaded module, `None` when unsigned or unknown: as recorded at its
    /// load when the record is about the module loaded now (same srcversion), else, for a
    /// module loaded without a record (by an older agent), its cache entry's signer when the
    /// entry is that build.
    pub(crate) fn loaded_signer(&self, status: &ModuleStatus) -> Option<String> {
        status.loaded_version()?;
        let recorded = std::fs::read_to_string(self.signer_record_path())
            .ok()
            .map(|text| SignerRecord::parse(&text))
            .filter(|r| r.srcversion == status.srcversion);
        match recorded {
            Some(record) => record.signer,
            None => self.cache_entry_signer(status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_reads_back_what_was_written() {
        for record in [
            SignerRecord {
                srcversion: Some("4F2C1A".into()),
                signer: Some("tt-kmd fleet key".into()),
            },
            SignerRecord {
                srcversion: None,
                signer: None,
            },
            SignerRecord {
                srcversion: Some("4F2C1A".into()),
                signer: None,
            },
        ] {
            assert_eq!(SignerRecord::parse(&record.text()), record);
        }
    }
}
