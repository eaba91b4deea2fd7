//! Signed cache entries: with a signing key ([`ModuleInstaller::with_signing`]) every module is
//! signed before it is cached (a build) or re-signed in place under the cache lock (a download,
//! or an entry signed by another key or not at all), and, where the kernel only loads signed
//! modules, a signer the kernel does not list is refused before anything is unloaded.

use std::path::PathBuf;

use sha2::{Digest, Sha256};
use ttdp_hostprobe::{SigningFacts, kernel_keys};

use crate::KmdVersion;
use crate::KmodError;
use crate::installer::ModuleInstaller;
use crate::kernel::Kernel;
use crate::ko_cache::{CachedKo, KoRecord, TEMPORARY_PREFIX, remove_if_present, write_atomically};
use crate::module_signature::ModuleSigner;
use crate::module_signing::{RecordedSignature, SigningConfig, SigningKey, find_sign_file};
use crate::source_build::BuiltModule;
use crate::status::ModuleStatus;
use crate::test_hook::{RESIGN_COPY_SIGNED, RESIGN_KO_REPLACED, RESIGN_RECORD_REMOVED, checkpoint};
use crate::{KO_FILE_NAME, RECORD_FILE_NAME};

impl<K: Kernel> ModuleInstaller<K> {
    /// This installer, signing every module it caches with the key of `signing` (see
    /// [`crate::module_signing`]). The key is opened at each use, so a Secret mounted after the
    /// start is picked up, and one that is missing fails only what needs it.
    pub fn with_signing(mut self, signing: SigningConfig) -> Self {
        self.signing = Some(signing);
        self
    }

    /// The signing key's location, when modules are signed.
    pub fn signing(&self) -> Option<&SigningConfig> {
        self.signing.as_ref()
    }

    /// The signing key, opened now; `None` without signing.
    fn signing_key(&self) -> Result<Option<SigningKey>, KmodError> {
        self.signing.as_ref().map(SigningKey::open).transpose()
    }

    /// Fails with [`KmodError::SigningKeyUnusable`] when signing is asked for and the key
    /// cannot be used.
    pub(crate) fn require_signing_key(&self) -> Result<(), KmodError> {
        self.signing_key().map(|_| ())
    }

    fn sign_file(&self) -> Result<PathBuf, KmodError> {
        find_sign_file(
            self.host(),
            self.config().build.build_dir.as_deref(),
            self.release(),
        )
    }

    /// Signs a freshly built module where it was built, before it is cached.
    pub(crate) fn sign_built(&self, built: &BuiltModule) -> Result<(), KmodError> {
        if let Some(key) = self.signing_key()? {
            key.sign(&self.sign_file()?, &built.ko_path)?;
        }
        Ok(())
    }

    /// Whether the cache entry `ko` may be used as it is: no signing is asked for, or it is
    /// signed by the key. A key that cannot be opened says no (the full path reports why).
    pub(crate) fn signed_as_wanted(&self, ko: &CachedKo) -> bool {
        match self.signing_key() {
            Ok(None) => true,
            Ok(Some(key)) => std::fs::read(&ko.path).is_ok_and(|b| key.mismatch(&b).is_none()),
            Err(_) => false,
        }
    }

    /// The cache entry `ko`, signed by the key: as it is when it already is (or no signing is
    /// asked for), else re-signed in place, its old signature stripped, with why. Callers hold
    /// the cache lock.
    pub(crate) fn signed_entry(
        &self,
        ko: CachedKo,
    ) -> Result<(CachedKo, Option<String>), KmodError> {
        let Some(key) = self.signing_key()? else {
            return Ok((ko, None));
        };
        let bytes = std::fs::read(&ko.path).map_err(|e| KmodError::io("read", &ko.path, e))?;
        let Some(why) = key.mismatch(&bytes) else {
            return Ok((ko, None));
        };
        let resigned = self.resign_entry(&key, &ko)?;
        Ok((resigned, Some(format!("{why}: re-signed"))))
    }

    /// Signs a copy of the entry's `.ko` next to it, then puts the copy and a record naming the
    /// new signer in place (the old record removed first, so it never describes the new file).
    fn resign_entry(&self, key: &SigningKey, ko: &CachedKo) -> Result<CachedKo, KmodError> {
        let dir = ko
            .path
            .parent()
            .ok_or_else(|| KmodError::io("re-sign", &ko.path, std::io::ErrorKind::NotFound.into()))?
            .to_path_buf();
        let copy = tempfile::Builder::new()
            .prefix(&format!("{TEMPORARY_PREFIX}resign."))
            .tempfile_in(&dir)
            .map_err(|e| KmodError::io("create a temporary file in", &dir, e))?;
        std::fs::copy(&ko.path, copy.path()).map_err(|e| KmodError::io("copy", &ko.path, e))?;
        let signer = key.sign(&self.sign_file()?, copy.path())?;
        let bytes =
            std::fs::read(copy.path()).map_err(|e| KmodError::io("read", copy.path(), e))?;
        let record = resigned_record(&ko.record, &bytes, signer);
        checkpoint(RESIGN_COPY_SIGNED);
        remove_if_present(&dir.join(RECORD_FILE_NAME))?;
        checkpoint(RESIGN_RECORD_REMOVED);
        write_atomically(&dir, KO_FILE_NAME, &bytes)?;
        checkpoint(RESIGN_KO_REPLACED);
        self.cache().write_record(&record)?;
        Ok(CachedKo {
            path: dir.join(KO_FILE_NAME),
            record,
        })
    }

    /// Fails with [`KmodError::SignerNotTrusted`] when the kernel enforces signatures, `signer`
    /// signed the module with the policy's own certificate, and the kernel's key list, which
    /// shows its trusted keyrings, holds no key of that certificate. Whether the kernel trusts
    /// any other signer is not known before the load: the load's refusal answers, and the
    /// swap's rollback loads the previous module back.
    pub(crate) fn check_signer_trusted(
        &self,
        ko: &CachedKo,
        signer: &ModuleSigner,
        facts: &SigningFacts,
        enforcement: &str,
    ) -> Result<(), KmodError> {
        if facts.unsigned_modules_load() {
            return Ok(());
        }
        let Ok(Some(key)) = self.signing_key() else {
            return Ok(());
        };
        if !signer.is(key.cert()) {
            return Ok(());
        }
        let kernel_key_id = &key.cert().kernel_key_id;
        match kernel_keys(self.host()) {
            Some(keys) if keys.shows_trusted_keyrings() && !keys.holds_key_id(kernel_key_id) => {
                Err(KmodError::SignerNotTrusted {
                    module: self.config().module.clone(),
                    version: ko.record.version.to_string(),
                    signer: format!("{} (key {})", signer.name, signer.key),
                    distrust: format!(
                        "kernel {} does not trust ({enforcement}; no key {kernel_key_id} among the keys it lists)",
                        self.release()
                    ),
                })
            }
            _ => Ok(()),
        }
    }
}

impl<K: Kernel> ModuleInstaller<K> {
    /// The signer of the loaded module's cache entry (its record, when its srcversion is the
    /// loaded one's), `None` when unsigned or unknown. The entry may have been re-signed since
    /// the load: [`ModuleInstaller::loaded_signer`] prefers what was recorded at the load.
    pub(crate) fn cache_entry_signer(&self, status: &ModuleStatus) -> Option<String> {
        let version: KmdVersion = status.loaded_version()?.parse().ok()?;
        self.cache()
            .record(self.release(), &version)
            .filter(|r| r.srcversion.is_none() || r.srcversion == status.srcversion)
            .and_then(|r| r.signature)
            .map(|s| s.signer)
    }
}

/// `old` describing the re-signed `bytes`: the new checksum and signer, and the checksum the
/// file had before ttdp first signed it.
fn resigned_record(old: &KoRecord, bytes: &[u8], signer: ModuleSigner) -> KoRecord {
    let first_sha256 = old
        .signature
        .as_ref()
        .and_then(|s| s.signed_from_sha256.clone())
        .unwrap_or_else(|| old.sha256.clone());
    KoRecord {
        sha256: hex::encode(Sha256::digest(bytes)),
        signature: Some(RecordedSignature {
            signer: signer.name,
            key: signer.key,
            signed_from_sha256: Some(first_sha256),
        }),
        ..old.clone()
    }
}
