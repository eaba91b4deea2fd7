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

/// Host path of the kernel's key list: every key the reading process may view, one a line.
pub const KEYS_PATH: &str = "/proc/keys";
/// The keyrings the kernel checks module signatures against (built in, added at run time, the
/// UEFI platform keys and the machine owner keys). Seeing one in [`KEYS_PATH`] shows the list
/// includes the system's keys, so a key missing from it is one the kernel does not hold.
pub const TRUSTED_KEYRINGS: [&str; 4] = [
    ".builtin_trusted_keys",
    ".secondary_trusted_keys",
    ".platform",
    ".machine",
];

/// The keys the kernel lists in `/proc/keys` (as far as this process may see them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelKeys {
    /// The names of the keyrings listed, e.g. `.builtin_trusted_keys`.
    pub keyrings: Vec<String>,
    /// The descriptions of the X.509 (`asymmetric`) keys listed, e.g.
    /// `Debian Secure Boot CA: 6ccece7e4c6c0d1f6149f3dd27dfcc5cbb419ea1: X509.rsa bb419ea1 []`.
    pub asymmetric: Vec<String>,
}

impl KernelKeys {
    /// Parses `/proc/keys`: id, flags, usage, timeout, permissions, uid, gid, type, then the
    /// description.
    pub fn parse(text: &str) -> Self {
        let mut keys = Self::default();
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let Some(kind) = fields.nth(7) else {
                continue;
            };
            let description = fields.collect::<Vec<_>>().join(" ");
            match kind {
                "keyring" => keys.keyrings.push(
                    description
                        .split(':')
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                ),
                "asymmetric" => keys.asymmetric.push(description),
                _ => {}
            }
        }
        keys
    }

    /// Whether the list shows the system's trusted keyrings, so that it can be trusted to name
    /// every key they hold.
    pub fn shows_trusted_keyrings(&self) -> bool {
        self.keyrings
            .iter()
            .any(|k| TRUSTED_KEYRINGS.contains(&k.as_str()))
    }

    /// Whether an X.509 key with id `key_id` (hex, as the kernel names a key after its
    /// certificate's subject key identifier or serial number) is listed.
    pub fn holds_key_id(&self, key_id: &str) -> bool {
        let wanted = format!(": {}", key_id.to_ascii_lowercase());
        self.asymmetric.iter().any(|d| {
            let d = d.to_ascii_lowercase();
            d.ends_with(&wanted) || d.contains(&format!("{wanted}:"))
        })
    }
}

/// The kernel's key list under the host root; `None` when it cannot be read (no `/proc/keys`,
/// or not permitted): then whether a key is trusted is known only when a module is loaded.
pub fn kernel_keys(host: &HostRoot) -> Option<KernelKeys> {
    std::fs::read_to_string(host.path(KEYS_PATH))
        .ok()
        .map(|text| KernelKeys::parse(&text))
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

    /// What a Debian 12 guest shows as root (trimmed), and a key added to the machine keyring.
    const PROC_KEYS: &str = "\
0ab4e1c2 I------     1 perm 1f0b0000     0     0 keyring   .builtin_trusted_keys: 1
1d8b5b61 I------     1 perm 1f030000     0     0 asymmetric Debian Secure Boot CA: 6ccece7e4c6c0d1f6149f3dd27dfcc5cbb419ea1: X509.rsa bb419ea1 []
2c4f1a0e I------     1 perm 1f0f0000     0     0 keyring   .machine: 1
35e1d0aa I------     1 perm 1f030000     0     0 asymmetric tt-kmd signing: 5A1B0C9D2E3F40516273849AABBCCDDEEFF00112: X509.rsa eff00112 []
3a0c6d21 I--Q---     2 perm 3f030000     0     0 keyring   _ses: 1
";

    #[test]
    fn the_kernel_key_list_names_keyrings_and_x509_keys_by_id() {
        let keys = KernelKeys::parse(PROC_KEYS);
        assert_eq!(keys.keyrings, [".builtin_trusted_keys", ".machine", "_ses"]);
        assert_eq!(keys.asymmetric.len(), 2);
        assert!(keys.shows_trusted_keyrings());
        assert!(keys.holds_key_id("6ccece7e4c6c0d1f6149f3dd27dfcc5cbb419ea1"));
        assert!(keys.holds_key_id("5a1b0c9d2e3f40516273849aabbccddeeff00112"));
        assert!(!keys.holds_key_id("0123456789abcdef0123456789abcdef01234567"));
        assert!(
            !keys.holds_key_id("bb419ea1"),
            "the short id alone is no match"
        );
        assert!(!keys.holds_key_id("6ccece7e"), "nor a prefix of an id");
        let session_only = KernelKeys::parse(
            "3a0c6d21 I--Q---     2 perm 3f030000     0     0 keyring   _ses: 1\n",
        );
        assert!(!session_only.shows_trusted_keyrings());

        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        assert_eq!(kernel_keys(&root), None, "no /proc/keys: unknown");
        std::fs::create_dir_all(root.path("/proc")).unwrap();
        std::fs::write(root.path(KEYS_PATH), PROC_KEYS).unwrap();
        assert_eq!(kernel_keys(&root), Some(keys));
    }
}
