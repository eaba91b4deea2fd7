//! `ttdp-agent`: the node agent binary. Parses flags (each also an environment variable), sets up
//! logs, signals and the reporting backend, and runs [`ttdp_agent::run`]; `ttdp-agent probe` is
//! the exec readiness probe.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use ttdp_agent::config::{
    SERVICE_ACCOUNT_TOKEN, check_grant_enforced, parse_duration, parse_label_value,
    parse_object_name, parse_size, parse_validation_command, runs_in_pod,
};
use ttdp_agent::prebuilt_fetch::PrebuiltConfig;
use ttdp_agent::probe::ProbeChecks;
use ttdp_agent::proxy::ProxySettings;
use ttdp_agent::{
    AgentConfig, ConfigError, FileReporter, HostRoot, KernelKind, KmdVersion, KubeReporter,
    NoReporter, PodRef, ReportTarget, RetryPolicy, TtSmiSource, ValidationConfig,
};
use ttdp_api::names::{DEFAULT_KMD_REPOSITORY, env};
use ttdp_kmod::prebuilt::{
    KERNEL_RELEASE_PLACEHOLDER, PrebuiltFallback, PrebuiltPins, VERSION_PLACEHOLDER,
    parse_pinned_checksums,
};

/// How long, after the agent returned, threads still running an abandoned build may delay exit.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// The ttdp node agent: installs, upgrades and reports tt-kmd on this node.
#[derive(Debug, Parser)]
#[command(name = "ttdp-agent", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node flow until SIGTERM (the default; PID 1 of the agent container).
    Run(Box<RunArgs>),
    /// Readiness probe: exit 0 when the target version is loaded (and, with validation on, its
    /// devices work and the validation command passed) or the node is host-managed. Reads the
    /// host only; makes no API call.
    Probe(ProbeArgs),
}

/// What both subcommands need.
#[derive(Debug, Args)]
struct TargetArgs {
    /// tt-kmd version to make loaded (MAJOR.MINOR.PATCH), parsed here once.
    #[arg(long = "kmd-version", env = env::TT_KMD_VERSION, value_name = "TT_KMD_VERSION")]
    kmd_version: KmdVersion,
    /// Where the host's root file system is mounted.
    #[arg(long, env = env::HOST_ROOT, value_name = "TTDP_HOST_ROOT", default_value = "/host")]
    host_root: PathBuf,
    /// Module parameters passed at load, space-separated name=value (empty: none); the node
    /// is ready only when sysfs shows them.
    #[arg(long, env = env::TT_KMD_PARAMETERS, value_name = "TT_KMD_PARAMETERS", default_value = "")]
    kmd_parameters: String,
}

#[derive(Debug, Args)]
struct ProbeArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    validation: ValidationArgs,
    /// Directory of the node-wide module lock, which holds the validation record (default
    /// <host root>/run/ttdp).
    #[arg(long, env = env::LOCK_DIR, value_name = "TTDP_LOCK_DIR")]
    lock_dir: Option<PathBuf>,
}

/// The parsed `TT_KMD_PREBUILT_SHA256`.
#[derive(Debug, Clone)]
struct PinnedChecksums(BTreeMap<String, String>);

/// The parsed `TTDP_VALIDATION_COMMAND` (`None`: an empty text or `[]`).
#[derive(Debug, Clone)]
struct ValidationCommand(Option<Vec<String>>);

/// The post-load validation (`upgradePolicy.validation`), shared by the agent and the probe.
#[derive(Debug, Args)]
struct ValidationArgs {
    /// Prove a loaded module works before Ready: every Tenstorrent PCI device bound to
    /// `tenstorrent` with its /dev/tenstorrent node, and the validation command passing.
    #[arg(long, env = env::VALIDATE_DEVICES, value_name = "TTDP_VALIDATE_DEVICES", default_value = "true",
          num_args = 0..=1, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    validate_devices: bool,
    /// A command that must also exit 0 after a load, as a JSON array (e.g. ["tt-smi","-s"]).
    #[arg(long, env = env::VALIDATION_COMMAND, value_name = "TTDP_VALIDATION_COMMAND",
          value_parser = |s: &str| parse_validation_command(s).map(ValidationCommand))]
    validation_command: Option<ValidationCommand>,
    /// How long the validation command may run.
    #[arg(long, env = env::VALIDATION_TIMEOUT, value_name = "TTDP_VALIDATION_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    validation_timeout: Duration,
    /// How long after a load the devices may take to be bound and get their nodes.
    #[arg(long, env = env::VALIDATION_DEVICE_WAIT, value_name = "TTDP_VALIDATION_DEVICE_WAIT", default_value = "10s", value_parser = parse_duration)]
    validation_device_wait: Duration,
}

impl ValidationArgs {
    fn config(&self) -> ValidationConfig {
        ValidationConfig {
            enabled: self.validate_devices,
            device_wait: self.validation_device_wait,
            command: self.validation_command.clone().and_then(|c| c.0),
            command_timeout: self.validation_timeout,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// One JSON object per line (in the pod).
    Json,
    /// Human-readable lines.
    Text,
}

/// `spec.source.prebuilt.fallback`, spelled as in the policy.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum FallbackArg {
    /// Build the module from its tag.
    #[value(name = "Build")]
    Build,
    /// Fail the install.
    #[value(name = "Fail")]
    Fail,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// This node's name (downward API spec.nodeName); required with --report kube.
    #[arg(long, env = env::NODE_NAME, value_name = "NODE_NAME", value_parser = parse_object_name)]
    node_name: Option<String>,
    /// This pod's name (downward API); required with --report kube.
    #[arg(long, env = env::POD_NAME, value_name = "POD_NAME", value_parser = parse_object_name)]
    pod_name: Option<String>,
    /// This pod's namespace (downward API); required with --report kube.
    #[arg(long, env = env::POD_NAMESPACE, value_name = "POD_NAMESPACE", value_parser = parse_object_name)]
    pod_namespace: Option<String>,
    /// SIGKILL the processes holding /dev/tenstorrent before unloading.
    #[arg(long, env = env::TT_FORCE_UNLOAD, value_name = "TT_FORCE_UNLOAD", default_value = "false",
          num_args = 0..=1, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    force_unload: bool,
    /// Version of the bundled tt-smi (node label value); required when the tt-smi binary exists.
    #[arg(long, env = env::TT_SMI_VERSION, value_name = "TT_SMI_VERSION", value_parser = parse_label_value)]
    tt_smi_version: Option<String>,
    /// The bundled tt-smi binary copied to the host's /usr/local/bin/tt-smi; `none` to skip (a
    /// missing file with TT_SMI_VERSION unset also skips, with a warning).
    #[arg(
        long,
        env = env::TT_SMI_PATH,
        value_name = "TTDP_TT_SMI_PATH",
        default_value = "/opt/ttdp/tt-smi"
    )]
    tt_smi_path: String,
    /// The udevadm run to reload udev's rules after tt-kmd's rule was put in place; `none`
    /// writes the rule without telling udev.
    #[arg(long, env = env::UDEVADM, value_name = "TTDP_UDEVADM", default_value = "udevadm")]
    udevadm: String,
    /// A directory holding tls.key (the module signing key, PEM) and tls.crt (its certificate):
    /// every module is signed with it (the kernel's sign-file) before it is cached and loaded.
    #[arg(long, env = env::MODULE_SIGNING_DIR, value_name = "TTDP_MODULE_SIGNING_DIR")]
    module_signing_dir: Option<PathBuf>,
    /// Where the signing key comes from, named in messages (the DaemonSet sets
    /// <namespace>/<Secret>).
    #[arg(long, env = env::MODULE_SIGNING_SECRET, value_name = "TTDP_MODULE_SIGNING_SECRET")]
    module_signing_secret: Option<String>,
    /// The commit tag ttkmd-<version> must point at when the target is built (full hex); a tag
    /// that moved fails the build and nothing is unloaded.
    #[arg(long, env = env::TT_KMD_COMMIT, value_name = "TT_KMD_COMMIT", value_parser = parse_commit)]
    kmd_commit: Option<String>,
    /// URL template of ready-built modules, with {version} and {kernelRelease}; tried on a
    /// cache miss before building (its checksum is the same URL plus .sha256).
    #[arg(long, env = env::TT_KMD_PREBUILT_URL, value_name = "TT_KMD_PREBUILT_URL", value_parser = parse_prebuilt_url)]
    prebuilt_url: Option<String>,
    /// What a prebuilt module the server lacks (404) means: build it, or fail.
    #[arg(long, env = env::TT_KMD_PREBUILT_FALLBACK, value_name = "TT_KMD_PREBUILT_FALLBACK", value_enum, default_value = "Build")]
    prebuilt_fallback: FallbackArg,
    /// PEM CA certificates trusted for the prebuilt server, besides the system's.
    #[arg(long, env = env::TT_KMD_PREBUILT_CA_FILE, value_name = "TT_KMD_PREBUILT_CA_FILE")]
    prebuilt_ca_file: Option<PathBuf>,
    /// The sha256 each prebuilt module must have, a JSON object keyed
    /// "<version>/<kernelRelease>"; a module without one is downloaded only with
    /// --prebuilt-trust-server-checksum.
    #[arg(long, env = env::TT_KMD_PREBUILT_SHA256, value_name = "TT_KMD_PREBUILT_SHA256",
          value_parser = |s: &str| parse_pinned_checksums(s).map(PinnedChecksums))]
    prebuilt_sha256: Option<PinnedChecksums>,
    /// Trust the server's .sha256 file for a prebuilt module without a pinned checksum.
    #[arg(long, env = env::TT_KMD_PREBUILT_TRUST_SERVER_CHECKSUM, value_name = "TT_KMD_PREBUILT_TRUST_SERVER_CHECKSUM",
          default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    prebuilt_trust_server_checksum: bool,
    /// Allow plain http for prebuilt downloads and their redirects.
    #[arg(long, env = env::TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP, value_name = "TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP",
          default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    prebuilt_allow_insecure_http: bool,
    /// Follow redirects of prebuilt downloads to another host.
    #[arg(long, env = env::TT_KMD_PREBUILT_ALLOW_CROSS_HOST_REDIRECTS, value_name = "TT_KMD_PREBUILT_ALLOW_CROSS_HOST_REDIRECTS",
          default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    prebuilt_allow_cross_host_redirects: bool,
    /// Git repository tt-kmd is fetched from (URL or local path).
    #[arg(long, env = env::TT_KMD_REPOSITORY, value_name = "TT_KMD_REPOSITORY", default_value = DEFAULT_KMD_REPOSITORY)]
    kmd_repository: String,
    /// The GCC major version this image builds modules with (set by the builder image); unset:
    /// the image does not say, and the agent builds without checking the kernel's compiler.
    #[arg(long, env = ttdp_api::names::compiler::BUILDER_GCC_ENV, value_name = "TTDP_BUILDER_GCC", value_parser = clap::value_parser!(u32).range(1..))]
    builder_gcc: Option<u32>,
    /// `real`, or `sim` for the file-backed simulated kernel under the host root (builds with
    /// the `sim` feature only: tests and the demo).
    #[arg(long, env = env::KERNEL, value_name = "TTDP_KERNEL", default_value = "real")]
    kernel: KernelKind,
    /// `kube` (node labels, pod annotation, node Events), `file:PATH` (the same in a JSON file)
    /// or `none`; in a pod only `kube`, which waits for the controller's upgrade grant.
    #[arg(
        long,
        env = env::REPORT,
        value_name = "TTDP_REPORT",
        default_value = "kube"
    )]
    report: ReportTarget,
    /// Log format.
    #[arg(long, env = env::LOG_FORMAT, value_name = "TTDP_LOG_FORMAT", value_enum, default_value = "json")]
    log_format: LogFormat,
    /// The .ko cache directory as seen by the agent (default <host root>/var/cache/tt-kmd).
    #[arg(long, env = env::CACHE_DIR, value_name = "TTDP_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Directory of the node-wide module lock as seen by the agent (default <host root>/run/ttdp;
    /// the DaemonSet mounts the host's /run/ttdp there). Every agent on a node must share it.
    #[arg(long, env = env::LOCK_DIR, value_name = "TTDP_LOCK_DIR")]
    lock_dir: Option<PathBuf>,
    /// How often the module and host are re-read (readiness and labels follow within one period).
    #[arg(long, env = env::PROBE_PERIOD, value_name = "TTDP_PROBE_PERIOD", default_value = "10s", value_parser = parse_duration)]
    probe_period: Duration,
    /// First retry delay after a failure or while the device is held.
    #[arg(long, env = env::RETRY_INITIAL, value_name = "TTDP_RETRY_INITIAL", default_value = "5s", value_parser = parse_duration)]
    retry_initial: Duration,
    /// Longest retry delay after failures.
    #[arg(long, env = env::RETRY_MAX, value_name = "TTDP_RETRY_MAX", default_value = "5m", value_parser = parse_duration)]
    retry_max: Duration,
    /// `make -j` jobs (default: the CPUs available).
    #[arg(long, env = env::BUILD_JOBS, value_name = "TTDP_BUILD_JOBS", value_parser = clap::value_parser!(u16).range(1..))]
    build_jobs: Option<u16>,
    /// Limit for fetching the tt-kmd tag.
    #[arg(long, env = env::FETCH_TIMEOUT, value_name = "TTDP_FETCH_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    fetch_timeout: Duration,
    /// Limit for `make modules`.
    #[arg(long, env = env::BUILD_TIMEOUT, value_name = "TTDP_BUILD_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    build_timeout: Duration,
    /// Directory for temporary build trees (default: the system temporary directory).
    #[arg(long, env = env::BUILD_DIR, value_name = "TTDP_BUILD_DIR")]
    build_dir: Option<PathBuf>,
    /// Kernel build tree passed to `make -C` instead of <host root>/lib/modules/<release>/build;
    /// `{release}` stands for the host's kernel release (e.g. /lib/modules/{release}/build when
    /// the pod mounts the host's /lib/modules and /usr/src at their own paths).
    #[arg(
        long,
        env = env::KERNEL_BUILD_DIR,
        value_name = "TTDP_KERNEL_BUILD_DIR"
    )]
    kernel_build_dir: Option<PathBuf>,
    /// Extra `make` arguments, e.g. CC=x86_64-linux-gnu-gcc-12 (env: space-separated).
    #[arg(
        long = "make-arg",
        env = env::MAKE_ARGS,
        value_name = "TTDP_MAKE_ARGS",
        value_delimiter = ' '
    )]
    make_args: Vec<String>,
    /// With force unload: how long to wait for refcnt 0 after killing the holders.
    #[arg(long, env = env::UNLOAD_WAIT, value_name = "TTDP_UNLOAD_WAIT", default_value = "30s", value_parser = parse_duration)]
    unload_wait: Duration,
    #[command(flatten)]
    validation: ValidationArgs,
    /// How often, once Ready, installed kernels are looked for again (to build the target
    /// module for each before the node boots into it) and the .ko cache is pruned.
    #[arg(long, env = env::KERNEL_SCAN_PERIOD, value_name = "TTDP_KERNEL_SCAN_PERIOD", default_value = "60s", value_parser = parse_duration)]
    kernel_scan_period: Duration,
    /// The most the .ko cache may hold (bytes, or with Ki, Mi or Gi); the oldest entries that
    /// no kernel needs go first.
    #[arg(long, env = env::CACHE_SIZE_LIMIT, value_name = "TTDP_CACHE_SIZE_LIMIT", default_value = "2Gi", value_parser = parse_size)]
    cache_size_limit: u64,
    /// How often labels and the report are rewritten even when unchanged.
    #[arg(long, env = env::RESYNC_PERIOD, value_name = "TTDP_RESYNC_PERIOD", default_value = "10m", value_parser = parse_duration)]
    resync_period: Duration,
}

/// The signing key and certificate in `dir` (the Secret's volume), named after the Secret
/// `secret` (`<namespace>/<name>`) in messages, else after the directory.
fn module_signing(dir: &std::path::Path, secret: Option<&str>) -> ttdp_kmod::SigningConfig {
    use ttdp_api::driver::module_settings::{SIGNING_CERT_FILE, SIGNING_KEY_FILE};
    ttdp_kmod::SigningConfig {
        key: dir.join(SIGNING_KEY_FILE),
        cert: dir.join(SIGNING_CERT_FILE),
        source: match secret {
            Some(secret) => format!(
                "Secret {secret} (spec.module.signing, mounted at {})",
                dir.display()
            ),
            None => format!("the signing directory {}", dir.display()),
        },
    }
}

/// The node name used in file/none report modes when NODE_NAME is not set.
const LOCAL_NODE: &str = "local";

impl RunArgs {
    /// The agent configuration these arguments describe.
    fn config(&self) -> Result<AgentConfig, ConfigError> {
        let node = self.node()?;
        let host = HostRoot::new(&self.target.host_root);
        let mut config = AgentConfig::new(self.target.kmd_version.clone(), &node, host);
        config.kernel = self.kernel;
        config.builder_gcc = self.builder_gcc;
        config.force_unload = self.force_unload;
        config.parameters = self.target.kmd_parameters.clone();
        config.source_commit = self.kmd_commit.clone();
        config.signing = self
            .module_signing_dir
            .as_deref()
            .map(|dir| module_signing(dir, self.module_signing_secret.as_deref()));
        config.prebuilt = self.prebuilt();
        config.tt_smi = self.tt_smi()?;
        config.build.repository = self.kmd_repository.clone();
        if let Some(jobs) = self.build_jobs {
            config.build.jobs = usize::from(jobs);
        }
        config.build.fetch_timeout = self.fetch_timeout;
        config.build.build_timeout = self.build_timeout;
        config.build.work_dir = self.build_dir.clone();
        config.build.build_dir = self.kernel_build_dir.clone();
        config.build.make_args = self
            .make_args
            .iter()
            .filter(|a| !a.is_empty())
            .cloned()
            .collect();
        if let Some(dir) = &self.cache_dir {
            config.cache_dir = dir.clone();
        }
        if let Some(dir) = &self.lock_dir {
            config.lock_dir = dir.clone();
        }
        config.udevadm = (self.udevadm != "none").then(|| PathBuf::from(&self.udevadm));
        config.probe_period = self.probe_period;
        config.retry = RetryPolicy {
            initial: self.retry_initial,
            max: self.retry_max,
        };
        config.unload_wait = self.unload_wait;
        config.resync_period = self.resync_period;
        config.kernel_scan_period = self.kernel_scan_period;
        config.cache_size_limit = self.cache_size_limit;
        config.validation = self.validation.config();
        config.validate()?;
        let in_pod = runs_in_pod(
            |name| std::env::var(name).ok(),
            std::path::Path::new(SERVICE_ACCOUNT_TOKEN).exists(),
        );
        check_grant_enforced(&self.report, in_pod)?;
        Ok(config)
    }

    /// The node the agent runs on: `--node-name`, required with `--report kube`, else
    /// [`LOCAL_NODE`].
    fn node(&self) -> Result<String, ConfigError> {
        match (&self.node_name, &self.report) {
            (Some(node), _) => Ok(node.clone()),
            (None, ReportTarget::Kube) => Err(ConfigError::Missing {
                variable: env::NODE_NAME,
                flag: "--node-name",
                why: "to the node's name (downward API spec.nodeName) so the agent labels its own node",
            }),
            (None, _) => Ok(LOCAL_NODE.to_string()),
        }
    }

    /// Where prebuilt modules come from, with `--prebuilt-url`.
    fn prebuilt(&self) -> Option<PrebuiltConfig> {
        self.prebuilt_url.as_ref().map(|url| PrebuiltConfig {
            url_template: url.clone(),
            fallback: match self.prebuilt_fallback {
                FallbackArg::Build => PrebuiltFallback::Build,
                FallbackArg::Fail => PrebuiltFallback::Fail,
            },
            ca_file: self.prebuilt_ca_file.clone(),
            pins: PrebuiltPins {
                sha256: self
                    .prebuilt_sha256
                    .clone()
                    .map(|p| p.0)
                    .unwrap_or_default(),
                trust_server_checksum: self.prebuilt_trust_server_checksum,
            },
            allow_insecure_http: self.prebuilt_allow_insecure_http,
            allow_cross_host_redirects: self.prebuilt_allow_cross_host_redirects,
            proxies: ProxySettings::from_env(),
        })
    }

    /// The bundled tt-smi to install: none with `TTDP_TT_SMI_PATH=none` or when the image has
    /// none; its version is required when it has one.
    fn tt_smi(&self) -> Result<Option<TtSmiSource>, ConfigError> {
        let source = match (self.tt_smi_path.as_str(), &self.tt_smi_version) {
            ("none", _) => None,
            (path, Some(version)) => Some(TtSmiSource {
                path: PathBuf::from(path),
                version: version.clone(),
            }),
            (path, None) if !std::path::Path::new(path).exists() => {
                // an image without tt-smi (the simulator, the VM tests): nothing to copy or label
                tracing::warn!(
                    tt_smi_path = path,
                    "no bundled tt-smi and TT_SMI_VERSION is not set: tt-smi is not installed on the host"
                );
                None
            }
            (_, None) => {
                return Err(ConfigError::Missing {
                    variable: env::TT_SMI_VERSION,
                    flag: "--tt-smi-version",
                    why: "to the version of the bundled tt-smi found at TTDP_TT_SMI_PATH (the node label value), or set TTDP_TT_SMI_PATH=none to skip tt-smi",
                });
            }
        };
        Ok(source)
    }

    /// The agent pod, required with `--report kube`.
    fn pod(&self) -> Result<PodRef, ConfigError> {
        let missing = |variable, flag| ConfigError::Missing {
            variable,
            flag,
            why: "(downward API) so the agent can publish its report on its own pod",
        };
        Ok(PodRef {
            name: self
                .pod_name
                .clone()
                .ok_or_else(|| missing(env::POD_NAME, "--pod-name"))?,
            namespace: self
                .pod_namespace
                .clone()
                .ok_or_else(|| missing(env::POD_NAMESPACE, "--pod-namespace"))?,
        })
    }
}

/// The arguments with `run` inserted when no subcommand is given, so the image's plain
/// `ttdp-agent` (or `ttdp-agent --flag ...`) runs the agent.
fn args_with_default_command() -> Vec<OsString> {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let first = args.get(1).and_then(|a| a.to_str()).map(str::to_string);
    let explicit = match first.as_deref() {
        None => false,
        Some("-h" | "--help" | "-V" | "--version" | "help") => true,
        Some(arg) => !arg.starts_with('-'),
    };
    if !explicit {
        args.insert(1.min(args.len()), OsString::from("run"));
    }
    args
}

/// The client for the API server, reached directly: the pod's proxy settings are for its
/// downloads, and in a cluster the API server's Service is always reachable without one.
async fn api_client() -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::infer().await?;
    config.proxy_url = None;
    Ok(kube::Client::try_from(config)?)
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(args_with_default_command());
    match cli.command {
        Command::Probe(args) => probe(&args),
        Command::Run(args) => match run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "agent stopped");
                eprintln!("ttdp-agent: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `ttdp-agent probe`: prints the reason, exits 0 when ready and 1 when not.
fn probe(args: &ProbeArgs) -> ExitCode {
    let host = HostRoot::new(&args.target.host_root);
    let mut checks = ProbeChecks::defaults(&host);
    checks.validation = args.validation.config();
    checks.parameters = args.target.kmd_parameters.clone();
    if let Some(dir) = &args.lock_dir {
        checks.lock_dir = dir.clone();
    }
    let readiness = ttdp_agent::probe::readiness_with(&host, &args.target.kmd_version, &checks);
    println!("{}", readiness.reason());
    if readiness.is_ready() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// `ttdp-agent run`.
fn run(args: &RunArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
    let config = args.config()?;
    // one thread is plenty for one node's flow (blocking work has threads of its own), and
    // starts sooner: the agent's start delays the node's return to service
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(async {
        let shutdown = ttdp_agent::signals::shutdown_on_signals()
            .context("cannot install the SIGTERM/SIGINT handlers")?;
        match &args.report {
            ReportTarget::Kube => {
                let pod = args.pod()?;
                let client = api_client().await.context(
                    "cannot build a kubernetes client (in-cluster service account or KUBECONFIG)",
                )?;
                let reporter = KubeReporter::new(client, &config.node_name, pod);
                ttdp_agent::run(config, reporter, shutdown).await?;
            }
            ReportTarget::File(path) => {
                let reporter = FileReporter::new(path, &config.node_name);
                ttdp_agent::run(config, reporter, shutdown).await?;
            }
            ReportTarget::Disabled => ttdp_agent::run(config, NoReporter, shutdown).await?,
        }
        anyhow::Ok(())
    });
    // a build abandoned on shutdown may still run in a blocking thread: do not wait for it
    runtime.shutdown_timeout(EXIT_GRACE);
    result
}

/// A full git object name (40 hex digits, or 64 in a SHA-256 repository), lowercased.
fn parse_commit(s: &str) -> Result<String, String> {
    let hex = matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| s.to_ascii_lowercase())
        .ok_or_else(|| "expected a full commit id (40 hex digits)".to_string())
}

fn parse_prebuilt_url(s: &str) -> Result<String, String> {
    let http = s.starts_with("http://") || s.starts_with("https://");
    let placeholders = [VERSION_PLACEHOLDER, KERNEL_RELEASE_PLACEHOLDER]
        .iter()
        .all(|p| s.contains(p));
    (http && placeholders && !s.contains(char::is_whitespace))
        .then(|| s.to_owned())
        .ok_or_else(|| {
            format!("expected an http:// or https:// URL with {VERSION_PLACEHOLDER} and {KERNEL_RELEASE_PLACEHOLDER}, without spaces")
        })
}
