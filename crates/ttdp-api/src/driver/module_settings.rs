//! `spec.module`: how the tt-kmd module is loaded: its parameters
//! (`module.parameters: ["name=value", ...]`, passed to `finit_module`) and the key it is signed
//! with (`module.signing`, for Secure Boot).
//!
//! The schema (CEL) checks each entry's shape; [`ModuleSettings::validate`] also refuses a name
//! given twice, which CEL cannot say cheaply. Values are limited to characters that cannot reach
//! a shell or split into two parameters: letters, digits and `-_.,:/+@%`.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Regular expression (RE2, as in the CEL rule) of one `name=value` module parameter.
pub const MODULE_PARAMETER_PATTERN: &str = "^[A-Za-z_][A-Za-z0-9_]*=[-A-Za-z0-9_.,:/+@%]+$";

/// How the module is loaded.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModuleSettings {
    /// Module parameters passed when the module is loaded, each `name=value`, e.g.
    /// `["reset_limit=5"]`. A change (of these alone, too) reloads the module on every node
    /// through the same cordon, drain and slot as a version change. Empty: the module's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 256)))]
    #[x_kube(validation = Rule::new("self.all(p, p.matches('^[A-Za-z_][A-Za-z0-9_]*=[-A-Za-z0-9_.,:/+@%]+$'))").message(
        "spec.module.parameters entries must be name=value: the name an identifier ([A-Za-z_][A-Za-z0-9_]*), the value non-empty with only letters, digits and -_.,:/+@% (no whitespace or shell characters)"
    ))]
    pub parameters: Vec<String>,

    /// Sign every module the agents build or download with this key before it is cached and
    /// loaded, for nodes whose kernel only loads signed modules (Secure Boot). Unset: modules are
    /// loaded as built or downloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing: Option<ModuleSigning>,
}

/// The key the agents sign modules with: a Secret in the namespace the agents run in (the
/// operator's), of type `kubernetes.io/tls`, holding the private key as `tls.key` (PEM) and its
/// X.509 certificate as `tls.crt` (PEM), e.g. made with
/// `kubectl create secret tls <name> -n <namespace> --key signing.key --cert signing.crt`.
/// The certificate must be enrolled on the nodes (MOK) for their kernel to trust it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModuleSigning {
    /// The Secret's name, in the agents' namespace.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message(
        "spec.module.signing.secretName must be a Secret name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    ))]
    pub secret_name: String,
}

/// The key of the private key (PEM) in the signing Secret.
pub const SIGNING_KEY_FILE: &str = "tls.key";
/// The key of the certificate (PEM) in the signing Secret.
pub const SIGNING_CERT_FILE: &str = "tls.crt";

/// A module parameter the schema did not catch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModuleParameterError {
    /// Not of the form `name=value` with an identifier and a safe value.
    #[error(
        "spec.module.parameters entry {0:?} must be name=value: the name an identifier ([A-Za-z_][A-Za-z0-9_]*), the value non-empty with only letters, digits and -_.,:/+@% (no whitespace or shell characters)"
    )]
    Malformed(String),
    /// The same name twice: which value the module gets would depend on its order.
    #[error("spec.module.parameters sets {0} more than once; keep one entry per parameter")]
    Duplicate(String),
}

impl ModuleSettings {
    /// Whether no parameters are set (the module's defaults).
    pub fn is_empty(&self) -> bool {
        self.parameters.is_empty()
    }

    /// Checks every entry and that no name repeats.
    pub fn validate(&self) -> Result<(), ModuleParameterError> {
        let mut seen = std::collections::BTreeSet::new();
        for entry in &self.parameters {
            let name = parameter_name(entry)
                .ok_or_else(|| ModuleParameterError::Malformed(entry.clone()))?;
            if !seen.insert(name) {
                return Err(ModuleParameterError::Duplicate(name.to_owned()));
            }
        }
        Ok(())
    }

    /// The parameter string `finit_module` takes (space-separated, in the policy's order);
    /// empty without parameters.
    pub fn kernel_parameters(&self) -> String {
        self.parameters.join(" ")
    }
}

impl super::v1alpha1::TenstorrentDriverPolicySpec {
    /// The module parameter string for `finit_module` (`module.parameters` space-separated);
    /// empty without parameters.
    pub fn kernel_parameters(&self) -> String {
        self.module
            .as_ref()
            .map(ModuleSettings::kernel_parameters)
            .unwrap_or_default()
    }
}

/// The name of a well-formed `name=value` entry, `None` when it is not one.
pub fn parameter_name(entry: &str) -> Option<&str> {
    let (name, value) = entry.split_once('=')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    let name_ok = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    let value_ok = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,:/+@%".contains(c));
    (name_ok && value_ok).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(params: &[&str]) -> ModuleSettings {
        ModuleSettings {
            parameters: params.iter().map(|p| p.to_string()).collect(),
            signing: None,
        }
    }

    #[test]
    fn identifiers_and_safe_values_pass() {
        let ok = settings(&["reset_limit=5", "_x=a-b.c,d:/e+f@g%"]);
        assert_eq!(ok.validate(), Ok(()));
        assert_eq!(ok.kernel_parameters(), "reset_limit=5 _x=a-b.c,d:/e+f@g%");
        assert_eq!(settings(&[]).kernel_parameters(), "");
    }

    #[test]
    fn malformed_and_repeated_parameters_are_refused() {
        for bad in [
            "reset_limit",
            "=5",
            "1x=5",
            "re-set=5",
            "x=",
            "x=a b",
            "x=$(reboot)",
            "x=a;b",
            "x=`id`",
            "x=a\"b",
        ] {
            let err = settings(&[bad]).validate().unwrap_err();
            assert_eq!(err, ModuleParameterError::Malformed(bad.into()), "{bad}");
            assert!(err.to_string().contains("name=value"), "{err}");
        }
        let err = settings(&["a=1", "a=2"]).validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.module.parameters sets a more than once; keep one entry per parameter"
        );
    }
}
