//! [`AgentConfig`]: everything the agent is told by its pod (env) and flags, validated.
//!
//! The parsers here (`parse_*`) are what the binary's clap arguments use, so a malformed value is
//! rejected at startup with a message naming the variable. The tt-kmd version is parsed there too,
//! once, into a [`KmdVersion`] (its `FromStr`); nothing past that checks it again.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ttdp_api::names::env;
use ttdp_hostprobe::HostRoot;
use ttdp_kmod::{BuildOptions, KmdVersion, KoCache, MODULE_LOCK_DIR};

use crate::error::ConfigError;
use crate::prebuilt_fetch::PrebuiltConfig;

/// Stands for the host's kernel release in [`AgentConfig::build`]'s `build_dir`.
pub const RELEASE_PLACEHOLDER: &str = "{release}";

/// Which kernel the agent loads modules into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelKind {
    /// The real kernel (`finit_module`, `delete_module`), the default.
    Real,
    /// The file-backed simulated kernel under the host root (tests and the demo; only in builds
    /// with the `sim` feature, never in a release image).
    #[cfg(feature = "sim")]
    Sim,
}

impl FromStr for KernelKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "real" => Ok(Self::Real),
            #[cfg(feature = "sim")]
            "sim" => Ok(Self::Sim),
            #[cfg(not(feature = "sim"))]
            "sim" => Err(
                "this ttdp-agent is a release build and loads modules into the real kernel only; the simulated kernel exists only in builds with the `sim` feature (tests and the demo). Remove TTDP_KERNEL from the image's environment or set it to real".into(),
            ),
            other => Err(format!("unknown kernel {other:?}; expected real or sim")),
        }
    }
}

/// Where the agent reports labels, its [`ttdp_api::agent_report::AgentReport`] and Events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportTarget {
    /// The Kubernetes API: node labels, the pod annotation and node Events (the default).
    Kube,
    /// A JSON file with the same content, rewritten atomically (VM tests, debugging).
    File(PathBuf),
    /// Nowhere (logs only).
    Disabled,
}

impl FromStr for ReportTarget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kube" => Ok(Self::Kube),
            "none" => Ok(Self::Disabled),
            other => match other.strip_prefix("file:") {
                Some(path) if !path.is_empty() => Ok(Self::File(PathBuf::from(path))),
                _ => Err(format!(
                    "unknown report target {other:?}; expected kube, file:PATH or none"
                )),
            },
        }
    }
}

/// The service-account token every pod gets (unless its automount is off).
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Whether the agent runs in a Kubernetes pod: the kubelet sets `KUBERNETES_SERVICE_HOST` in
/// every container, the DaemonSet sets `POD_NAME` and `POD_NAMESPACE` from the downward API,
/// and the service-account token is mounted. Any one is enough: an image cannot unset them.
/// `var` reads an environment variable.
pub fn runs_in_pod(var: impl Fn(&str) -> Option<String>, token_mounted: bool) -> bool {
    token_mounted
        || ["KUBERNETES_SERVICE_HOST", env::POD_NAME, env::POD_NAMESPACE]
            .iter()
            .any(|name| var(name).is_some_and(|v| !v.is_empty()))
}

/// In a pod, only the Kubernetes backend, the one that reads the controller's upgrade grant,
/// may run the agent: `file:` and `none` swap without a grant (they stand for a VM or a host run
/// by hand), so an image whose environment names them must not start.
pub fn check_grant_enforced(report: &ReportTarget, in_pod: bool) -> Result<(), ConfigError> {
    let value = match report {
        ReportTarget::Kube => return Ok(()),
        _ if !in_pod => return Ok(()),
        ReportTarget::File(path) => format!("file:{}", path.display()),
        ReportTarget::Disabled => "none".to_owned(),
    };
    Err(ConfigError::Invalid {
        variable: env::REPORT,
        value,
        problem: "in a pod the agent must report to the Kubernetes API (kube), the only backend that waits for the controller's upgrade grant; file: and none would swap the driver without one and are for VMs and hosts run by hand. Remove TTDP_REPORT from the image's environment (the DaemonSet sets kube)".into(),
    })
}

/// The bundled tt-smi binary and the version it is labelled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TtSmiSource {
    /// The binary in the agent's image, e.g. `/opt/ttdp/tt-smi`.
    pub path: PathBuf,
    /// Its version (`TT_SMI_VERSION`), the value of the tt-smi node label.
    pub version: String,
}

/// How long to wait between attempts that failed or found the device held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First delay.
    pub initial: Duration,
    /// Longest delay after a failure (holders are re-checked at least every probe period).
    pub max: Duration,
}

/// How the agent proves a loaded module works before it reports Ready
/// (`upgradePolicy.validation`; see [`crate::validation`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationConfig {
    /// Post-load validation on: every Tenstorrent PCI device must be bound to `tenstorrent`
    /// with its `/dev/tenstorrent` node, and the command (if any) must pass
    /// (`TTDP_VALIDATE_DEVICES`); `false` turns every check off, the readiness probe's too.
    pub enabled: bool,
    /// How long after a load the devices may take to be bound (`TTDP_VALIDATION_DEVICE_WAIT`).
    pub device_wait: Duration,
    /// A command that must also exit 0 (`TTDP_VALIDATION_COMMAND`), `None` for none.
    pub command: Option<Vec<String>>,
    /// How long the command may run (`TTDP_VALIDATION_TIMEOUT`).
    pub command_timeout: Duration,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            device_wait: Duration::from_secs(10),
            command: None,
            command_timeout: Duration::from_secs(60),
        }
    }
}

/// The validation command from its JSON form (`["tt-smi", "-s"]`); an empty text or `[]` is no
/// command.
pub fn parse_validation_command(s: &str) -> Result<Option<Vec<String>>, String> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    let argv: Vec<String> = serde_json::from_str(s).map_err(|e| {
        format!("expected a JSON array of strings such as [\"tt-smi\", \"-s\"]: {e}")
    })?;
    match argv.first() {
        None => Ok(None),
        Some(program) if program.is_empty() => {
            Err("the first item must name the program to run".into())
        }
        Some(_) => Ok(Some(argv)),
    }
}

/// The agent's validated configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The tt-kmd version to make loaded (`TT_KMD_VERSION`).
    pub target_version: KmdVersion,
    /// This node (`NODE_NAME`).
    pub node_name: String,
    /// Where the host's root is mounted (`TTDP_HOST_ROOT`).
    pub host: HostRoot,
    /// Real or simulated kernel (`TTDP_KERNEL`).
    pub kernel: KernelKind,
    /// The GCC major version the image builds with (`TTDP_BUILDER_GCC`); `None`: not declared,
    /// builds are not checked against the kernel's compiler.
    pub builder_gcc: Option<u32>,
    /// SIGKILL device holders before unloading (`TT_FORCE_UNLOAD`).
    pub force_unload: bool,
    /// Module parameters passed at load, space-separated `name=value` (`TT_KMD_PARAMETERS`;
    /// empty for none). The module counts as converged only when sysfs shows them.
    pub parameters: String,
    /// The commit the target's release tag must point at when it is built (`TT_KMD_COMMIT`,
    /// `spec.source.commit`); `None`: any.
    pub source_commit: Option<String>,
    /// A server of ready-built modules tried on a cache miss before building
    /// (`TT_KMD_PREBUILT_URL`, `spec.source.prebuilt`); `None`: every miss is built.
    pub prebuilt: Option<PrebuiltConfig>,
    /// The key every module is signed with before it is cached (`TTDP_MODULE_SIGNING_DIR`,
    /// `spec.module.signing`); `None`: modules are not signed.
    pub signing: Option<ttdp_kmod::SigningConfig>,
    /// tt-smi to copy to the host, `None` to skip.
    pub tt_smi: Option<TtSmiSource>,
    /// Where to fetch tt-kmd from and how to build it. `{release}` in `build.build_dir` stands for
    /// the host's kernel release (see [`AgentConfig::build_options`]).
    pub build: BuildOptions,
    /// The `.ko` cache directory as seen by the agent (`<host>/var/cache/tt-kmd`).
    pub cache_dir: PathBuf,
    /// The directory of the node-wide module lock as seen by the agent (`TTDP_LOCK_DIR`, default
    /// `<host>/run/ttdp`). Every agent on the node must see the same host directory.
    pub lock_dir: PathBuf,
    /// How often the agent re-reads the module and host (the spec's 10 s).
    pub probe_period: Duration,
    /// Back-off after failures and while the device is held.
    pub retry: RetryPolicy,
    /// With force unload: how long to wait for refcnt 0 after killing the holders.
    pub unload_wait: Duration,
    /// How often labels and the report are written again even when nothing changed (repairs
    /// edits made by others).
    pub resync_period: Duration,
    /// The post-load validation.
    pub validation: ValidationConfig,
    /// The `udevadm` run after the udev rule changed (`TTDP_UDEVADM`); `None`: never run.
    /// Never run with a simulated kernel.
    pub udevadm: Option<PathBuf>,
    /// How often, once the node is Ready, the agent looks again for installed kernels to
    /// prepare the target's module for, and prunes the cache (`TTDP_KERNEL_SCAN_PERIOD`).
    pub kernel_scan_period: Duration,
    /// The most the `.ko` cache may hold, in bytes (`TTDP_CACHE_SIZE_LIMIT`); the running
    /// kernel's target and loaded versions and each installed kernel's target stay even over it.
    pub cache_size_limit: u64,
}

/// The default of [`AgentConfig::cache_size_limit`]: 2 GiB, room for a few versions of a
/// module for each of a handful of kernels.
pub const DEFAULT_CACHE_SIZE_LIMIT: u64 = 2 << 30;

pub use ttdp_api::size::parse_size;

impl AgentConfig {
    /// A configuration with the defaults for everything but the target version, node and host.
    pub fn new(target_version: KmdVersion, node_name: &str, host: HostRoot) -> Self {
        let cache_dir = KoCache::new(&host).dir().to_path_buf();
        let lock_dir = host.path(MODULE_LOCK_DIR);
        Self {
            target_version,
            node_name: node_name.to_string(),
            host,
            kernel: KernelKind::Real,
            builder_gcc: None,
            force_unload: false,
            parameters: String::new(),
            source_commit: None,
            prebuilt: None,
            signing: None,
            tt_smi: None,
            build: BuildOptions {
                repository: ttdp_api::names::DEFAULT_KMD_REPOSITORY.to_string(),
                ..BuildOptions::default()
            },
            cache_dir,
            lock_dir,
            probe_period: Duration::from_secs(10),
            retry: RetryPolicy {
                initial: Duration::from_secs(5),
                max: Duration::from_secs(300),
            },
            unload_wait: Duration::from_secs(30),
            resync_period: Duration::from_secs(600),
            validation: ValidationConfig::default(),
            udevadm: Some(PathBuf::from("udevadm")),
            kernel_scan_period: Duration::from_secs(60),
            cache_size_limit: DEFAULT_CACHE_SIZE_LIMIT,
        }
    }

    /// The build options for a host running kernel `release`: `{release}` in the kernel build
    /// directory (e.g. `/lib/modules/{release}/build`, for pods that mount the host's
    /// `/lib/modules` and `/usr/src` at their own paths) is replaced by `release`.
    ///
    /// Without an explicit build directory, a pod that mounts the host's `/lib/modules` and
    /// `/usr/src` at their own paths (as ttdp's DaemonSet does) builds against
    /// `/lib/modules/<release>/build` when that tree exists in the container; otherwise the
    /// build tree is looked up under the host root.
    pub fn build_options(&self, release: &str) -> BuildOptions {
        let mut build = self.build.clone();
        build.build_dir = build
            .build_dir
            .map(|dir| PathBuf::from(dir.to_string_lossy().replace(RELEASE_PLACEHOLDER, release)))
            .or_else(|| {
                let own = PathBuf::from(format!("/lib/modules/{release}/build"));
                (!self.host.is_system() && own.join("Makefile").is_file()).then_some(own)
            });
        build
    }

    /// Checks the values that flags cannot check one by one (the target version needs no check:
    /// a [`KmdVersion`] is valid by construction).
    pub fn validate(&self) -> Result<(), ConfigError> {
        parse_object_name(&self.node_name).map_err(|problem| ConfigError::Invalid {
            variable: env::NODE_NAME,
            value: self.node_name.clone(),
            problem,
        })?;
        if let Some(tt_smi) = &self.tt_smi {
            parse_label_value(&tt_smi.version).map_err(|problem| ConfigError::Invalid {
                variable: env::TT_SMI_VERSION,
                value: tt_smi.version.clone(),
                problem,
            })?;
        }
        // the controller renders what the CRD validated; checked again as the env is user-settable
        if let Some(bad) = self
            .parameters
            .split_whitespace()
            .find(|p| ttdp_api::driver::module_settings::parameter_name(p).is_none())
        {
            return Err(ConfigError::Invalid {
                variable: env::TT_KMD_PARAMETERS,
                value: bad.to_string(),
                problem: "each parameter must be name=value with an identifier name and a value of letters, digits and -_.,:/+@%".into(),
            });
        }
        if self.probe_period.is_zero() {
            return Err(ConfigError::Invalid {
                variable: env::PROBE_PERIOD,
                value: "0s".into(),
                problem: "the probe period must be longer than 0".into(),
            });
        }
        Ok(())
    }
}

/// A Kubernetes object name (DNS subdomain: lowercase letters, digits, `-` and `.`, at most 253).
pub fn parse_object_name(s: &str) -> Result<String, String> {
    let valid = !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        Ok(s.to_string())
    } else {
        Err("expected a Kubernetes object name (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters)".into())
    }
}

/// A Kubernetes label value: at most 63 characters of letters, digits, `-`, `_` and `.`,
/// starting and ending with a letter or digit.
pub fn parse_label_value(s: &str) -> Result<String, String> {
    if is_label_value(s) && !s.is_empty() {
        Ok(s.to_string())
    } else {
        Err("expected a label value (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)".into())
    }
}

/// Whether `s` may be a label value (the empty string may).
pub fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

pub use ttdp_api::duration::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_size("2Gi"), Ok(2 << 30));
        assert_eq!(parse_size("3Ki"), Ok(3 << 10));
        for bad in ["", "Gi", "2GB", "-1", "1.5Gi", "99999999999999999999Gi"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn report_targets_parse() {
        assert_eq!("kube".parse(), Ok(ReportTarget::Kube));
        assert_eq!("none".parse(), Ok(ReportTarget::Disabled));
        assert_eq!(
            "file:/tmp/r.json".parse(),
            Ok(ReportTarget::File("/tmp/r.json".into()))
        );
        let err = "file:".parse::<ReportTarget>().unwrap_err();
        assert!(err.contains("file:PATH"), "{err}");
        assert!("stdout".parse::<ReportTarget>().is_err());
    }

    #[test]
    fn validation_commands_parse_from_json() {
        assert_eq!(
            parse_validation_command(r#"["tt-smi", "-s"]"#),
            Ok(Some(vec!["tt-smi".to_string(), "-s".to_string()]))
        );
        assert_eq!(parse_validation_command(""), Ok(None));
        assert_eq!(parse_validation_command("[]"), Ok(None));
        assert!(
            parse_validation_command("tt-smi -s")
                .unwrap_err()
                .contains("JSON array")
        );
        assert!(
            parse_validation_command(r#"["", "-s"]"#)
                .unwrap_err()
                .contains("program")
        );
    }

    #[test]
    fn a_pod_runs_the_agent_only_with_the_upgrade_grant_enforced() {
        let none = |_: &str| None::<String>;
        assert!(!runs_in_pod(none, false));
        assert!(runs_in_pod(none, true));
        for name in ["KUBERNETES_SERVICE_HOST", "POD_NAME", "POD_NAMESPACE"] {
            let set = |n: &str| (n == name).then(|| "x".to_owned());
            assert!(runs_in_pod(set, false), "{name}");
        }
        assert!(
            !runs_in_pod(|_| Some(String::new()), false),
            "empty is unset"
        );

        let file = ReportTarget::File("/tmp/r.json".into());
        for report in [&ReportTarget::Kube, &file, &ReportTarget::Disabled] {
            assert!(check_grant_enforced(report, false).is_ok(), "{report:?}");
        }
        assert!(check_grant_enforced(&ReportTarget::Kube, true).is_ok());
        for report in [&file, &ReportTarget::Disabled] {
            let err = check_grant_enforced(report, true).unwrap_err().to_string();
            assert!(
                err.contains("TTDP_REPORT") && err.contains("upgrade grant"),
                "{err}"
            );
        }
    }

    #[test]
    fn kernels_parse() {
        assert_eq!("real".parse(), Ok(KernelKind::Real));
        assert_eq!("sim".parse(), Ok(KernelKind::Sim));
        assert!(
            "qemu"
                .parse::<KernelKind>()
                .unwrap_err()
                .contains("real or sim")
        );
    }

    #[test]
    fn names_and_label_values_are_checked() {
        assert!(parse_object_name("node-1.example").is_ok());
        for bad in ["", "Node1", "-a", "a_b", "a."] {
            assert!(parse_object_name(bad).is_err(), "{bad}");
        }
        assert!(parse_label_value("3.4.0").is_ok());
        assert!(parse_label_value("v3.4.0_rc-1").is_ok());
        for bad in ["", "3.4.0+git", "-3", &"a".repeat(64)] {
            assert!(parse_label_value(bad).is_err(), "{bad}");
        }
        assert!(is_label_value(""));
    }

    fn v(text: &str) -> KmdVersion {
        text.parse().unwrap()
    }

    #[test]
    fn the_kernel_build_dir_gets_the_host_release() {
        let mut config = AgentConfig::new(v("2.8.0"), "node-1", HostRoot::new("/host"));
        assert_eq!(config.build_options("6.1.0-31-amd64").build_dir, None);
        config.build.build_dir = Some("/lib/modules/{release}/build".into());
        assert_eq!(
            config.build_options("6.1.0-31-amd64").build_dir,
            Some(PathBuf::from("/lib/modules/6.1.0-31-amd64/build"))
        );
    }

    #[test]
    fn the_module_lock_defaults_to_the_hosts_run_ttdp() {
        let config = AgentConfig::new(v("2.8.0"), "node-1", HostRoot::new("/host"));
        assert_eq!(config.lock_dir, PathBuf::from("/host/run/ttdp"));
    }

    #[test]
    fn validate_names_the_variable_at_fault() {
        let host = HostRoot::new("/host");
        let ok = AgentConfig::new(v("2.8.0"), "node-1", host.clone());
        ok.validate().unwrap();

        let bad_node = AgentConfig::new(v("2.8.0"), "Node_1", host.clone());
        assert!(
            bad_node
                .validate()
                .unwrap_err()
                .to_string()
                .contains("NODE_NAME")
        );

        let mut bad_params = ok.clone();
        bad_params.parameters = "reset_limit=5 x=$(reboot)".into();
        let err = bad_params.validate().unwrap_err().to_string();
        assert!(
            err.contains("TT_KMD_PARAMETERS") && err.contains("x=$(reboot)"),
            "{err}"
        );

        let mut bad_smi = ok.clone();
        bad_smi.tt_smi = Some(TtSmiSource {
            path: "/opt/ttdp/tt-smi".into(),
            version: "3.0+local".into(),
        });
        assert!(
            bad_smi
                .validate()
                .unwrap_err()
                .to_string()
                .contains("TT_SMI_VERSION")
        );
    }
}
