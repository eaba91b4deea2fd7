//! The readiness probe (`ttdp-agent probe`): re-derives readiness from the host alone, without
//! the running agent and without any API call, so it is fast and works when the API is down.
//!
//! Ready when the host manages the driver (DKMS signals), or when `/sys/module/tenstorrent` is
//! live and reports exactly the target version and, with post-load validation on (the default),
//! every Tenstorrent PCI device is bound to `tenstorrent` with its `/dev/tenstorrent` node and
//! the validation command, if any, passed for the loaded module (its record in the module lock
//! directory, see [`crate::validation`]). So a node whose cards vanish goes unready.

use std::path::PathBuf;

use ttdp_api::names::MODULE_NAME;
use ttdp_hostprobe::{HostRoot, detect_host_install};
use ttdp_kmod::parameters::{
    parameters_at_target, parameters_text, read_parameters, read_record, record_path,
};
use ttdp_kmod::{KmdVersion, MODULE_LOCK_DIR};

use crate::config::ValidationConfig;
use crate::validation::probe_checks;

/// What the probe checks beyond the version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeChecks {
    /// The post-load validation settings (devices, command).
    pub validation: ValidationConfig,
    /// The module lock directory holding the validation record, as the probe sees it.
    pub lock_dir: PathBuf,
    /// The module parameters the module must run with (`TT_KMD_PARAMETERS`; empty: none).
    pub parameters: String,
}

impl ProbeChecks {
    /// The defaults for the host at `host`: devices checked, no command, the record in
    /// `<host>/run/ttdp`.
    pub fn defaults(host: &HostRoot) -> Self {
        Self {
            validation: ValidationConfig::default(),
            lock_dir: host.path(MODULE_LOCK_DIR),
            parameters: String::new(),
        }
    }
}

/// The probe's answer, with a one-line reason for the kubelet's probe message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The pod is ready.
    Ready(String),
    /// The pod is not ready.
    NotReady(String),
}

impl Readiness {
    /// Whether this is [`Readiness::Ready`].
    pub fn is_ready(&self) -> bool {
        matches!(self, Self::Ready(_))
    }

    /// The reason text.
    pub fn reason(&self) -> &str {
        match self {
            Self::Ready(r) | Self::NotReady(r) => r,
        }
    }
}

/// Whether the node is ready for `target_version`, read from the host under `host`, with the
/// default checks ([`ProbeChecks::defaults`]).
pub fn readiness(host: &HostRoot, target_version: &KmdVersion) -> Readiness {
    readiness_with(host, target_version, &ProbeChecks::defaults(host))
}

/// Whether the node is ready for `target_version`, with `checks`.
pub fn readiness_with(
    host: &HostRoot,
    target_version: &KmdVersion,
    checks: &ProbeChecks,
) -> Readiness {
    match detect_host_install(host) {
        Ok(install) if install.is_host_managed() => {
            return Readiness::Ready(
                "host-managed tt-kmd install (DKMS); not managed by ttdp".into(),
            );
        }
        Ok(_) => {}
        Err(e) => return Readiness::NotReady(format!("cannot check for a DKMS install: {e}")),
    }
    let dir = host.path(format!("/sys/module/{MODULE_NAME}"));
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .map(|t| t.trim().to_string())
    };
    match (read("initstate").as_deref(), read("version")) {
        (None, _) => Readiness::NotReady(format!(
            "module {MODULE_NAME} is not loaded; want {target_version}"
        )),
        (Some("live"), Some(version)) if version == target_version.as_str() => {
            if let Some(problem) = parameters_problem(host, checks) {
                return Readiness::NotReady(format!(
                    "module {MODULE_NAME} {version} is loaded but {problem}"
                ));
            }
            let srcversion = read("srcversion");
            let checked = probe_checks(
                &checks.validation,
                host,
                &checks.lock_dir,
                &version,
                srcversion.as_deref(),
            );
            match checked {
                Ok(proven) if proven.is_empty() => {
                    Readiness::Ready(format!("module {MODULE_NAME} {version} is loaded"))
                }
                Ok(proven) => Readiness::Ready(format!(
                    "module {MODULE_NAME} {version} is loaded: {proven}"
                )),
                Err(problem) => Readiness::NotReady(format!(
                    "module {MODULE_NAME} {version} is loaded but {problem}"
                )),
            }
        }
        (Some("live"), version) => Readiness::NotReady(format!(
            "module {MODULE_NAME} {} is loaded; want {target_version}",
            version.as_deref().unwrap_or("(no version)")
        )),
        (Some(state), _) => Readiness::NotReady(format!(
            "module {MODULE_NAME} is {state}; want {target_version} live"
        )),
    }
}

/// Why the loaded module does not run the wanted parameters, `None` when it does: a parameter
/// change alone keeps the node unready until the agent has reloaded the module.
fn parameters_problem(host: &HostRoot, checks: &ProbeChecks) -> Option<String> {
    let loaded = read_parameters(host, MODULE_NAME);
    let applied = read_record(&record_path(&checks.lock_dir, MODULE_NAME));
    (!parameters_at_target(&checks.parameters, &loaded, applied.as_deref())).then(|| {
        format!(
            "with parameters \"{}\"; want \"{}\"",
            parameters_text(&loaded),
            checks.parameters
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(host: &HostRoot, path: &str, text: &str) {
        let p = host.path(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A host with module tenstorrent `version` loaded and live.
    fn loaded(version: &str) -> (tempfile::TempDir, HostRoot) {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        write(&host, "/sys/module/tenstorrent/initstate", "live\n");
        write(
            &host,
            "/sys/module/tenstorrent/version",
            &format!("{version}\n"),
        );
        (dir, host)
    }

    #[test]
    fn ready_only_with_the_target_version_live() {
        let target: KmdVersion = "2.8.0".parse().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let r = readiness(&host, &target);
        assert!(!r.is_ready() && r.reason().contains("not loaded"), "{r:?}");

        write(&host, "/sys/module/tenstorrent/initstate", "live\n");
        write(&host, "/sys/module/tenstorrent/version", "2.7.0\n");
        let r = readiness(&host, &target);
        assert!(
            !r.is_ready() && r.reason().contains("2.7.0 is loaded; want 2.8.0"),
            "{r:?}"
        );

        write(&host, "/sys/module/tenstorrent/version", "2.8.0\n");
        assert!(readiness(&host, &target).is_ready());

        write(&host, "/sys/module/tenstorrent/initstate", "going\n");
        assert!(!readiness(&host, &target).is_ready());
    }

    #[test]
    fn devices_that_are_not_bound_make_a_loaded_target_unready() {
        let target: KmdVersion = "2.8.0".parse().unwrap();
        let (_dir, host) = loaded("2.8.0");
        write(
            &host,
            "/sys/bus/pci/devices/0000:01:00.0/vendor",
            "0x1e52\n",
        );
        write(
            &host,
            "/sys/bus/pci/devices/0000:01:00.0/device",
            "0x401e\n",
        );
        let r = readiness(&host, &target);
        assert!(
            !r.is_ready()
                && r.reason().contains(
                    "is loaded but 0 of 1 devices bound to tenstorrent (0000:01:00.0 is bound to no driver)"
                ),
            "{r:?}"
        );
        let mut off = ProbeChecks::defaults(&host);
        off.validation.enabled = false;
        assert!(readiness_with(&host, &target, &off).is_ready());
    }

    /// A parameter change alone keeps the pod unready until the module is reloaded with them.
    #[test]
    fn the_wanted_parameters_must_be_loaded() {
        let target: KmdVersion = "2.8.0".parse().unwrap();
        let (_dir, host) = loaded("2.8.0");
        write(
            &host,
            "/sys/module/tenstorrent/parameters/reset_limit",
            "5\n",
        );
        let mut checks = ProbeChecks::defaults(&host);
        checks.validation.enabled = false;
        checks.parameters = "reset_limit=6".into();
        let r = readiness_with(&host, &target, &checks);
        assert!(
            !r.is_ready()
                && r.reason()
                    == "module tenstorrent 2.8.0 is loaded but with parameters \"reset_limit=5\"; want \"reset_limit=6\"",
            "{r:?}"
        );
        checks.parameters = "reset_limit=5".into();
        assert!(readiness_with(&host, &target, &checks).is_ready());
        // ttdp loaded it with a parameter the policy no longer has: reload to the defaults
        write(&host, "/run/ttdp/tenstorrent.parameters", "reset_limit=5\n");
        checks.parameters = String::new();
        assert!(!readiness_with(&host, &target, &checks).is_ready());
    }

    #[test]
    fn a_host_managed_node_is_always_ready() {
        let target: KmdVersion = "2.8.0".parse().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        write(
            &host,
            "/usr/src/tenstorrent-1.29/dkms.conf",
            "PACKAGE_NAME=tenstorrent\n",
        );
        let r = readiness(&host, &target);
        assert!(r.is_ready() && r.reason().contains("host-managed"), "{r:?}");
    }
}
