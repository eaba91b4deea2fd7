//! Signing modules with the kernel's own `sign-file` (sha256) and a key the caller names, so a
//! host that only loads signed modules (Secure Boot, `module.sig_enforce=1`) can load what was
//! built for it.
//!
//! The private key is never read or copied here: `sign-file` is given its path (in a pod, the
//! Secret volume's file on a tmpfs). Only the certificate is read, to know which signature is
//! ours. A module already signed by another key has that signature stripped first, so the file
//! carries exactly one: ours.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ttdp_hostprobe::HostRoot;

use crate::KmodError;
use crate::module_signature::{CertificateId, ModuleSigner, appended_signature, unsigned_content};
use crate::timed_command::run_logged;

/// The digest `sign-file` signs with.
pub const SIGNING_HASH: &str = "sha256";
/// How long `sign-file` may run.
const SIGN_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the signing key and its certificate are, as paths this process sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningConfig {
    /// The private key (PEM), handed to `sign-file` by path and never read here.
    pub key: PathBuf,
    /// The X.509 certificate (PEM or DER) of that key.
    pub cert: PathBuf,
    /// Where the pair comes from, for messages (e.g. `Secret ttdp-system/tt-kmd-signing`).
    pub source: String,
}

/// A signing key whose certificate was read: ready to sign.
#[derive(Debug, Clone)]
pub struct SigningKey {
    config: SigningConfig,
    cert: CertificateId,
}

impl SigningKey {
    /// Reads the certificate and checks that the key file is there, failing with
    /// [`KmodError::SigningKeyUnusable`] saying which and why.
    pub fn open(config: &SigningConfig) -> Result<Self, KmodError> {
        let unusable = |problem: String| KmodError::SigningKeyUnusable {
            source_name: config.source.clone(),
            problem,
        };
        let bytes = std::fs::read(&config.cert).map_err(|e| {
            unusable(format!(
                "cannot read the certificate {}: {e}",
                config.cert.display()
            ))
        })?;
        let cert = CertificateId::parse(&bytes).map_err(|e| {
            unusable(format!(
                "{} is not an X.509 certificate: {e}",
                config.cert.display()
            ))
        })?;
        // the key is opened by sign-file alone; here only that it is there and a file
        match std::fs::metadata(&config.key) {
            Ok(meta) if meta.is_file() && meta.len() > 0 => {}
            Ok(_) => {
                return Err(unusable(format!(
                    "the private key {} is empty or not a file",
                    config.key.display()
                )));
            }
            Err(e) => {
                return Err(unusable(format!(
                    "cannot read the private key {}: {e}",
                    config.key.display()
                )));
            }
        }
        Ok(Self {
            config: config.clone(),
            cert,
        })
    }

    /// The certificate's identity.
    pub fn cert(&self) -> &CertificateId {
        &self.cert
    }

    /// Where the key comes from, for messages.
    pub fn source(&self) -> &str {
        &self.config.source
    }

    /// Why the module image `bytes` is not signed by this key (`None` when it is): unsigned, or
    /// signed by whom.
    pub fn mismatch(&self, bytes: &[u8]) -> Option<String> {
        match appended_signature(bytes) {
            Ok(Some(signature)) if signature.signer.is(&self.cert) => None,
            Ok(Some(signature)) => Some(format!(
                "it is signed by {} (key {}), not by the certificate of {} ({}, key {})",
                signature.signer.name,
                signature.signer.key,
                self.config.source,
                self.cert.issuer_name,
                self.cert.serial_text
            )),
            Ok(None) => Some("it is not signed".to_string()),
            Err(e) => Some(format!("its signature cannot be read: {e}")),
        }
    }

    /// Signs the module file `ko` in place with `sign_file`, replacing any signature it had,
    /// and checks the result names this key's certificate. Returns the new signer.
    pub fn sign(&self, sign_file: &Path, ko: &Path) -> Result<ModuleSigner, KmodError> {
        let bytes = std::fs::read(ko).map_err(|e| KmodError::io("read", ko, e))?;
        let content = unsigned_content(&bytes);
        if content.len() != bytes.len() {
            std::fs::write(ko, content).map_err(|e| KmodError::io("write", ko, e))?;
        }
        let mut command = Command::new(sign_file);
        command
            .arg(SIGNING_HASH)
            .arg(&self.config.key)
            .arg(&self.config.cert)
            .arg(ko);
        let run = run_logged(command, "sign-file", SIGN_TIMEOUT)?;
        let failed = |problem: String| KmodError::SigningFailed {
            ko: ko.to_path_buf(),
            source_name: self.config.source.clone(),
            problem,
        };
        if !run.success {
            return Err(failed(format!(
                "{} {SIGNING_HASH} ... exited with {}: {}",
                sign_file.display(),
                run.status,
                run.log.trim()
            )));
        }
        let signed = std::fs::read(ko).map_err(|e| KmodError::io("read", ko, e))?;
        match appended_signature(&signed) {
            Ok(Some(signature)) if signature.signer.is(&self.cert) => Ok(signature.signer),
            Ok(_) => Err(failed(
                "sign-file succeeded but the module does not carry a signature by the certificate"
                    .to_string(),
            )),
            Err(e) => Err(failed(format!("the new signature cannot be read: {e}"))),
        }
    }
}

/// The kernel's `sign-file` for `release`: `scripts/sign-file` in the kernel build tree
/// (`build_dir` as this process sees it, else the host's `/lib/modules/<release>/build` with its
/// links followed under the host root), else that of an installed `linux-kbuild-*` package (on
/// Debian the build tree's `scripts` links there), on the host or in this image.
pub fn find_sign_file(
    host: &HostRoot,
    build_dir: Option<&Path>,
    release: &str,
) -> Result<PathBuf, KmodError> {
    let build_tree = format!("/lib/modules/{release}/build/scripts/sign-file");
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = build_dir {
        candidates.push(dir.join("scripts/sign-file"));
    }
    candidates.extend(host.resolve(&build_tree).ok());
    candidates.push(host.path(&build_tree));
    for usr_lib in [host.path("/usr/lib"), PathBuf::from("/usr/lib")] {
        let mut kbuild: Vec<PathBuf> = std::fs::read_dir(&usr_lib)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("linux-kbuild-"))
            .map(|e| e.path().join("scripts/sign-file"))
            .collect();
        kbuild.sort();
        candidates.extend(kbuild.into_iter().rev());
    }
    candidates
        .iter()
        .find(|c| c.is_file())
        .cloned()
        .ok_or_else(|| KmodError::SignFileMissing {
            release: release.to_string(),
            looked_at: candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// A cache entry's signer, kept in its record ([`crate::KoRecord::signature`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedSignature {
    /// The signer, as `modinfo` shows it.
    pub signer: String,
    /// The signing certificate's serial number, as `modinfo` shows `sig_key`.
    pub key: String,
    /// The sha256 the file had when it was built or downloaded, before ttdp signed it: what a
    /// checksum pinned for a prebuilt module names. `None` when it was not re-signed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_from_sha256: Option<String>,
}

impl RecordedSignature {
    /// The signer of the module image `bytes`, `None` when it is unsigned (or its signature
    /// cannot be read).
    pub fn of(bytes: &[u8]) -> Option<Self> {
        let signature = appended_signature(bytes).ok()??;
        Some(Self {
            signer: signature.signer.name,
            key: signature.signer.key,
            signed_from_sha256: None,
        })
    }
}
