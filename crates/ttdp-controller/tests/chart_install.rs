//! The Helm chart on a real control plane, with the chart's own identities.
//!
//! `helm install` puts the chart into a fresh namespace (the controller Deployment's pod is
//! pinned to a node that does not exist: no kubelet here runs its image). The real
//! `ttdp-controller` binary then runs out of cluster with the environment of the installed
//! Deployment and a token of the chart's controller ServiceAccount, through a fresh install on
//! simulated nodes, an upgrade (cordon, drain by eviction, agent pod replacement, uncordon) and a
//! policy deletion (finalizer cleanup): the chart's RBAC is enough for all of it. Every agent pod
//! runs the real `ttdp-agent` with a token of the chart's agent ServiceAccount bound to that pod
//! (what its projected token would be), so the agents' labels, reports and Events pass RBAC and
//! the chart's ValidatingAdmissionPolicies; no request of either identity may be refused along
//! the way. Then one agent's token is tried on what it must not change, and the real server's
//! 403 (RBAC) and 422 (admission policy) answers are asserted.
//!
//! The TenstorrentDriverPolicy CRD is cluster-scoped and shared with other suites: helm installs
//! it from `crds/` only when it is missing, and it is left in place at the end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use harness::helm_binary;

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use ttdp_api::names::{annotations, labels};
use ttdp_api::{NodeState, TenstorrentDriverPolicy};
use ttdp_testkit::launcher::{self, tokens};
use ttdp_testkit::sim::cluster::{client_for, random_prefix};
use ttdp_testkit::sim::{
    DeviceUse, SimCluster, SimClusterOptions, TenstorrentNode, Workload, WorkloadOwner,
};

const CHART: &str = "deploy/helm/tt-k8s-driver-manager";
/// The agent image repository the controller's default image uses (mapped to the agent).
const IMAGE_REPOSITORY: &str = ttdp_controller::settings::DEFAULT_IMAGE_REPOSITORY;
/// The label that ties the scenario's nodes to its policy.
const RUN_LABEL: &str = "ttdp.test/run";
/// Time scale of the simulation (agent probe periods, retries, grace periods).
const SPEED: f64 = 0.2;
/// How long one rollout step may take.
const STEP: Duration = Duration::from_secs(90);
/// The agents' tt-smi version (the fake tt-smi prints it; the chart's default).
const TT_SMI: &str = "3.0.0";

fn scaled(seconds: f64) -> String {
    format!("{}ms", (seconds * SPEED * 1000.0).round() as u64)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs helm against the cluster of `kubeconfig`; the output on success, a panic otherwise.
fn helm(kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(helm_binary())
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .current_dir(repo_root())
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("ttdp-helm-cache"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The "image" of the agent pods: a script that waits for the kubeconfig holding the token
/// bound to its own pod (written by [`TokenMinter`] once the pod is scheduled) and runs the real
/// agent with it, as the agent runs in a pod with its projected token.
fn agent_entrypoint(dir: &Path, tokens: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("ttdp-agent");
    executable(
        &path,
        &format!(
            "#!/bin/sh\n\
             kubeconfig=\"{tokens}/$POD_NAME.kubeconfig\"\n\
             tries=0\n\
             while [ ! -f \"$kubeconfig\" ]; do\n\
             \x20 tries=$((tries + 1))\n\
             \x20 if [ \"$tries\" -gt 600 ]; then\n\
             \x20   echo \"no token for pod $POD_NAME\" >&2; exit 1\n\
             \x20 fi\n\
             \x20 sleep 0.1\n\
             done\n\
             KUBECONFIG=\"$kubeconfig\" exec \"{agent}\" \"$@\"\n",
            tokens = tokens.display(),
            agent = harness::agent_binary().display(),
        ),
    );
    path
}

/// Gives every agent pod of the release, once scheduled, a kubeconfig with a token of its
/// ServiceAccount bound to it.
struct TokenMinter {
    /// (pod, node) of every pod given a token.
    given: Arc<Mutex<Vec<(String, String)>>>,
    /// The last failure, if any.
    failure: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TokenMinter {
    fn start(admin: Client, admin_kubeconfig: PathBuf, namespace: &str, dir: PathBuf) -> Self {
        let given = Arc::new(Mutex::new(Vec::new()));
        let failure = Arc::new(Mutex::new(None));
        let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
        let config = watcher::Config::default().labels(&format!(
            "{}={}",
            labels::APP_NAME,
            labels::APP_NAME_AGENT
        ));
        let (g, f) = (given.clone(), failure.clone());
        let task = tokio::spawn(async move {
            let staging = dir.join("staging");
            std::fs::create_dir_all(&staging).unwrap();
            let mut done = std::collections::BTreeSet::new();
            let mut stream = watcher::watcher(pods, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(pod) = stream.next().await {
                let Ok(pod) = pod else { continue };
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                let (Some(node), Some(uid)) = (node, pod.uid()) else {
                    continue;
                };
                if pod.metadata.deletion_timestamp.is_some() || !done.insert(uid) {
                    continue;
                }
                let name = pod.name_any();
                let written = async {
                    let token = tokens::pod_token(&admin, &pod).await?;
                    let path =
                        tokens::write_token_kubeconfig(&admin_kubeconfig, &token, &staging, &name)?;
                    std::fs::rename(&path, dir.join(format!("{name}.kubeconfig")))
                        .map_err(|e| format!("moving {}: {e}", path.display()))?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                }
                .await;
                match written {
                    Ok(()) => g.lock().unwrap().push((name, node)),
                    Err(e) => *f.lock().unwrap() = Some(format!("token for pod {name}: {e}")),
                }
            }
        });
        TokenMinter {
            given,
            failure,
            task,
        }
    }

    fn given(&self) -> Vec<(String, String)> {
        self.given.lock().unwrap().clone()
    }

    fn assert_no_failure(&self) {
        if let Some(f) = self.failure.lock().unwrap().as_ref() {
            panic!("{f}");
        }
    }
}

impl Drop for TokenMinter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `ttdp-controller` binary, running out of cluster.
struct ControllerProcess {
    child: Child,
    log: PathBuf,
}

impl ControllerProcess {
    /// Starts the binary with the environment of the installed Deployment's container
    /// (`fieldRef`s resolved as the kubelet would), `overrides` on top.
    fn start(deployment: &Deployment, log: PathBuf, overrides: &[(&str, String)]) -> Self {
        let pod_spec = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("the Deployment has a pod template");
        let container = &pod_spec.containers[0];
        let namespace = deployment.namespace().unwrap();
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        for var in container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(from)) => {
                    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                        Some("metadata.namespace") => namespace.clone(),
                        Some("metadata.name") => format!("{}-chart-test", deployment.name_any()),
                        other => panic!("env {} from {other:?} is not simulated", var.name),
                    }
                }
                (None, None) => String::new(),
            };
            env.insert(var.name.clone(), value);
        }
        for (k, v) in overrides {
            env.insert((*k).to_owned(), v.clone());
        }
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ttdp-controller"))
            .env_clear()
            .envs(&env)
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap();
        ControllerProcess { child, log }
    }

    /// Its last warnings and errors (or the end of its log when there are none), for failure
    /// messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        if lines.is_empty() {
            lines = text.lines().collect();
        }
        format!(
            "{}\n(all of it in {})",
            lines[lines.len().saturating_sub(20)..].join("\n"),
            self.log.display()
        )
    }

    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "the controller exited ({status}); its log:\n{}",
                self.log_tail()
            );
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a scenario step needs.
struct Scenario {
    admin: Client,
    admin_kubeconfig: PathBuf,
    cluster: SimCluster,
    controller: Mutex<ControllerProcess>,
    minter: TokenMinter,
    prefix: String,
    release_namespace: String,
    agent_account: String,
    policy: String,
    tokens_dir: PathBuf,
}

impl Scenario {
    /// The controller process (still usable after a failed step panicked while holding it).
    fn controller(&self) -> std::sync::MutexGuard<'_, ControllerProcess> {
        self.controller
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn policies(&self) -> Api<TenstorrentDriverPolicy> {
        Api::all(self.admin.clone())
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.admin.clone())
    }

    fn agent_pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), &self.release_namespace)
    }

    /// Waits until `check` holds for the policy (`None`: it is gone).
    async fn wait_policy(
        &self,
        what: &str,
        check: impl Fn(Option<&TenstorrentDriverPolicy>) -> bool,
    ) {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < STEP {
            self.controller().assert_running();
            self.minter.assert_no_failure();
            if let Ok(p) = self.policies().get_opt(&self.policy).await {
                if check(p.as_ref()) {
                    return;
                }
                last = p;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let log = self.controller().log_tail();
        panic!(
            "timed out after {STEP:?} waiting for {what} on policy {}; last status: {}\n\
             agent logs: {}\ncontroller log:\n{log}",
            self.policy,
            serde_json::to_string_pretty(&last.and_then(|p| p.status)).unwrap(),
            self.cluster.log_dir().display(),
        );
    }

    /// Every scenario node is Done at `version` and the policy is Ready for its generation.
    async fn wait_done(&self, version: &str) {
        let nodes = self.cluster.tenstorrent_node_names();
        self.wait_policy(&format!("every node Done at {version}"), |p| {
            let Some(p) = p else { return false };
            let Some(status) = p.status.as_ref() else {
                return false;
            };
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready
                && status.observed_generation == p.metadata.generation
                && nodes.iter().all(|n| {
                    status.nodes.iter().any(|e| {
                        &e.name == n
                            && e.state == NodeState::Done
                            && e.current_version.as_deref() == Some(version)
                    })
                })
        })
        .await;
        for node in &nodes {
            let n = self.nodes().get(node).await.unwrap();
            assert_eq!(
                n.labels().get(labels::KMD_VERSION).map(String::as_str),
                Some(version),
                "node {node} is labelled with the loaded version by its agent"
            );
            assert!(
                !n.spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                "node {node} is left cordoned"
            );
            assert!(
                !n.annotations().contains_key(annotations::CORDONED_BY),
                "node {node} keeps the cordon annotation"
            );
        }
    }

    /// The live agent pods, by node.
    async fn agent_pods_by_node(&self) -> BTreeMap<String, Pod> {
        let selector = format!("{}={}", labels::POLICY, self.policy);
        self.agent_pods()
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
            .collect()
    }
}

/// The server's answer to a request: 200 or the error status code, with its message.
fn answer<T>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(e) => panic!("request failed without an answer from the server: {e}"),
    }
}

fn merge(value: Value) -> Patch<Value> {
    Patch::Merge(value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_installs_and_its_identities_run_a_rollout_on_a_real_control_plane() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
    let started = Instant::now();
    let mut timings: Vec<(&'static str, Duration)> = Vec::new();
    let mut lap = Instant::now();
    let mut mark = |what: &'static str, timings: &mut Vec<(&'static str, Duration)>| {
        timings.push((what, lap.elapsed()));
        lap = Instant::now();
    };

    let admin_kubeconfig = launcher::test_kubeconfig();
    let admin = client_for(&admin_kubeconfig).await.unwrap();
    let prefix = random_prefix("chart");
    let release = prefix.clone();
    let release_namespace = format!("{prefix}-system");
    let tmp = tempfile::Builder::new()
        .prefix("ttdp-chart-")
        .tempdir()
        .unwrap();
    mark("control plane", &mut timings);

    helm(
        &admin_kubeconfig,
        &[
            "install",
            &release,
            CHART,
            "--namespace",
            &release_namespace,
            "--create-namespace",
            // No kubelet here runs the controller image, and the chart's schema wants at least
            // one replica: its pod is pinned to a node that does not exist and stays Pending.
            "--set",
            &format!("controller.nodeSelector.kubernetes\\.io/hostname={prefix}-no-node"),
            // What an admin adds to the agent pods reaches them through the controller.
            "--set",
            "imagePullSecrets[0].name=registry-creds",
            "--set",
            "agent.resources.limits.memory=512Mi",
            "--set",
            "proxy.httpsProxy=http://proxy.invalid:3128",
            "--set",
            "proxy.noProxy=127.0.0.1\\,localhost",
            "--set",
            "agent.cacheSizeLimit=4Gi",
            "--set",
            "agent.kernelScanPeriod=10m",
            "--timeout",
            "2m",
        ],
    );
    let policies: Api<TenstorrentDriverPolicy> = Api::all(admin.clone());
    let served = Instant::now();
    while policies
        .list(&ListParams::default().limit(1))
        .await
        .is_err()
    {
        assert!(
            served.elapsed() < Duration::from_secs(30),
            "the TenstorrentDriverPolicy resource is not served after helm install"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    mark("helm install", &mut timings);

    let outcome = AssertUnwindSafe(run_scenario(
        admin.clone(),
        admin_kubeconfig.clone(),
        prefix.clone(),
        release_namespace.clone(),
        tmp.path().to_path_buf(),
        &mut timings,
    ))
    .catch_unwind()
    .await;

    // Cleanup, whatever happened: the release, its namespace, and a check that nothing of the
    // release is left cluster-wide. (The scenario's nodes and namespace went with the
    // simulated cluster.)
    let cleanup = Instant::now();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    helm(
        &admin_kubeconfig,
        &[
            "uninstall",
            &release,
            "--namespace",
            &release_namespace,
            "--timeout",
            "2m",
        ],
    );
    let _ = namespaces
        .delete(&release_namespace, &DeleteParams::default())
        .await;
    let selector = format!("app.kubernetes.io/instance={release}");
    let lp = ListParams::default().labels(&selector);
    let mut leftovers = Vec::new();
    let gone = Instant::now();
    loop {
        leftovers.clear();
        let cr = Api::<ClusterRole>::all(admin.clone())
            .list(&lp)
            .await
            .unwrap();
        let crb = Api::<ClusterRoleBinding>::all(admin.clone())
            .list(&lp)
            .await
            .unwrap();
        let vap = Api::<ValidatingAdmissionPolicy>::all(admin.clone())
            .list(&lp)
            .await
            .unwrap();
        let vapb = Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
            .list(&lp)
            .await
            .unwrap();
        leftovers.extend(
            cr.items
                .iter()
                .map(|o| format!("ClusterRole {}", o.name_any())),
        );
        leftovers.extend(
            crb.items
                .iter()
                .map(|o| format!("ClusterRoleBinding {}", o.name_any())),
        );
        leftovers.extend(
            vap.items
                .iter()
                .map(|o| format!("ValidatingAdmissionPolicy {}", o.name_any())),
        );
        leftovers.extend(
            vapb.items
                .iter()
                .map(|o| format!("ValidatingAdmissionPolicyBinding {}", o.name_any())),
        );
        if namespaces
            .get_opt(&release_namespace)
            .await
            .unwrap()
            .is_some()
        {
            leftovers.push(format!("namespace {release_namespace}"));
        }
        if namespaces.get_opt(&prefix).await.unwrap().is_some() {
            leftovers.push(format!("namespace {prefix}"));
        }
        let run_nodes = ListParams::default().labels(&format!("{RUN_LABEL}={prefix}"));
        let nodes = Api::<Node>::all(admin.clone())
            .list(&run_nodes)
            .await
            .unwrap();
        leftovers.extend(nodes.items.iter().map(|n| format!("node {}", n.name_any())));
        if leftovers.is_empty() || gone.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    timings.push(("uninstall and cleanup", cleanup.elapsed()));
    eprintln!("timings:");
    for (what, took) in &timings {
        eprintln!("  {what:<45} {:>6.1} s", took.as_secs_f64());
    }
    eprintln!(
        "  {:<45} {:>6.1} s",
        "total",
        started.elapsed().as_secs_f64()
    );
    if let Err(panic) = outcome {
        eprintln!(
            "the controller's log and the tokens stay in {}",
            tmp.keep().display()
        );
        std::panic::resume_unwind(panic);
    }
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
}

/// Everything between `helm install` and `helm uninstall`. Leaves nothing behind but the
/// release (it shuts the simulated cluster down even when a step fails).
async fn run_scenario(
    admin: Client,
    admin_kubeconfig: PathBuf,
    prefix: String,
    release_namespace: String,
    dir: PathBuf,
    timings: &mut Vec<(&'static str, Duration)>,
) {
    let mut lap = Instant::now();
    let mut mark = |what: &'static str| {
        timings.push((what, lap.elapsed()));
        lap = Instant::now();
    };
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &release_namespace);
    let deployment = deployments
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={prefix}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("the release has the controller Deployment");
    let spec = deployment.spec.as_ref().unwrap();
    let pod_spec = spec.template.spec.as_ref().unwrap();
    let controller_account = pod_spec.service_account_name.clone().unwrap();
    let agent_account = pod_spec.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "TTDP_AGENT_SERVICE_ACCOUNT")
        .and_then(|e| e.value.clone())
        .expect("the Deployment names the agents' ServiceAccount");

    // The simulated nodes join the control plane; agent pods run the real agent with a token
    // bound to their pod.
    let tokens_dir = dir.join("tokens");
    std::fs::create_dir_all(&tokens_dir).unwrap();
    let entrypoint = agent_entrypoint(&dir.join("bin"), &tokens_dir);
    let tt_smi = dir.join("tt-smi");
    executable(
        &tt_smi,
        &format!("#!/bin/sh\necho tt-smi {TT_SMI} simulated\n"),
    );
    let mut options = SimClusterOptions::new()
        .existing_cluster(&admin_kubeconfig)
        .name_prefix(&prefix)
        .image(IMAGE_REPOSITORY, entrypoint)
        .time_scale(SPEED)
        .kmd_versions(&["2.7.0", "2.8.0"])
        .env("TTDP_TT_SMI_PATH", &tt_smi.display().to_string())
        // As the agent image's ENV: the version of the tt-smi it carries (the node label's
        // value; the chart's driver.ttSmiVersion no longer reaches the agents).
        .env("TT_SMI_VERSION", TT_SMI)
        .env("TTDP_PROBE_PERIOD", &scaled(10.0))
        .env("TTDP_RETRY_INITIAL", &scaled(5.0))
        .env("TTDP_RETRY_MAX", &scaled(20.0))
        .env("TTDP_UNLOAD_WAIT", &scaled(10.0))
        .env("TTDP_BUILD_JOBS", "1");
    for _ in 0..2 {
        options = options.node(TenstorrentNode::new().label(RUN_LABEL, &prefix));
    }
    let cluster = SimCluster::start(options).await.expect("simulated cluster");
    let minter = TokenMinter::start(
        admin.clone(),
        admin_kubeconfig.clone(),
        &release_namespace,
        tokens_dir.clone(),
    );
    mark("simulated nodes");

    // The controller binary, with the chart's environment and its ServiceAccount's token.
    let token = tokens::service_account_token(&admin, &release_namespace, &controller_account)
        .await
        .unwrap();
    let controller_kubeconfig =
        tokens::write_token_kubeconfig(&admin_kubeconfig, &token, &dir, "controller").unwrap();
    let controller = ControllerProcess::start(
        &deployment,
        dir.join("controller.log"),
        &[
            ("KUBECONFIG", controller_kubeconfig.display().to_string()),
            ("TTDP_KMD_REPOSITORY", cluster.kmd_repo().url()),
            ("TTDP_METRICS_ADDRESS", "127.0.0.1:0".into()),
            ("TTDP_LOG_FORMAT", "text".into()),
            ("NO_COLOR", "1".into()),
            ("TTDP_RETRY_BASE_SECONDS", "2".into()),
            ("TTDP_RETRY_MAX_SECONDS", "10".into()),
            (
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            ),
        ],
    );

    let scenario = Scenario {
        admin,
        admin_kubeconfig,
        cluster,
        controller: Mutex::new(controller),
        minter,
        prefix: prefix.clone(),
        release_namespace,
        agent_account,
        policy: format!("{prefix}-fleet"),
        tokens_dir,
    };
    let steps = AssertUnwindSafe(rollout_and_admission(&scenario, &mut mark))
        .catch_unwind()
        .await;

    // Whatever happened: no policy of the scenario stays (its finalizer needs the controller),
    // the agent pods go while their kubelets still run, then the nodes go.
    let policies = scenario.policies();
    if policies
        .get_opt(&scenario.policy)
        .await
        .ok()
        .flatten()
        .is_some()
    {
        let _ = policies
            .delete(&scenario.policy, &DeleteParams::default())
            .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline
            && policies
                .get_opt(&scenario.policy)
                .await
                .ok()
                .flatten()
                .is_some()
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = policies
            .patch(
                &scenario.policy,
                &PatchParams::default(),
                &merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    scenario.controller().stop();
    let agents = scenario.agent_pods();
    let agent_pods =
        ListParams::default().labels(&format!("{}={}", labels::APP_NAME, labels::APP_NAME_AGENT));
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline
        && agents
            .list(&agent_pods)
            .await
            .map(|l| !l.items.is_empty())
            .unwrap_or(false)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Scenario {
        cluster, minter, ..
    } = scenario;
    drop(minter);
    let shutdown = cluster.shutdown().await;
    mark("agent pods gone, simulated nodes shut down");
    if let Err(panic) = steps {
        std::panic::resume_unwind(panic);
    }
    shutdown.expect("shutting the simulated cluster down");
}

/// The chart's `imagePullSecrets`, `agent.resources`, `agent.cacheSizeLimit`,
/// `agent.kernelScanPeriod` and `proxy` values, on an agent pod the controller's DaemonSet made.
fn assert_admins_additions(pod: &Pod) {
    let spec = pod.spec.as_ref().unwrap();
    let secrets: Vec<&str> = (spec.image_pull_secrets.iter().flatten())
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(secrets, ["registry-creds"]);
    let agent = &spec.containers[0];
    let limits = agent.resources.as_ref().and_then(|r| r.limits.as_ref());
    assert_eq!(limits.unwrap()["memory"].0, "512Mi");
    let env: BTreeMap<&str, &str> = (agent.env.iter().flatten())
        .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
        .collect();
    for name in ["HTTPS_PROXY", "https_proxy"] {
        assert_eq!(env.get(name), Some(&"http://proxy.invalid:3128"), "{name}");
    }
    assert_eq!(env.get("no_proxy"), Some(&"127.0.0.1,localhost"));
    assert_eq!(env.get("TTDP_CACHE_SIZE_LIMIT"), Some(&"4Gi"));
    assert_eq!(env.get("TTDP_KERNEL_SCAN_PERIOD"), Some(&"10m"));
}

async fn rollout_and_admission(s: &Scenario, mark: &mut impl FnMut(&'static str)) {
    // Fresh install on both nodes: no drain, the agents label their nodes and report.
    let policy: TenstorrentDriverPolicy = serde_json::from_value(json!({
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": {"name": s.policy},
        "spec": {"version": "2.7.0", "nodeAffinity": {"matchLabels": {RUN_LABEL: s.prefix}}},
    }))
    .unwrap();
    s.policies()
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    s.wait_done("2.7.0").await;
    let before = s.agent_pods_by_node().await;
    assert_eq!(
        before.len(),
        2,
        "one agent pod per node: {:?}",
        before.keys()
    );
    for pod in before.values() {
        assert_admins_additions(pod);
    }
    mark("fresh install of 2.7.0 on 2 nodes");

    // Upgrade with a device-holding workload: cordon, drain by eviction, agent pod
    // replacement, uncordon.
    let nodes = s.cluster.tenstorrent_node_names();
    let workload = s
        .cluster
        .add_workload(
            &Workload::new("inference-0", &nodes[0])
                .device(DeviceUse::HostPath)
                .owner(WorkloadOwner::ReplicaSet)
                .label("app", "inference"),
        )
        .await
        .unwrap();
    s.policies()
        .patch(
            &s.policy,
            &PatchParams::default(),
            &merge(json!({"spec": {"version": "2.8.0"}})),
        )
        .await
        .unwrap();
    s.wait_done("2.8.0").await;
    let after = s.agent_pods_by_node().await;
    for node in &nodes {
        assert_ne!(
            before[node].uid(),
            after[node].uid(),
            "the agent pod of {node} was replaced"
        );
    }
    let evicted = Api::<Pod>::namespaced(s.admin.clone(), s.cluster.namespace())
        .get_opt(&workload.name_any())
        .await
        .unwrap();
    assert!(
        evicted.is_none_or(|p| p.uid() != workload.uid()),
        "the device-holding pod {} was evicted",
        workload.name_any()
    );
    mark("upgrade to 2.8.0 (cordon, drain, replace)");

    // Every agent pod that ran had a token bound to it, and reported through it.
    let given = s.minter.given();
    for (node, pod) in before.iter().chain(after.iter()) {
        assert!(
            given.iter().any(|(p, n)| *p == pod.name_any() && n == node),
            "agent pod {} on {node} ran without its bound token: {given:?}",
            pod.name_any()
        );
    }
    for (node, pod) in &after {
        assert!(
            pod.annotations().contains_key(annotations::AGENT_REPORT),
            "the agent on {node} published its report on its pod"
        );
    }

    agent_admission(s, &nodes, &after).await;
    mark("agent token: RBAC and admission checks");

    // Deleting the policy runs the finalizer cleanup with the controller's token.
    s.policies()
        .delete(&s.policy, &DeleteParams::default())
        .await
        .unwrap();
    s.wait_policy("deletion", |p| p.is_none()).await;
    for node in &nodes {
        let n = s.nodes().get(node).await.unwrap();
        assert!(
            !n.spec
                .as_ref()
                .and_then(|sp| sp.unschedulable)
                .unwrap_or(false)
                && !n.annotations().contains_key(annotations::CORDONED_BY)
                && !n.annotations().contains_key(annotations::DEPLOY_GATES),
            "node {node} is left with a cordon or gate of the deleted policy"
        );
    }
    mark("policy deletion (finalizer)");

    // Nothing either identity did was refused along the way (a refused Event, for one, would
    // not stop the rollout).
    let mut refused = Vec::new();
    let mut logs = vec![s.controller().log.clone()];
    let agent_logs = std::fs::read_dir(s.cluster.log_dir()).unwrap();
    logs.extend(
        agent_logs
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&s.release_namespace))
            }),
    );
    assert!(
        logs.len() > 1,
        "no agent logs in {}",
        s.cluster.log_dir().display()
    );
    for log in &logs {
        let text = std::fs::read_to_string(log).unwrap();
        refused.extend(
            text.lines()
                .filter(|l| l.contains("forbidden") || l.contains("denied request"))
                .map(|l| format!("{}: {l}", log.display())),
        );
    }
    assert!(
        refused.is_empty(),
        "requests refused:\n{}",
        refused.join("\n")
    );
}

/// One agent's bound token may change only its own node's four ttdp labels and its own pod's
/// report annotation; the chart's policies and RBAC refuse everything else.
async fn agent_admission(s: &Scenario, nodes: &[String], pods: &BTreeMap<String, Pod>) {
    let (own_node, other_node) = (&nodes[0], &nodes[1]);
    let (own_pod, other_pod) = (&pods[own_node], &pods[other_node]);
    let token = tokens::pod_token(&s.admin, own_pod).await.unwrap();
    let kubeconfig =
        tokens::write_token_kubeconfig(&s.admin_kubeconfig, &token, &s.tokens_dir, "checks")
            .unwrap();
    let agent = client_for(&kubeconfig).await.unwrap();
    let node_api: Api<Node> = Api::all(agent.clone());
    let pod_api: Api<Pod> = Api::namespaced(agent.clone(), &s.release_namespace);
    let pp = PatchParams::default();
    let mut failures = Vec::new();
    let mut expect = |what: &str, got: (u16, String), code: u16, message: &str| {
        if got.0 != code || !got.1.contains(message) {
            failures.push(format!(
                "{what}: expected {code} ({message:?}), got {} {:?}",
                got.0, got.1
            ));
        }
    };

    // Allowed: its own node's ttdp labels (changed and put back) and its own pod's report.
    let label =
        |value: &str| merge(json!({"metadata": {"labels": {labels::TT_SMI_VERSION: value}}}));
    expect(
        "change its own node's tt-smi label",
        answer(
            node_api
                .patch(own_node, &pp, &label("0.0.0-chart-test"))
                .await,
        ),
        200,
        "",
    );
    expect(
        "put its own node's tt-smi label back",
        answer(node_api.patch(own_node, &pp, &label(TT_SMI)).await),
        200,
        "",
    );
    let compiler = |value: &str| {
        merge(json!({"metadata": {"labels": {
            ttdp_api::names::compiler::KERNEL_COMPILER_LABEL: value,
        }}}))
    };
    expect(
        "label its own node's kernel compiler",
        answer(node_api.patch(own_node, &pp, &compiler("gcc-12")).await),
        200,
        "",
    );
    let report = own_pod
        .annotations()
        .get(annotations::AGENT_REPORT)
        .cloned()
        .unwrap_or_default();
    expect(
        "rewrite its own pod's report",
        answer(
            pod_api
                .patch(
                    &own_pod.name_any(),
                    &pp,
                    &merge(json!({"metadata": {"annotations": {
                        annotations::AGENT_REPORT: format!("{report} "),
                    }}})),
                )
                .await,
        ),
        200,
        "",
    );

    // Refused by the admission policies (422).
    expect(
        "label another node",
        answer(
            node_api
                .patch(
                    other_node,
                    &pp,
                    &merge(json!({"metadata": {"labels": {labels::KMD_VERSION: "9.9.9"}}})),
                )
                .await,
        ),
        422,
        "only change the node it runs on",
    );
    for key in [labels::SKIP, "example.com/chart-test"] {
        expect(
            &format!("set label {key} on its own node"),
            answer(
                node_api
                    .patch(
                        own_node,
                        &pp,
                        &merge(json!({"metadata": {"labels": {key: "true"}}})),
                    )
                    .await,
            ),
            422,
            "may only change its node's kmd-version, install-mode, tt-smi version and kernel-compiler labels",
        );
    }
    expect(
        "remove the NFD label of its own node",
        answer(
            node_api
                .patch(
                    own_node,
                    &pp,
                    &merge(json!({"metadata": {"labels": {labels::NFD_TENSTORRENT: null}}})),
                )
                .await,
        ),
        422,
        "may only change its node's kmd-version",
    );
    expect(
        "cordon its own node",
        answer(
            node_api
                .patch(
                    own_node,
                    &pp,
                    &merge(json!({"spec": {"unschedulable": true}})),
                )
                .await,
        ),
        422,
        "may not change a node's spec",
    );
    expect(
        "annotate its own node",
        answer(
            node_api
                .patch(
                    own_node,
                    &pp,
                    &merge(json!({"metadata": {"annotations": {annotations::CORDONED_BY: "x"}}})),
                )
                .await,
        ),
        422,
        "may not change a node's annotations",
    );
    expect(
        "grant itself its upgrade",
        answer(
            node_api
                .patch(
                    own_node,
                    &pp,
                    &merge(json!({"metadata": {"annotations": {
                        annotations::UPGRADE_GRANT: ttdp_api::names::upgrade_grant("any", "9.9.9")
                    }}})),
                )
                .await,
        ),
        422,
        "may not change a node's annotations",
    );
    expect(
        "annotate another agent's pod",
        answer(
            pod_api
                .patch(
                    &other_pod.name_any(),
                    &pp,
                    &merge(json!({"metadata": {"annotations": {annotations::AGENT_REPORT: "{}"}}})),
                )
                .await,
        ),
        422,
        "may only annotate the pod it runs in",
    );
    expect(
        "label its own pod",
        answer(
            pod_api
                .patch(
                    &own_pod.name_any(),
                    &pp,
                    &merge(json!({"metadata": {"labels": {"x": "y"}}})),
                )
                .await,
        ),
        422,
        "may only change its pod's driver.tenstorrent.com/agent-report annotation",
    );
    expect(
        "annotate its own pod with something else",
        answer(
            pod_api
                .patch(
                    &own_pod.name_any(),
                    &pp,
                    &merge(json!({"metadata": {"annotations": {"x": "y"}}})),
                )
                .await,
        ),
        422,
        "may only change its pod's driver.tenstorrent.com/agent-report annotation",
    );

    // Everything of its own node but those four labels: dry runs, so the server's answer is
    // the admission policy's and a change it let through is not kept.
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    for key in [
        labels::KMD_VERSION,
        labels::INSTALL_MODE,
        labels::TT_SMI_VERSION,
        ttdp_api::names::compiler::KERNEL_COMPILER_LABEL,
    ] {
        expect(
            &format!("change its own node's label {key} (dry run)"),
            answer(
                node_api
                    .patch(
                        own_node,
                        &dry,
                        &merge(json!({"metadata": {"labels": {key: "0.0.0-chart-test"}}})),
                    )
                    .await,
            ),
            200,
            "",
        );
    }
    let release_namespace = Api::<Namespace>::all(s.admin.clone())
        .get(&s.release_namespace)
        .await
        .unwrap();
    let own_node_now = s.nodes().get(own_node).await.unwrap();
    let refused_changes = [
        (
            "add a finalizer to its own node",
            json!({"metadata": {"finalizers": ["example.com/chart-test"]}}),
            "may not change a node's finalizers",
        ),
        (
            "give its own node an owner",
            json!({"metadata": {"ownerReferences": [{
                "apiVersion": "v1", "kind": "Namespace",
                "name": release_namespace.name_any(),
                "uid": release_namespace.uid().unwrap(),
            }]}}),
            "may not change a node's owner references",
        ),
        (
            "rename its own node's generateName",
            json!({"metadata": {"generateName": "chart-test-"}}),
            "may not change a node's generateName",
        ),
        (
            "taint its own node",
            json!({"spec": {"taints": [{"key": "example.com/chart-test", "effect": "NoSchedule"}]}}),
            "may not change a node's spec",
        ),
        (
            "set another label on its own node",
            json!({"metadata": {"labels": {"example.com/chart-test": "x"}}}),
            "may only change its node's kmd-version, install-mode, tt-smi version and kernel-compiler labels",
        ),
        (
            "annotate its own node",
            json!({"metadata": {"annotations": {"example.com/chart-test": "x"}}}),
            "may not change a node's annotations",
        ),
    ];
    for (what, change, message) in refused_changes {
        expect(
            &format!("{what} (dry run)"),
            answer(node_api.patch(own_node, &dry, &merge(change)).await),
            422,
            message,
        );
    }
    let refused_pod_changes = [
        (
            "add a finalizer to its own pod",
            json!({"metadata": {"finalizers": ["example.com/chart-test"]}}),
        ),
        (
            "give its own pod another owner",
            json!({"metadata": {"ownerReferences": [{
                "apiVersion": "v1", "kind": "Namespace",
                "name": release_namespace.name_any(),
                "uid": release_namespace.uid().unwrap(),
            }]}}),
        ),
        (
            "rename its own pod's generateName",
            json!({"metadata": {"generateName": "chart-test-"}}),
        ),
    ];
    for (what, change) in refused_pod_changes {
        expect(
            &format!("{what} (dry run)"),
            answer(
                pod_api
                    .patch(&own_pod.name_any(), &dry, &merge(change))
                    .await,
            ),
            422,
            "may only change its pod's driver.tenstorrent.com/agent-report annotation",
        );
    }
    expect(
        "write its own node's status",
        answer(
            node_api
                .patch_status(
                    own_node,
                    &dry,
                    &merge(
                        json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
                    ),
                )
                .await,
        ),
        403,
        "forbidden",
    );
    let own_node_after = s.nodes().get(own_node).await.unwrap();
    assert!(
        own_node_after.finalizers().is_empty()
            && own_node_after.owner_references().is_empty()
            && own_node_after.labels() == own_node_now.labels(),
        "a dry run changed the node: {:?}",
        own_node_after.metadata
    );

    // Refused by RBAC (403).
    let forbidden = "forbidden";
    expect(
        "delete its own node",
        answer(node_api.delete(own_node, &DeleteParams::default()).await),
        403,
        forbidden,
    );
    expect(
        "list nodes",
        answer(node_api.list(&ListParams::default()).await),
        403,
        forbidden,
    );
    expect(
        "delete another agent's pod",
        answer(
            pod_api
                .delete(&other_pod.name_any(), &DeleteParams::default())
                .await,
        ),
        403,
        forbidden,
    );
    let workloads: Api<Pod> = Api::namespaced(agent.clone(), s.cluster.namespace());
    expect(
        "annotate a pod of another namespace",
        answer(
            workloads
                .patch(
                    "inference-0",
                    &pp,
                    &merge(json!({"metadata": {"annotations": {"x": "y"}}})),
                )
                .await,
        ),
        403,
        forbidden,
    );
    let secrets: Api<Secret> = Api::namespaced(agent.clone(), &s.release_namespace);
    expect(
        "list secrets",
        answer(secrets.list(&ListParams::default()).await),
        403,
        forbidden,
    );
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "chart-test"}, "stringData": {"a": "b"}}),
    )
    .unwrap();
    expect(
        "create a secret",
        answer(secrets.create(&PostParams::default(), &secret).await),
        403,
        forbidden,
    );
    expect(
        "read secrets of every namespace",
        answer(
            Api::<Secret>::all(agent.clone())
                .list(&ListParams::default())
                .await,
        ),
        403,
        forbidden,
    );

    // A token of the agent account bound to no pod names no node: it may label none.
    let unbound = tokens::service_account_token(&s.admin, &s.release_namespace, &s.agent_account)
        .await
        .unwrap();
    let kubeconfig =
        tokens::write_token_kubeconfig(&s.admin_kubeconfig, &unbound, &s.tokens_dir, "unbound")
            .unwrap();
    let unbound_nodes: Api<Node> = Api::all(client_for(&kubeconfig).await.unwrap());
    expect(
        "label a node with a token bound to no pod",
        answer(
            unbound_nodes
                .patch(own_node, &pp, &label("0.0.0-unbound"))
                .await,
        ),
        422,
        "only change the node it runs on",
    );

    assert!(
        failures.is_empty(),
        "the agent token's answers differ:\n  {}",
        failures.join("\n  ")
    );
    let n = s.nodes().get(own_node).await.unwrap();
    assert_eq!(
        n.labels().get(labels::TT_SMI_VERSION).map(String::as_str),
        Some(TT_SMI)
    );
    assert!(!n.labels().contains_key(labels::SKIP));
}
