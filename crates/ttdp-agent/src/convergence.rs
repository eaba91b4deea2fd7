//! The pure decisions of the node flow: from what the host shows ([`Observation`]) to what to do
//! next ([`Step`], [`UnloadGate`]), and the [`AgentReport`] texts. No I/O here.

use ttdp_api::agent_report::{AgentPhase, AgentReport, Holder};
use ttdp_api::names::labels;
use ttdp_hostprobe::{DkmsSignal, HostInstall};
use ttdp_kmod::parameters::parameters_text;
use ttdp_kmod::{DeviceHolder, KmdVersion, ModuleStatus};

use crate::labels::InstallMode;

/// What the host shows at the start of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// DKMS signals (the spec's "Mixed mode").
    pub host_install: HostInstall,
    /// The module as sysfs and `/proc` show it.
    pub status: ModuleStatus,
}

impl Observation {
    /// Container or host mode.
    pub fn mode(&self) -> InstallMode {
        if self.host_install.is_host_managed() {
            InstallMode::Host
        } else {
            InstallMode::Container
        }
    }

    /// The loaded version, `None` when no module is loaded.
    pub fn loaded_version(&self) -> Option<&str> {
        self.status.loaded_version()
    }
}

/// What the node needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The host manages the driver: observe and report only, touch nothing.
    StandDown,
    /// The target version is loaded: nothing to swap.
    Converged,
    /// The target must be installed (nothing loaded) or swapped in (another version loaded).
    Install,
}

/// The next step for a node showing `observation` when `target` is wanted with the module
/// parameters `params` (the kernel's string; a change of them alone needs a reload too).
pub fn next_step(observation: &Observation, target: &KmdVersion, params: &str) -> Step {
    if observation.host_install.is_host_managed() {
        Step::StandDown
    } else if observation.status.at_target(target.as_str(), params) {
        Step::Converged
    } else {
        Step::Install
    }
}

/// Whether the old module may be unloaded now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnloadGate {
    /// Nothing loaded, nothing holds it, or force unload is on.
    Proceed,
    /// Something holds the module and force unload is off: wait for the drain.
    WaitForHolders,
}

/// The gate for unloading the module in `status`, with force unload `force`.
pub fn unload_gate(status: &ModuleStatus, force: bool) -> UnloadGate {
    if status.loaded && status.in_use() && !force {
        UnloadGate::WaitForHolders
    } else {
        UnloadGate::Proceed
    }
}

/// The report's holder list.
pub fn report_holders(holders: &[DeviceHolder]) -> Vec<Holder> {
    holders
        .iter()
        .map(|h| Holder {
            pid: h.pid,
            comm: h.comm.clone(),
        })
        .collect()
}

/// A report in `phase` for `observation`, without holders, reason or message.
pub fn base_report(
    phase: AgentPhase,
    target: &KmdVersion,
    observation: &Observation,
) -> AgentReport {
    AgentReport {
        phase,
        target_version: target.to_string(),
        loaded_version: observation.loaded_version().map(str::to_string),
        loaded_parameters: (observation.status.loaded && !observation.status.parameters.is_empty())
            .then(|| parameters_text(&observation.status.parameters)),
        applied_parameters: observation.status.applied_parameters.clone(),
        loaded_commit: observation.status.source_commit.clone(),
        udev_rule: observation.status.udev_rule.as_ref().map(|r| r.summary()),
        install_mode: observation.mode().as_str().to_string(),
        holders: Vec::new(),
        reason: None,
        message: None,
        kernel_compiler: None,
        installed_kernels: Vec::new(),
        start_load: None,
        module_signer: observation.status.signer.clone(),
    }
}

/// The message while waiting for holders: who holds the module and what the user can do.
pub fn holders_message(status: &ModuleStatus, target: &KmdVersion) -> String {
    let loaded = status.version.as_deref().unwrap_or("(unknown version)");
    let refcnt = status.refcnt.unwrap_or(0);
    let who = if !status.device_holders.is_empty() {
        let report = AgentReport {
            phase: AgentPhase::WaitingForHolders,
            target_version: target.to_string(),
            loaded_version: None,
            loaded_parameters: None,
            applied_parameters: None,
            loaded_commit: None,
            udev_rule: None,
            install_mode: InstallMode::Container.as_str().to_string(),
            holders: report_holders(&status.device_holders),
            reason: None,
            message: None,
            kernel_compiler: None,
            installed_kernels: Vec::new(),
            start_load: None,
            module_signer: None,
        };
        report.holders_text().unwrap_or_default()
    } else if !status.module_holders.is_empty() {
        format!("used by modules {}", status.module_holders.join(", "))
    } else {
        "no holding process found in the host's /proc (is the agent running with hostPID?)"
            .to_string()
    };
    format!(
        "module {} {loaded} is in use (refcnt {refcnt}; {who}); waiting for the workloads to stop before switching to {target}: drain the node or set upgradePolicy.forceUnload",
        status.name
    )
}

/// Whether the node's [`labels::ALLOW_NO_ROLLBACK`] label value opts in to unloading without a
/// rollback path.
pub fn allows_no_rollback(label: Option<&str>) -> bool {
    label == Some(labels::ALLOW_NO_ROLLBACK_ENABLED)
}

/// The message when no rollback path exists and the node did not opt in: the installer's
/// account (`cause`), and how the admin opts in.
pub fn no_rollback_message(cause: &str) -> String {
    format!(
        "{cause}; to upgrade this node anyway, label it {}={} (kubectl label node <node> {}={})",
        labels::ALLOW_NO_ROLLBACK,
        labels::ALLOW_NO_ROLLBACK_ENABLED,
        labels::ALLOW_NO_ROLLBACK,
        labels::ALLOW_NO_ROLLBACK_ENABLED
    )
}

/// The message of a host-managed node.
pub fn host_managed_message(install: &HostInstall) -> String {
    let signals: Vec<String> = install
        .signals
        .iter()
        .map(|s| match s {
            DkmsSignal::DkmsState { path, .. } => path.display().to_string(),
            DkmsSignal::DkmsSource { path, .. } => path.display().to_string(),
        })
        .collect();
    format!(
        "the host manages tt-kmd itself (DKMS: {}); ttdp only reports the loaded version and changes nothing on this node",
        signals.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn status(version: Option<&str>, refcnt: u32, holders: &[(i32, &str)]) -> ModuleStatus {
        ModuleStatus {
            name: "tenstorrent".into(),
            loaded: version.is_some(),
            version: version.map(str::to_string),
            srcversion: None,
            refcnt: version.map(|_| refcnt),
            initstate: version.map(|_| "live".to_string()),
            module_holders: vec![],
            device_holders: holders
                .iter()
                .map(|(pid, comm)| DeviceHolder {
                    pid: *pid,
                    comm: comm.to_string(),
                    paths: vec![PathBuf::from("/dev/tenstorrent/0")],
                })
                .collect(),
            parameters: Default::default(),
            applied_parameters: None,
            source_commit: None,
            udev_rule: None,
            signer: None,
        }
    }

    fn observation(status: ModuleStatus, dkms: bool) -> Observation {
        let host_install = HostInstall {
            signals: if dkms {
                vec![DkmsSignal::DkmsSource {
                    path: "/usr/src/tenstorrent-1.29/dkms.conf".into(),
                    version: "1.29".into(),
                }]
            } else {
                vec![]
            },
        };
        Observation {
            host_install,
            status,
        }
    }

    fn v(text: &str) -> KmdVersion {
        text.parse().unwrap()
    }

    #[test]
    fn steps_follow_the_spec() {
        let target = &v("2.8.0");
        assert_eq!(
            next_step(
                &observation(status(Some("2.7.0"), 0, &[]), true),
                target,
                ""
            ),
            Step::StandDown
        );
        assert_eq!(
            next_step(
                &observation(status(Some("2.8.0"), 3, &[]), false),
                target,
                ""
            ),
            Step::Converged
        );
        assert_eq!(
            next_step(
                &observation(status(Some("2.7.0"), 0, &[]), false),
                target,
                ""
            ),
            Step::Install
        );
        assert_eq!(
            next_step(&observation(status(None, 0, &[]), false), target, ""),
            Step::Install
        );
    }

    /// A parameter change alone is not converged: the module must be reloaded with them, and
    /// the report shows what sysfs has loaded.
    #[test]
    fn parameters_are_part_of_the_target() {
        let target = &v("2.8.0");
        let mut loaded = status(Some("2.8.0"), 0, &[]);
        loaded.parameters = [("reset_limit".to_string(), "5".to_string())].into();
        loaded.applied_parameters = Some("reset_limit=5".into());
        let obs = observation(loaded, false);
        assert_eq!(next_step(&obs, target, "reset_limit=5"), Step::Converged);
        assert_eq!(next_step(&obs, target, "reset_limit=6"), Step::Install);
        assert_eq!(
            next_step(&obs, target, ""),
            Step::Install,
            "a dropped parameter reloads"
        );
        let report = base_report(AgentPhase::Ready, target, &obs);
        assert_eq!(report.loaded_parameters.as_deref(), Some("reset_limit=5"));
        assert_eq!(report.applied_parameters.as_deref(), Some("reset_limit=5"));
    }

    #[test]
    fn holders_block_unload_unless_forced() {
        let held = status(Some("2.7.0"), 2, &[(1234, "python3"), (1240, "tt-smi")]);
        assert_eq!(unload_gate(&held, false), UnloadGate::WaitForHolders);
        assert_eq!(unload_gate(&held, true), UnloadGate::Proceed);
        assert_eq!(
            unload_gate(&status(Some("2.7.0"), 0, &[]), false),
            UnloadGate::Proceed
        );
        assert_eq!(
            unload_gate(&status(None, 0, &[]), false),
            UnloadGate::Proceed
        );
        let message = holders_message(&held, &v("2.8.0"));
        assert!(
            message.contains("held by pid 1234 (python3), pid 1240 (tt-smi)")
                && message.contains("refcnt 2")
                && message.contains("forceUnload"),
            "{message}"
        );
        let anonymous = holders_message(&status(Some("2.7.0"), 1, &[]), &v("2.8.0"));
        assert!(anonymous.contains("hostPID"), "{anonymous}");
    }

    #[test]
    fn only_the_true_label_opts_in_to_no_rollback() {
        assert!(allows_no_rollback(Some("true")));
        for other in [None, Some("false"), Some("True"), Some("")] {
            assert!(!allows_no_rollback(other), "{other:?}");
        }
        let message = no_rollback_message("no .ko of 2.7.0");
        assert!(
            message.starts_with("no .ko of 2.7.0; ")
                && message.contains("driver.tenstorrent.com/allow-no-rollback=true"),
            "{message}"
        );
    }

    #[test]
    fn reports_carry_mode_and_the_loaded_version() {
        let obs = observation(status(Some("1.29.0"), 0, &[]), true);
        let report = base_report(AgentPhase::HostManaged, &v("2.8.0"), &obs);
        assert_eq!(report.install_mode, "host");
        assert_eq!(report.loaded_version.as_deref(), Some("1.29.0"));
        assert!(
            host_managed_message(&obs.host_install).contains("/usr/src/tenstorrent-1.29/dkms.conf")
        );
    }
}
