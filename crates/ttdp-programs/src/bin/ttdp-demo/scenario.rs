//! The demo's story, step by step: choose and start the cluster (see `cluster_source`), install
//! the CRD, start the real controller, install tt-kmd `--from` with a policy, place workloads
//! that use the device, bump the policy to `--to`, follow the rollout live, check the result,
//! print the timings, and keep the cluster up for the user until Ctrl-C (see `ending`).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use ttdp_programs::rollout_watch::{is_rolled_out, stragglers};
use ttdp_programs::{ControllerProcess, RolloutWatch};
use ttdp_testkit::cluster_setup::{
    create_operator_namespace, create_policy, install_crd, set_policy_version,
};
use ttdp_testkit::sim::{DisruptionLimit, SCENARIO_LABEL, SimCluster, eventually, pod_is_ready};

use crate::args::{DemoArgs, duration_flag};
use crate::cluster_source::{ClusterSource, DemoNames, publish_kubeconfig};
use crate::fleet::{Fleet, INFERENCE_BUDGET, INFERENCE_LABEL};
use crate::live_view::flush;
use crate::timings::Phase;

/// The installer image's name without its tag: the controller puts it in the DaemonSet, and the
/// simulated kubelets run the agent binary for it.
const INSTALLER_IMAGE: &str = "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder";
/// The tt-smi version the simulated agent image "bundles".
const TT_SMI_VERSION: &str = "3.0.0";
/// How long the placed workloads may take to run.
const SETUP_WAIT: Duration = Duration::from_secs(60);
/// Smallest interval between two redraws on a terminal.
const REDRAW_EVERY: Duration = Duration::from_millis(300);
/// Redraw at least this often on a terminal (the AGE column moves).
const REDRAW_AT_LEAST: Duration = Duration::from_secs(3);

/// How the demo ended.
#[derive(Debug)]
pub enum Ending {
    /// The upgrade reached Ready and every check passed.
    Success,
    /// Something failed; the messages say what.
    Failure(Vec<String>),
    /// Ctrl-C or SIGTERM arrived before the end.
    Interrupted,
}

/// Runs the demo; `log_dir` receives the controller's log and the fake tt-smi.
pub async fn run(args: DemoArgs, log_dir: PathBuf) -> Result<Ending> {
    check_binaries(&args)?;
    let epoch = Instant::now();
    let source = ClusterSource::choose(args.kubeconfig.as_deref())?;
    println!("{}", source.description);
    let names = source.names();
    let fleet = Fleet {
        prefix: names.prefix.clone(),
        tenstorrent: usize::from(args.nodes),
        plain: usize::from(args.plain_nodes),
    };
    println!(
        "ttdp demo: {} Tenstorrent nodes ({} host-managed) and {} plain node(s), tt-kmd {} then {}, maxUnavailable {}, speed {}",
        fleet.tenstorrent,
        usize::from(fleet.has_host_managed()),
        fleet.plain,
        args.from,
        args.to,
        args.max_unavailable,
        args.speed
    );
    println!("logs: {}", log_dir.display());

    print_step("starting the simulated nodes (kubelets, simulated kernels)");
    // On an error `source` drops, which stops a launched control plane.
    let cluster = start_cluster(&args, &fleet, &source, &log_dir).await?;
    let kubeconfig = publish_kubeconfig(&cluster, &source, args.write_kubeconfig.as_deref())?;
    let mut demo = Demo {
        redraw: !args.plain && std::io::stdout().is_terminal(),
        args,
        fleet,
        names,
        source,
        client: cluster.client(),
        cluster,
        kubeconfig,
        log_dir,
        controller: None,
        watch: None,
        phases: Vec::new(),
        phase_started: epoch,
        epoch,
        upgrade_started: None,
        placed: BTreeMap::new(),
    };
    demo.end_phase("start the cluster and the simulated nodes");
    let ending = tokio::select! {
        result = demo.story() => match result {
            Ok(()) => Ending::Success,
            Err(e) => Ending::Failure(vec![format!("{e:#}")]),
        },
        () = shutdown_signal() => Ending::Interrupted,
    };
    Ok(demo.finish(ending).await)
}

/// The demo's state from a started cluster to the end.
pub struct Demo {
    pub args: DemoArgs,
    pub fleet: Fleet,
    pub names: DemoNames,
    pub source: ClusterSource,
    pub cluster: SimCluster,
    pub client: Client,
    /// The kubeconfig shown to the user (see `publish_kubeconfig`).
    pub kubeconfig: PathBuf,
    pub log_dir: PathBuf,
    pub controller: Option<ControllerProcess>,
    pub watch: Option<RolloutWatch>,
    /// The phases done so far, and when the current one began.
    pub phases: Vec<Phase>,
    phase_started: Instant,
    /// When the demo started: transitions show the time since.
    pub epoch: Instant,
    /// Whether the live view redraws the screen (else it prints transitions line by line).
    pub redraw: bool,
    pub upgrade_started: Option<Instant>,
    /// Each workload's first pod's uid.
    pub placed: BTreeMap<String, String>,
}

impl Demo {
    /// Everything up to the checked upgrade.
    async fn story(&mut self) -> Result<()> {
        print_step("installing the TenstorrentDriverPolicy CRD and the operator namespace");
        install_crd(&self.client).await?;
        create_operator_namespace(&self.client, &self.names.operator_namespace).await?;
        print_step("starting the real ttdp-controller binary");
        self.controller = Some(self.start_controller()?);
        self.watch = Some(RolloutWatch::start(self.client.clone(), &self.names.policy));
        self.end_phase("install the CRD, start the controller");

        let deadline = Instant::now() + self.args.timeout;
        let (policy, from) = (&self.names.policy, &self.args.from);
        print_step(&format!(
            "applying TenstorrentDriverPolicy {policy} at tt-kmd {from} (fresh install)"
        ));
        self.apply_policy().await?;
        self.follow(&format!("fresh install of tt-kmd {from}"), from, deadline)
            .await?;
        let nodes = self.fleet.tenstorrent;
        self.end_phase(&format!("fresh install of {from} on {nodes} nodes"));

        print_step("placing workloads that hold /dev/tenstorrent, and a PodDisruptionBudget");
        self.place_workloads().await?;
        self.end_phase("place workloads");

        let (policy, from, to) = (&self.names.policy, &self.args.from, &self.args.to);
        print_step(&format!(
            "bumping {policy} to tt-kmd {to} (kubectl patch ttdp {policy} --type merge -p '{{\"spec\":{{\"version\":\"{to}\"}}}}')"
        ));
        self.upgrade_started = Some(Instant::now());
        set_policy_version(&self.client, policy, to).await?;
        self.follow(&format!("upgrade {from} → {to}"), to, deadline)
            .await?;
        self.end_phase(&format!("upgrade {from} → {to} (drain, swap, uncordon)"));
        Ok(())
    }

    /// Records the phase that ends now as `name`; the next one starts.
    fn end_phase(&mut self, name: &str) {
        self.phases.push(Phase {
            name: name.to_owned(),
            seconds: self.phase_started.elapsed().as_secs_f64(),
        });
        self.phase_started = Instant::now();
    }

    /// Where the controller's output goes.
    pub fn controller_log(&self) -> PathBuf {
        self.log_dir.join("controller.log")
    }

    /// The real controller, its retries scaled by `--speed`, reconciling only the demo's policy
    /// on a shared cluster.
    fn start_controller(&self) -> Result<ControllerProcess> {
        let speed = self.args.speed;
        let mut flags = vec![
            format!("--namespace={}", self.names.operator_namespace),
            format!("--default-image={INSTALLER_IMAGE}:demo"),
            format!("--retry-base-seconds={}", scaled_seconds(30.0, speed)),
            format!("--retry-max-seconds={}", scaled_seconds(600.0, speed)),
            format!("--kmd-repository={}", self.cluster.kmd_repo().url()),
        ];
        if !self.names.own_cluster {
            let prefix = &self.names.prefix;
            flags.push(format!("--policy-selector={SCENARIO_LABEL}={prefix}"));
        }
        ControllerProcess::start(
            &self.args.controller,
            &self.kubeconfig,
            &flags,
            &std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned()),
            &self.controller_log(),
        )
    }

    async fn apply_policy(&self) -> Result<()> {
        let max_unavailable = match self.args.max_unavailable.parse::<i64>() {
            Ok(n) => json!(n),
            Err(_) => json!(self.args.max_unavailable),
        };
        // On its own cluster the policy selects every Tenstorrent node, as in the README.
        let affinity = if self.names.own_cluster {
            json!({})
        } else {
            json!({ "matchLabels": { SCENARIO_LABEL: self.names.prefix } })
        };
        let metadata = json!({
            "name": self.names.policy,
            "labels": { SCENARIO_LABEL: self.names.prefix },
        });
        let spec = json!({
            "version": self.args.from,
            "nodeAffinity": affinity,
            "upgradePolicy": { "maxUnavailable": max_unavailable },
        });
        create_policy(&self.client, metadata, spec).await
    }

    async fn place_workloads(&mut self) -> Result<()> {
        let cluster = &self.cluster;
        let workloads = self.fleet.workloads();
        for workload in &workloads {
            let pod = cluster.add_workload(workload).await.with_context(|| {
                format!(
                    "cannot place workload {} on {}",
                    workload.name, workload.node
                )
            })?;
            self.placed
                .insert(workload.name.clone(), pod.uid().unwrap_or_default());
        }
        cluster
            .add_disruption_budget(
                INFERENCE_BUDGET,
                BTreeMap::from([(INFERENCE_LABEL.0.to_owned(), INFERENCE_LABEL.1.to_owned())]),
                // One replica may be down at a time.
                DisruptionLimit::MaxUnavailable(IntOrString::Int(1)),
            )
            .await
            .context("cannot create the inference PodDisruptionBudget")?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), cluster.namespace());
        let expected = workloads.len();
        eventually("the workloads to run", SETUP_WAIT, || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&ListParams::default()).await.ok()?;
                let ready = list.items.iter().filter(|p| pod_is_ready(p)).count();
                (ready >= expected).then_some(())
            }
        })
        .await?;
        for workload in &workloads {
            println!(
                "  {:<12} on {:<12} {}",
                workload.name,
                workload.node,
                describe_device(workload)
            );
        }
        Ok(())
    }

    /// Shows the rollout until the policy is Ready at `version`, the controller dies or
    /// `deadline` passes.
    async fn follow(&self, title: &str, version: &str, deadline: Instant) -> Result<()> {
        let Some(watch) = &self.watch else {
            bail!("the rollout watch is not running");
        };
        let mut changes = watch.changes();
        let mut printed = watch.transitions().len();
        let mut last_draw: Option<Instant> = None;
        let mut changed = true;
        let started = Instant::now();
        loop {
            let policy = watch.policy();
            let ready = policy
                .as_ref()
                .is_some_and(|p| is_rolled_out(p, version, self.fleet.tenstorrent));
            if !self.redraw {
                self.print_new_transitions(watch, &mut printed);
            } else if let Some(policy) = &policy
                && last_draw.is_none_or(|t| {
                    ready
                        || (changed && t.elapsed() >= REDRAW_EVERY)
                        || t.elapsed() >= REDRAW_AT_LEAST
                })
            {
                self.redraw_frame(&self.header(title, started, policy), &watch.transitions())
                    .await;
                last_draw = Some(Instant::now());
                changed = false;
            }
            if ready {
                tracing::info!(policy = %serde_json::to_string(&policy).unwrap_or_default(), "{title}: Ready");
                if !self.redraw {
                    self.print_table(&format!("{title}: Ready")).await;
                }
                let seconds = started.elapsed().as_secs_f64();
                println!("\n{title}: Ready after {seconds:.1} s");
                return Ok(());
            }
            if let Some(controller) = &self.controller {
                controller.check_running()?;
            }
            if Instant::now() >= deadline {
                let stuck = policy
                    .as_ref()
                    .map_or_else(|| vec!["the policy was never seen".to_owned()], stragglers);
                bail!(
                    "{title} did not finish within --timeout {} s{}",
                    self.args.timeout.as_secs(),
                    stuck
                        .iter()
                        .map(|line| format!("\n  {line}"))
                        .collect::<String>()
                );
            }
            tokio::select! {
                result = changes.changed() => {
                    if result.is_err() {
                        bail!("the watch on TenstorrentDriverPolicy {} ended", self.names.policy);
                    }
                    changed = true;
                }
                () = tokio::time::sleep(REDRAW_EVERY) => {}
            }
        }
    }
}

/// Fails early, with the command that builds them, when a binary is missing.
fn check_binaries(args: &DemoArgs) -> Result<()> {
    for (what, path) in [
        ("controller", &args.controller),
        ("agent", &args.agent),
        ("kubectl plugin", &args.plugin),
    ] {
        if !path.is_file() {
            bail!(
                "the {what} binary {} does not exist; build it with `cargo build --workspace --bins` (or run `cargo xtask demo`)",
                path.display()
            );
        }
    }
    Ok(())
}

async fn start_cluster(
    args: &DemoArgs,
    fleet: &Fleet,
    source: &ClusterSource,
    log_dir: &Path,
) -> Result<SimCluster> {
    let tt_smi = log_dir.join("tt-smi");
    write_fake_tt_smi(&tt_smi)?;
    let scaled = |seconds: f64| duration_flag(Duration::from_secs_f64(seconds * args.speed));
    let options = fleet
        .cluster_options()
        .image(INSTALLER_IMAGE, &args.agent)
        .time_scale(args.speed)
        .kmd_versions(&[&args.from, &args.to])
        .env("TTDP_TT_SMI_PATH", &tt_smi.display().to_string())
        // As the agent image's ENV: the version of the tt-smi it carries.
        .env("TT_SMI_VERSION", TT_SMI_VERSION)
        .env("TTDP_PROBE_PERIOD", &scaled(10.0))
        .env("TTDP_RETRY_INITIAL", &scaled(5.0))
        .env("TTDP_RETRY_MAX", &scaled(60.0))
        .env("TTDP_BUILD_JOBS", "1");
    let options = match &source.kubeconfig {
        Some(kubeconfig) => options.existing_cluster(kubeconfig),
        None => options.in_process(),
    };
    SimCluster::start(options)
        .await
        .context("cannot start the simulated nodes")
}

/// A stand-in for the tt-smi binary the agent image bundles; the agent copies it to each host.
fn write_fake_tt_smi(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let script =
        format!("#!/bin/sh\necho \"tt-smi {TT_SMI_VERSION} (simulated by the ttdp demo)\"\n");
    std::fs::write(path, script).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", path.display()))
}

/// `seconds` scaled by `speed`, in whole seconds, at least 1 (the controller's flags' unit).
fn scaled_seconds(seconds: f64, speed: f64) -> u64 {
    Duration::from_secs_f64(seconds * speed).as_secs().max(1)
}

fn describe_device(workload: &ttdp_testkit::sim::Workload) -> &'static str {
    match workload.device {
        ttdp_testkit::sim::DeviceUse::HostPath => "mounts /dev/tenstorrent (hostPath)",
        ttdp_testkit::sim::DeviceUse::Resource => "requests tenstorrent.com/n300",
        ttdp_testkit::sim::DeviceUse::None => "uses no device",
    }
}

pub fn print_step(what: &str) {
    println!("==> {what}");
    flush();
}

/// Resolves on Ctrl-C or SIGTERM (never, if their handlers cannot be installed). It listens
/// from the call on, not from the first poll: a Ctrl-C that comes between the call and the
/// await (while the hints are printed, on a loaded machine) is not lost.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let listeners = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        let (Ok(mut interrupt), Ok(mut terminate)) = listeners else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    }
}
