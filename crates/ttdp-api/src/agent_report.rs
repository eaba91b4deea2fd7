//! What a node's agent tells the controller (and users) about its work, as JSON in the
//! [`AGENT_REPORT`](crate::names::annotations::AGENT_REPORT) annotation on its own pod.

use serde::{Deserialize, Serialize};

/// Where the agent is in its flow.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentPhase {
    /// Reading host facts and the loaded module.
    Probing,
    /// Fetching and building the target `.ko` (cache miss).
    Building,
    /// The module is held by processes and `forceUnload` is off: waiting for them to go.
    WaitingForHolders,
    /// Another version is loaded and the controller has not granted this node its upgrade
    /// (node annotation `driver.tenstorrent.com/upgrade-grant`) yet: the module stays loaded and
    /// every holder alive until the node's turn comes.
    WaitingForGrant,
    /// Unloading the old module and loading the target.
    Swapping,
    /// The target version is loaded (container mode).
    Ready,
    /// The host manages the driver; the agent only observes.
    HostManaged,
    /// The last attempt failed; the agent retries with back-off.
    Failed,
    /// The target must be built, and this image's compiler is not the one that built the
    /// kernel: nothing is built until the node runs its compiler family's builder image.
    WaitingForBuilder,
}

/// A process holding the device open.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Process id on the host.
    pub pid: i32,
    /// Command name (`/proc/<pid>/comm`).
    pub comm: String,
}

/// The agent's latest report.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AgentReport {
    /// Where the agent is.
    pub phase: AgentPhase,
    /// The version the agent is making loaded (`TT_KMD_VERSION`).
    pub target_version: String,
    /// The version loaded right now (`/sys/module/tenstorrent/version`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded_version: Option<String>,
    /// The loaded module's parameters as sysfs shows them (`name=value`, space-separated,
    /// sorted by name); absent when none or not loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded_parameters: Option<String>,
    /// The parameters ttdp loaded the module with (the node's record), absent without one:
    /// with `loaded_parameters` it says whether the module runs the policy's parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_parameters: Option<String>,
    /// The commit the loaded module was built from (the cache record of the loaded version,
    /// when its srcversion matches), absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded_commit: Option<String>,
    /// The udev rule file on the host and whose it is, e.g.
    /// `/etc/udev/rules.d/50-tenstorrent.rules (tt-kmd 2.0.0)`; absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udev_rule: Option<String>,
    /// `container` or `host`.
    pub install_mode: String,
    /// Processes holding `/dev/tenstorrent` (while `WaitingForHolders`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
    /// UpperCamelCase reason when `Failed` or waiting (e.g. `BuildFailed`, `DeviceHeld`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable account: what happened and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The family of the compiler that built the kernel (`gcc-13`), as in the node's
    /// `driver.tenstorrent.com/kernel-compiler` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_compiler: Option<String>,
    /// Every kernel installed on the host other than the running one, and whether the target
    /// version's module waits verified in the cache for it: what the node would boot into.
    /// Empty until the agent has looked, and on a host with one kernel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub installed_kernels: Vec<KernelReadiness>,
    /// How the module came up when this agent started, when it loaded one then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_load: Option<StartLoad>,
    /// Who signed the loaded module (its `signer`, as `modinfo` shows it); absent when the
    /// module is unsigned or nothing is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_signer: Option<String>,
}

/// Whether the target version's module is ready for one installed kernel.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelModuleState {
    /// A verified `.ko` of the target version is in the cache for this kernel.
    Ready,
    /// Not looked at yet, or being built or downloaded now.
    Pending,
    /// It could not be made (no headers, build failed, download refused); the agent retries.
    Failed,
}

/// One installed kernel that is not running, as the agent prepared it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KernelReadiness {
    /// Its release (`uname -r` once booted), e.g. `6.1.0-58-amd64`.
    pub release: String,
    /// Whether its module is ready.
    pub state: KernelModuleState,
    /// UpperCamelCase reason when not ready, e.g. `HeadersMissing`, `BuildFailed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What went wrong and what to do, when not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The module load at an agent's start (after a reboot, or a new agent pod).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StartLoad {
    /// Whether a verified `.ko` was waiting in the cache (nothing built or downloaded).
    pub cache_hit: bool,
    /// Milliseconds from the agent's start to the module loaded and the agent Ready.
    pub ready_after_ms: u64,
}

impl AgentReport {
    /// "held by pid 1234 (python3), pid 1240 (tt-smi)", or `None` without holders.
    pub fn holders_text(&self) -> Option<String> {
        (!self.holders.is_empty()).then(|| {
            let list: Vec<String> = self
                .holders
                .iter()
                .map(|h| format!("pid {} ({})", h.pid, h.comm))
                .collect();
            format!("held by {}", list.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_read_like_the_spec() {
        let r = AgentReport {
            phase: AgentPhase::WaitingForHolders,
            target_version: "2.8.0".into(),
            loaded_version: Some("2.7.0".into()),
            loaded_parameters: None,
            applied_parameters: None,
            loaded_commit: None,
            udev_rule: None,
            install_mode: "container".into(),
            holders: vec![
                Holder {
                    pid: 1234,
                    comm: "python3".into(),
                },
                Holder {
                    pid: 1240,
                    comm: "tt-smi".into(),
                },
            ],
            reason: Some("DeviceHeld".into()),
            message: None,
            kernel_compiler: None,
            installed_kernels: vec![KernelReadiness {
                release: "6.1.0-58-amd64".into(),
                state: KernelModuleState::Failed,
                reason: Some("BuildFailed".into()),
                message: Some("make failed".into()),
            }],
            start_load: Some(StartLoad {
                cache_hit: true,
                ready_after_ms: 2300,
            }),
            module_signer: None,
        };
        assert_eq!(
            r.holders_text().unwrap(),
            "held by pid 1234 (python3), pid 1240 (tt-smi)"
        );
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"phase\":\"WaitingForHolders\""), "{json}");
        assert_eq!(serde_json::from_str::<AgentReport>(&json).unwrap(), r);
    }
}
