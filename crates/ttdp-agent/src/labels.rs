//! [`NodeLabels`]: the labels the agent keeps on its own node, as a minimal JSON merge patch.
//!
//! - `driver.tenstorrent.com/install-mode`: `container` or `host`, every pass;
//! - `driver.tenstorrent.com/kmd-version`: the version read back from
//!   `/sys/module/tenstorrent/version`, never the target; removed when no module is loaded (or
//!   when the loaded version cannot be a label value);
//! - `tt-smi.driver.tenstorrent.com/version`: set once tt-smi is on the host (container mode only;
//!   a host-managed node's tt-smi label is left alone).
//!
//! - `driver.tenstorrent.com/kernel-compiler`: the family of the compiler that built the
//!   running kernel (`gcc-13`), every pass.
//!
//! Labels the agent does not manage are never part of the patch.

use std::collections::BTreeMap;

use ttdp_api::names::{install_mode, labels};

use crate::config::is_label_value;

/// Who manages the node's driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum InstallMode {
    /// ttdp builds and loads the module.
    Container,
    /// The host manages the module (DKMS); ttdp only observes.
    Host,
}

impl InstallMode {
    /// The label value: `container` or `host`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Container => install_mode::CONTAINER,
            Self::Host => install_mode::HOST,
        }
    }
}

/// Label keys with the value to set, or `None` to remove the label.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct NodeLabels(BTreeMap<String, Option<String>>);

impl NodeLabels {
    /// The labels for a node in `mode` with `loaded_version` loaded (`None`: no module) and, in
    /// container mode, tt-smi `tt_smi_version` installed (`None`: not installed yet, left alone).
    pub fn desired(
        mode: InstallMode,
        loaded_version: Option<&str>,
        tt_smi_version: Option<&str>,
    ) -> Self {
        let mut map = BTreeMap::new();
        map.insert(
            labels::INSTALL_MODE.to_string(),
            Some(mode.as_str().to_string()),
        );
        let kmd = loaded_version
            .filter(|v| !v.is_empty() && is_label_value(v))
            .map(str::to_string);
        map.insert(labels::KMD_VERSION.to_string(), kmd);
        if mode == InstallMode::Container
            && let Some(version) = tt_smi_version
        {
            map.insert(
                labels::TT_SMI_VERSION.to_string(),
                Some(version.to_string()),
            );
        }
        Self(map)
    }

    /// Adds the kernel-compiler label (`gcc-13`): set on every pass, the kernel cannot change
    /// while the agent runs.
    pub fn with_kernel_compiler(mut self, family: &str) -> Self {
        self.0.insert(
            ttdp_api::names::compiler::KERNEL_COMPILER_LABEL.to_string(),
            Some(family.to_string()),
        );
        self
    }

    /// The value for `key`: `Some(Some(v))` set, `Some(None)` removed, `None` left alone.
    pub fn get(&self, key: &str) -> Option<Option<&str>> {
        self.0.get(key).map(Option::as_deref)
    }

    /// Every managed key with its value (`None`: removed).
    pub fn iter(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_deref()))
    }

    /// The JSON merge patch for a Node: `{"metadata":{"labels":{key: value-or-null}}}`.
    pub fn merge_patch(&self) -> serde_json::Value {
        let labels: serde_json::Map<String, serde_json::Value> = self
            .0
            .iter()
            .map(|(k, v)| {
                let value = v
                    .as_ref()
                    .map_or(serde_json::Value::Null, |v| v.clone().into());
                (k.clone(), value)
            })
            .collect();
        serde_json::json!({ "metadata": { "labels": labels } })
    }

    /// Applies these changes to a label map (what the API server does with the patch).
    pub fn apply_to(&self, current: &mut BTreeMap<String, String>) {
        for (key, value) in &self.0 {
            match value {
                Some(v) => {
                    current.insert(key.clone(), v.clone());
                }
                None => {
                    current.remove(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_mode_sets_all_three_and_removes_nothing_else() {
        let l = NodeLabels::desired(InstallMode::Container, Some("2.8.0"), Some("3.0.1"));
        assert_eq!(
            l.merge_patch(),
            serde_json::json!({"metadata": {"labels": {
                "driver.tenstorrent.com/install-mode": "container",
                "driver.tenstorrent.com/kmd-version": "2.8.0",
                "tt-smi.driver.tenstorrent.com/version": "3.0.1",
            }}})
        );
    }

    #[test]
    fn no_module_removes_kmd_version_and_host_mode_leaves_tt_smi_alone() {
        let l = NodeLabels::desired(InstallMode::Host, None, Some("3.0.1"));
        assert_eq!(
            l.merge_patch(),
            serde_json::json!({"metadata": {"labels": {
                "driver.tenstorrent.com/install-mode": "host",
                "driver.tenstorrent.com/kmd-version": null,
            }}})
        );
        assert_eq!(l.get(labels::TT_SMI_VERSION), None);
        let mut current = BTreeMap::from([
            (labels::KMD_VERSION.to_string(), "2.7.0".to_string()),
            ("other".to_string(), "x".to_string()),
        ]);
        l.apply_to(&mut current);
        assert_eq!(
            current,
            BTreeMap::from([
                (labels::INSTALL_MODE.to_string(), "host".to_string()),
                ("other".to_string(), "x".to_string()),
            ])
        );
    }

    #[test]
    fn the_kernel_compiler_is_labelled() {
        let l =
            NodeLabels::desired(InstallMode::Container, None, None).with_kernel_compiler("gcc-13");
        assert_eq!(
            l.get(ttdp_api::names::compiler::KERNEL_COMPILER_LABEL),
            Some(Some("gcc-13"))
        );
    }

    #[test]
    fn a_version_that_cannot_be_a_label_value_is_not_stamped() {
        let l = NodeLabels::desired(InstallMode::Host, Some("1.29+dkms"), None);
        assert_eq!(l.get(labels::KMD_VERSION), Some(None));
    }
}
