//! The demo's story, step by step: start the simulated cluster, install the CRD, start the real
//! controller, install tt-kmd `--from` with a policy, place workloads that use the device, bump
//! the policy to `--to`, follow the rollout live, check the result, print the timings, and keep
//! the cluster up for the user until Ctrl-C.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::{DEFAULT_NAMESPACE, labels};
use ttdp_testkit::sim::{DisruptionLimit, SimCluster, eventually};

use crate::args::{DemoArgs, duration_flag};
use crate::controller_process::{ControllerConfig, ControllerProcess, log_tail};
use crate::final_state::{self, Outcome};
use crate::fleet::{Fleet, INFERENCE_BUDGET};
use crate::hints;
use crate::live_view::{LiveView, flush, transition_line};
use crate::rollout_tracker::{RolloutTracker, is_ready, stragglers};
use crate::timings::{self, Phase, RolloutTimes};

/// The policy the demo creates.
pub const POLICY: &str = "default";
/// The installer image the controller puts in the DaemonSet; the simulated kubelets run the
/// agent binary for it.
pub const INSTALLER_IMAGE: &str = "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:demo";
/// The image prefix mapped to the agent binary.
const INSTALLER_IMAGE_PREFIX: &str = "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder";
/// The agent's ServiceAccount (the chart creates it).
const AGENT_SERVICE_ACCOUNT: &str = "ttdp-agent";
/// The tt-smi version the simulated agent image "bundles".
const TT_SMI_VERSION: &str = "3.0.0";
/// The field manager of the demo's own writes.
const FIELD_MANAGER: &str = "ttdp-demo";
/// Bound of the short setup waits (CRD served, workloads running).
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
    let fleet = Fleet {
        tenstorrent: usize::from(args.nodes),
        plain: usize::from(args.plain_nodes),
    };
    let redraw = !args.plain && std::io::stdout().is_terminal();
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

    let mut phases = Vec::new();
    let step = Instant::now();
    print_step("starting the simulated cluster (test API server, kubelets, simulated kernels)");
    let cluster = start_cluster(&args, &fleet, &log_dir).await?;
    let client = cluster.client();
    let kubeconfig = publish_kubeconfig(&cluster, args.kubeconfig.as_deref())?;
    phases.push(phase("start the simulated cluster", step));

    let mut demo = Demo {
        args,
        fleet,
        cluster,
        client,
        kubeconfig,
        log_dir,
        controller: None,
        tracker: None,
        phases,
        epoch,
        redraw,
        upgrade_started: None,
    };
    let ending = tokio::select! {
        result = demo.story() => match result {
            Ok(()) => Ending::Success,
            Err(e) => Ending::Failure(vec![format!("{e:#}")]),
        },
        () = shutdown_signal() => Ending::Interrupted,
    };
    let ending = demo.finish(ending).await;
    Ok(ending)
}

struct Demo {
    args: DemoArgs,
    fleet: Fleet,
    cluster: SimCluster,
    client: Client,
    kubeconfig: PathBuf,
    log_dir: PathBuf,
    controller: Option<ControllerProcess>,
    tracker: Option<RolloutTracker>,
    phases: Vec<Phase>,
    epoch: Instant,
    redraw: bool,
    upgrade_started: Option<Duration>,
}

impl Demo {
    /// Everything up to the checked upgrade.
    async fn story(&mut self) -> Result<()> {
        let step = Instant::now();
        print_step("installing the TenstorrentDriverPolicy CRD and the operator namespace");
        install_crd(&self.client).await?;
        create_operator_namespace(&self.client).await?;
        print_step("starting the real ttdp-controller binary");
        let config = ControllerConfig {
            binary: self.args.controller.clone(),
            kubeconfig: self.kubeconfig.clone(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            installer_image: INSTALLER_IMAGE.to_owned(),
            kmd_repository: self.cluster.kmd_repo().url(),
            retry_base_seconds: scaled_seconds(30.0, self.args.speed),
            retry_max_seconds: scaled_seconds(600.0, self.args.speed),
            log_file: self.log_dir.join("controller.log"),
        };
        self.controller = Some(ControllerProcess::start(&config)?);
        self.tracker = Some(RolloutTracker::start(
            self.client.clone(),
            POLICY,
            self.epoch,
        ));
        self.phases
            .push(phase("install the CRD, start the controller", step));

        let deadline = Instant::now() + self.args.timeout;
        let step = Instant::now();
        print_step(&format!(
            "applying TenstorrentDriverPolicy {POLICY} at tt-kmd {} (fresh install)",
            self.args.from
        ));
        self.apply_policy().await?;
        let title = format!("fresh install of tt-kmd {}", self.args.from);
        self.follow(&title, &self.args.from, deadline).await?;
        self.phases.push(phase(
            &format!(
                "fresh install of {} on {} nodes",
                self.args.from, self.fleet.tenstorrent
            ),
            step,
        ));

        let step = Instant::now();
        print_step("placing workloads that hold /dev/tenstorrent, and a PodDisruptionBudget");
        self.place_workloads().await?;
        self.phases.push(phase("place workloads", step));

        let step = Instant::now();
        print_step(&format!(
            "bumping {POLICY} to tt-kmd {} (kubectl patch ttdp {POLICY} --type merge -p '{{\"spec\":{{\"version\":\"{}\"}}}}')",
            self.args.to, self.args.to
        ));
        self.upgrade_started = Some(self.epoch.elapsed());
        self.bump_policy().await?;
        let title = format!("upgrade {} → {}", self.args.from, self.args.to);
        self.follow(&title, &self.args.to, deadline).await?;
        self.phases.push(phase(
            &format!(
                "upgrade {} → {} (drain, swap, uncordon)",
                self.args.from, self.args.to
            ),
            step,
        ));
        Ok(())
    }

    async fn apply_policy(&self) -> Result<()> {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.client.clone());
        let max_unavailable = match self.args.max_unavailable.parse::<i64>() {
            Ok(n) => json!(n),
            Err(_) => json!(self.args.max_unavailable),
        };
        let policy: TenstorrentDriverPolicy = serde_json::from_value(json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            // Created with the controller's finalizer already in place: the test API server's JSON
            // patch rejects kube-runtime's `test /metadata/finalizers == null` when the field is
            // absent (a real API server accepts it), which would keep the controller from adding it.
            "metadata": { "name": POLICY, "finalizers": [ttdp_api::names::FINALIZER] },
            "spec": {
                "version": self.args.from,
                "nodeAffinity": {},
                "upgradePolicy": { "maxUnavailable": max_unavailable },
            },
        }))
        .context("the demo's policy does not deserialize")?;
        api.create(&PostParams::default(), &policy)
            .await
            .with_context(|| format!("cannot create TenstorrentDriverPolicy {POLICY}"))?;
        Ok(())
    }

    async fn bump_policy(&self) -> Result<()> {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.client.clone());
        let patch = json!({ "spec": { "version": self.args.to } });
        api.patch(POLICY, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| {
                format!(
                    "cannot patch TenstorrentDriverPolicy {POLICY} to {}",
                    self.args.to
                )
            })?;
        Ok(())
    }

    async fn place_workloads(&self) -> Result<()> {
        let workloads = self.fleet.workloads();
        for (workload, _) in &workloads {
            self.cluster.add_workload(workload).await.with_context(|| {
                format!(
                    "cannot place workload {} on {}",
                    workload.name, workload.node
                )
            })?;
        }
        self.cluster
            .add_disruption_budget(
                INFERENCE_BUDGET,
                Fleet::inference_selector(),
                DisruptionLimit::MaxUnavailable(Fleet::inference_limit()),
            )
            .await
            .context("cannot create the inference PodDisruptionBudget")?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.cluster.namespace());
        let expected = workloads.len();
        eventually("the workloads to run", SETUP_WAIT, || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&ListParams::default()).await.ok()?;
                let ready = list.items.iter().filter(|p| pod_ready(p)).count();
                (ready >= expected).then_some(())
            }
        })
        .await?;
        for (workload, _) in &workloads {
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
    /// `deadline` passes. The tracker's copy of the policy may still be the one from before the
    /// patch (a status write that raced it), so the spec's version must be `version` too.
    async fn follow(&self, title: &str, version: &str, deadline: Instant) -> Result<()> {
        let Some(tracker) = &self.tracker else {
            bail!("the rollout tracker is not running");
        };
        let view = self.view();
        let mut changes = tracker.changes();
        let mut printed = tracker.transitions().len();
        let mut last_draw: Option<Instant> = None;
        let mut dirty = true;
        let started = Instant::now();
        let expected = self.fleet.tenstorrent;
        loop {
            let policy = tracker.policy();
            if let Some(policy) = &policy
                && policy.spec.version == version
                && is_ready(policy, expected)
            {
                tracing::info!(
                    policy = %serde_json::to_string(policy).unwrap_or_default(),
                    "{title}: Ready"
                );
                if self.redraw {
                    view.redraw_frame(&self.header(title, started, policy), &tracker.transitions())
                        .await;
                } else {
                    self.print_new_transitions(tracker, &mut printed);
                    view.print_table(&format!("{title}: Ready")).await;
                }
                println!(
                    "\n{title}: Ready after {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            self.check_controller_alive()?;
            if Instant::now() >= deadline {
                let mut message = format!(
                    "{title} did not finish within --timeout {} s",
                    self.args.timeout.as_secs()
                );
                match &policy {
                    Some(policy) => {
                        for line in stragglers(policy) {
                            message.push_str(&format!("\n  {line}"));
                        }
                    }
                    None => message.push_str("\n  the policy was never seen"),
                }
                bail!(message);
            }
            if self.redraw {
                let due = last_draw.is_none_or(|t| {
                    (dirty && t.elapsed() >= REDRAW_EVERY) || t.elapsed() >= REDRAW_AT_LEAST
                });
                if due && let Some(policy) = &policy {
                    view.redraw_frame(&self.header(title, started, policy), &tracker.transitions())
                        .await;
                    last_draw = Some(Instant::now());
                    dirty = false;
                }
            } else {
                self.print_new_transitions(tracker, &mut printed);
            }
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        bail!("the watch on TenstorrentDriverPolicy {POLICY} ended");
                    }
                    dirty = true;
                }
                () = tokio::time::sleep(REDRAW_EVERY) => {}
            }
        }
    }

    fn print_new_transitions(&self, tracker: &RolloutTracker, printed: &mut usize) {
        let new = tracker.transitions_since(*printed);
        for t in &new {
            println!("{}", transition_line(t));
        }
        *printed += new.len();
        flush();
    }

    fn header(&self, title: &str, started: Instant, policy: &TenstorrentDriverPolicy) -> String {
        let summary = policy
            .status
            .as_ref()
            .and_then(|s| s.summary.as_ref())
            .map(|s| {
                format!(
                    "{} matched: {} up to date, {} in progress, {} pending, {} failed, {} host-managed",
                    s.matched, s.up_to_date, s.in_progress, s.pending, s.failed, s.host_managed
                )
            })
            .unwrap_or_else(|| "waiting for the controller's first status".to_owned());
        format!(
            "ttdp demo · {} Tenstorrent + {} plain nodes · maxUnavailable {} · speed {}\n{title} · {:.1} s (total {:.1} s) · {summary}\n$ kubectl tt driver nodes {POLICY}",
            self.fleet.tenstorrent,
            self.fleet.plain,
            self.args.max_unavailable,
            self.args.speed,
            started.elapsed().as_secs_f64(),
            self.epoch.elapsed().as_secs_f64(),
        )
    }

    fn view(&self) -> LiveView {
        LiveView {
            plugin: self.args.plugin.clone(),
            kubeconfig: self.kubeconfig.clone(),
            policy: POLICY.to_owned(),
        }
    }

    /// Fails, with the end of its log, when the controller has exited.
    fn check_controller_alive(&self) -> Result<()> {
        if let Some(controller) = &self.controller
            && let Some(status) = controller.exited()
        {
            bail!(
                "the controller exited ({status}); its last log lines:\n{}",
                indent(&log_tail(controller.log_file(), 15))
            );
        }
        Ok(())
    }

    /// Checks, reports, waits for Ctrl-C when asked to, and stops everything.
    async fn finish(mut self, ending: Ending) -> Ending {
        let mut problems = match &ending {
            Ending::Failure(p) => p.clone(),
            _ => Vec::new(),
        };
        if let Some(controller) = &self.controller
            && let Some(status) = controller.exited()
            && problems.is_empty()
        {
            problems.push(format!(
                "the controller exited ({status}); its last log lines:\n{}",
                indent(&log_tail(controller.log_file(), 15))
            ));
        }
        let interrupted = matches!(ending, Ending::Interrupted);
        let transitions = self
            .tracker
            .as_ref()
            .map(RolloutTracker::transitions)
            .unwrap_or_default();
        let upgrade = self
            .upgrade_started
            .map(|since| RolloutTimes::from_transitions(&transitions, since))
            .unwrap_or_default();
        let mut outcome = Outcome {
            policy: POLICY.to_owned(),
            from: self.args.from.clone(),
            to: self.args.to.clone(),
            success: false,
            problems: Vec::new(),
            phases: self.phases.clone(),
            upgrade: upgrade.clone(),
            nodes: Vec::new(),
            workloads: Vec::new(),
        };
        if !interrupted {
            let policy = self.tracker.as_ref().and_then(RolloutTracker::policy);
            match policy {
                Some(policy) => match final_state::inspect(
                    &self.client,
                    &policy,
                    &self.fleet,
                    self.cluster.namespace(),
                    &self.args.to,
                )
                .await
                {
                    Ok((nodes, workloads, checks)) => {
                        outcome.nodes = nodes;
                        outcome.workloads = workloads;
                        if problems.is_empty() {
                            problems.extend(checks);
                        }
                    }
                    Err(e) => problems.push(format!("cannot read the cluster's final state: {e}")),
                },
                None if problems.is_empty() => {
                    problems.push(format!("TenstorrentDriverPolicy {POLICY} was never seen"))
                }
                None => {}
            }
        }
        outcome.success = problems.is_empty() && !interrupted;
        outcome.problems.clone_from(&problems);

        println!();
        if outcome.success {
            println!("Checks passed:");
            println!(
                "  every Tenstorrent node ttdp manages is Done at {} (status and kmd-version label)",
                self.args.to
            );
            if let Some(node) = self.fleet.host_managed_node() {
                println!(
                    "  {node} is HostManaged and kept its DKMS driver; its device workload still runs"
                );
            }
            if self.fleet.plain > 0 {
                println!("  plain nodes carry no driver label and their workloads still run");
            }
            println!(
                "  no node is left cordoned or with a deploy gate; drained workloads were evicted"
            );
        } else if !interrupted {
            println!("The demo FAILED:");
            for problem in &problems {
                println!("  - {problem}");
            }
            self.print_failure_logs().await;
        }
        println!();
        print!(
            "{}",
            timings::render(&self.phases, &upgrade, &self.args.max_unavailable)
        );
        flush();
        if let Some(path) = &self.args.report {
            match serde_json::to_vec_pretty(&outcome) {
                Ok(json) => {
                    if let Err(e) = std::fs::write(path, json) {
                        eprintln!("warning: cannot write the report {}: {e}", path.display());
                    }
                }
                Err(e) => eprintln!("warning: cannot serialise the report: {e}"),
            }
        }

        if outcome.success && !self.args.exit_after_rollout {
            println!();
            print!(
                "{}",
                hints::render(
                    &self.kubeconfig,
                    &self.args.plugin,
                    POLICY,
                    &self.args.from,
                    hints::installed_kubectl().as_deref()
                )
            );
            println!(
                "\n  controller log: {}",
                self.log_dir.join("controller.log").display()
            );
            println!("  agent logs:     {}", self.cluster.log_dir().display());
            flush();
            shutdown_signal().await;
        }

        println!("\nstopping: controller, agents, kubelets, API server ...");
        flush();
        if let Some(controller) = self.controller.take() {
            controller.stop().await;
        }
        self.tracker = None;
        if let Err(e) = self.cluster.shutdown().await {
            eprintln!("warning: the simulated cluster did not stop cleanly: {e}");
        }
        println!("stopped.");
        if interrupted {
            Ending::Interrupted
        } else if outcome.success {
            Ending::Success
        } else {
            Ending::Failure(problems)
        }
    }

    /// The last lines of the controller's log and of the agents on nodes that did not finish.
    async fn print_failure_logs(&self) {
        let controller_log = self.log_dir.join("controller.log");
        println!(
            "\nlast lines of the controller log ({}):",
            controller_log.display()
        );
        println!("{}", indent(&log_tail(&controller_log, 20)));
        let Some(policy) = self.tracker.as_ref().and_then(RolloutTracker::policy) else {
            return;
        };
        let pods: Api<Pod> = Api::all(self.client.clone());
        let selector = format!("{}={}", labels::APP_NAME, labels::APP_NAME_AGENT);
        let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await else {
            return;
        };
        let stuck: Vec<String> = stragglers(&policy)
            .iter()
            .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
            .collect();
        for pod in list.items {
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            if !stuck.contains(&node) {
                continue;
            }
            let file = self.cluster.log_dir().join(format!(
                "{}_{}_{}.log",
                pod.namespace().unwrap_or_default(),
                pod.name_any(),
                ttdp_api::names::AGENT_CONTAINER
            ));
            println!(
                "\nlast lines of agent {} on {node} ({}):",
                pod.name_any(),
                file.display()
            );
            println!("{}", indent(&log_tail(&file, 10)));
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

async fn start_cluster(args: &DemoArgs, fleet: &Fleet, log_dir: &Path) -> Result<SimCluster> {
    let tt_smi = log_dir.join("tt-smi");
    write_fake_tt_smi(&tt_smi)?;
    let scaled = |seconds: f64| duration_flag(Duration::from_secs_f64(seconds * args.speed));
    let options = fleet
        .cluster_options()
        .image(INSTALLER_IMAGE_PREFIX, &args.agent)
        .time_scale(args.speed)
        .kmd_versions(&[&args.from, &args.to])
        .env("TTDP_TT_SMI_PATH", &tt_smi.display().to_string())
        // As the agent image's ENV: the version of the tt-smi it carries.
        .env("TT_SMI_VERSION", TT_SMI_VERSION)
        .env("TTDP_PROBE_PERIOD", &scaled(10.0))
        .env("TTDP_RETRY_INITIAL", &scaled(5.0))
        .env("TTDP_RETRY_MAX", &scaled(60.0))
        .env("TTDP_BUILD_JOBS", "1")
        .in_process();
    SimCluster::start(options)
        .await
        .context("cannot start the simulated cluster")
}

/// A stand-in for the tt-smi binary the agent image bundles; the agent copies it to each host.
fn write_fake_tt_smi(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(
        path,
        "#!/bin/sh\necho \"tt-smi 3.0.0 (simulated by the ttdp demo)\"\n",
    )
    .with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", path.display()))
}

/// The kubeconfig path to show the user: the server's, or a copy at `copy_to`.
fn publish_kubeconfig(cluster: &SimCluster, copy_to: Option<&Path>) -> Result<PathBuf> {
    let source = cluster.kubeconfig_path();
    match copy_to {
        Some(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            std::fs::copy(source, path)
                .with_context(|| format!("cannot copy the kubeconfig to {}", path.display()))?;
            Ok(path.to_path_buf())
        }
        None => Ok(source.to_path_buf()),
    }
}

async fn install_crd(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &ttdp_api::crd())
        .await
        .context("cannot create the TenstorrentDriverPolicy CRD")?;
    let policies: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    eventually(
        "the TenstorrentDriverPolicy CRD to be served",
        SETUP_WAIT,
        || {
            let policies = policies.clone();
            async move { policies.list(&ListParams::default()).await.ok().map(|_| ()) }
        },
    )
    .await?;
    Ok(())
}

/// The operator namespace and the agents' ServiceAccount, as the Helm chart creates them.
async fn create_operator_namespace(client: &Client) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(DEFAULT_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .patch(
            DEFAULT_NAMESPACE,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&namespace),
        )
        .await
        .with_context(|| format!("cannot create namespace {DEFAULT_NAMESPACE}"))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), DEFAULT_NAMESPACE);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(AGENT_SERVICE_ACCOUNT.to_owned()),
            namespace: Some(DEFAULT_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts
        .patch(
            AGENT_SERVICE_ACCOUNT,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&account),
        )
        .await
        .with_context(|| {
            format!("cannot create serviceaccount {DEFAULT_NAMESPACE}/{AGENT_SERVICE_ACCOUNT}")
        })?;
    Ok(())
}

/// `seconds` scaled by `speed`, in whole seconds, at least 1 (the controller's flags' unit).
fn scaled_seconds(seconds: f64, speed: f64) -> u64 {
    Duration::from_secs_f64(seconds * speed).as_secs().max(1)
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn describe_device(workload: &ttdp_testkit::sim::Workload) -> &'static str {
    match workload.device {
        ttdp_testkit::sim::DeviceUse::HostPath => "mounts /dev/tenstorrent (hostPath)",
        ttdp_testkit::sim::DeviceUse::Resource => "requests tenstorrent.com/n300",
        ttdp_testkit::sim::DeviceUse::None => "uses no device",
    }
}

fn phase(name: &str, started: Instant) -> Phase {
    Phase {
        name: name.to_owned(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn print_step(what: &str) {
    println!("==> {what}");
    flush();
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Resolves on Ctrl-C or SIGTERM (never, if neither handler can be installed).
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        result = tokio::signal::ctrl_c() => {
            if result.is_err() {
                std::future::pending::<()>().await;
            }
        }
        () = terminate => {}
    }
}
