//! Module-signing facts that decide whether an unsigned module can load.

use crate::HostRoot;
use crate::error::{ProbeError, read_optional};

/// Host path of the module signature enforcement flag (`Y` or `N`; absent without `CONFIG_MODULE_SIG`).
pub const SIG_ENFORCE_PATH: &str = "/sys/module/module/parameters/sig_enforce";
/// Host path of the kernel lockdown state (`[none] integrity confidentiality`; absent without LSM lockdown).
pub const LOCKDOWN_PATH: &str = "/sys/kernel/security/lockdown";

/// The kernel lockdown level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Lockdown {
    /// No lockdown.
    None,
    /// Integrity lockdown: unsigned modules are refused.
    Integrity,
    /// Confidentiality lockdown: unsigned modules are refused.
    Confidentiality,
}

/// What the host says about module signing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SigningFacts {
    /// `sig_enforce`: `None` when the file does not exist (kernel without module signing).
    pub sig_enforce: Option<bool>,
    /// The selected lockdown level: `None` when lockdown is not available or securityfs is not mounted.
    pub lockdown: Option<Lockdown>,
}

impl SigningFacts {
    /// Whether an unsigned module (such as one built on the node) can load.
    pub fn unsigned_modules_load(&self) -> bool {
        self.sig_enforce != Some(true) && matches!(self.lockdown, None | Some(Lockdown::None))
    }
}

/// Reads `sig_enforce` and the lockdown level under the host root.
pub fn signing_facts(host: &HostRoot) -> Result<SigningFacts, ProbeError> {
    let sig_enforce =
        read_optional(&host.path(SIG_ENFORCE_PATH))?.map(|t| t.trim() == "Y" || t.trim() == "1");
    let lockdown = read_optional(&host.path(LOCKDOWN_PATH))?.and_then(|t| {
        let selected = t.split_whitespace().find(|w| w.starts_with('['))?;
        match selected.trim_matches(|c| c == '[' || c == ']') {
            "none" => Some(Lockdown::None),
            "integrity" => Some(Lockdown::Integrity),
            "confidentiality" => Some(Lockdown::Confidentiality),
            _ => None,
        }
    });
    Ok(SigningFacts {
        sig_enforce,
        lockdown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(sig: Option<&str>, lockdown: Option<&str>) -> SigningFacts {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        for (path, text) in [(SIG_ENFORCE_PATH, sig), (LOCKDOWN_PATH, lockdown)] {
            if let Some(text) = text {
                let p = root.path(path);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, text).unwrap();
            }
        }
        signing_facts(&root).unwrap()
    }

    #[test]
    fn unsigned_modules_load_only_without_enforcement_or_lockdown() {
        assert!(facts(None, None).unsigned_modules_load());
        let open = facts(Some("N\n"), Some("[none] integrity confidentiality\n"));
        assert_eq!(
            open,
            SigningFacts {
                sig_enforce: Some(false),
                lockdown: Some(Lockdown::None)
            }
        );
        assert!(open.unsigned_modules_load());
        let enforced = facts(Some("Y\n"), Some("[none] integrity confidentiality\n"));
        assert!(!enforced.unsigned_modules_load());
        let locked = facts(Some("N\n"), Some("none [integrity] confidentiality\n"));
        assert_eq!(locked.lockdown, Some(Lockdown::Integrity));
        assert!(!locked.unsigned_modules_load());
        assert_eq!(
            facts(None, Some("none integrity [confidentiality]")).lockdown,
            Some(Lockdown::Confidentiality)
        );
    }
}
