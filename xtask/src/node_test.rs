//! `cargo xtask node-test`: the chart's controller Deployment on a real node (containerd, kubelet,
//! kube-proxy, started by `ttdp-control-plane --with-node` beside a control plane of its own), so
//! that its readiness probe really runs, as an admin installs and upgrades it:
//! - `helm install` with `replicas: 2`: both pods turn Ready, one holds the leader Lease and
//!   answers `/readyz` `ready`, the other answers `ready: standing by for the leader lease`;
//! - `helm upgrade --wait` to a new controller image (the same archive under another tag, as a
//!   new version is to the Deployment: a changed pod template) completes; the new pods are Ready,
//!   the old ones gone, and one of the new pods holds the Lease;
//! - the same with one replica;
//! - `helm uninstall` leaves no pod and no container on the node, and once the launcher stops,
//!   nothing of the node is left on the host (mounts, iptables chains, bridge, cgroups,
//!   processes, network namespaces, pod logs).
//!
//! With readiness tied to leadership, the upgrades time out: the new pod waits for a Lease the
//! old pod keeps, and the rolling update waits for the new pod.

mod host;
mod launcher;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::chart::CHART_DIR;
use crate::image::{self, Which};
use crate::image_test::{Report, scratch};
use crate::tools::{self, output, repo_root};
use launcher::NodeCluster;

const NAMESPACE: &str = "ttdp-node-test";
const RELEASE: &str = "node-test";
const LEASE: &str = "ttdp-controller";
/// What `helm --wait` may take: far more than a rollout of ready pods needs (seconds), far less
/// than forever.
const HELM_WAIT: &str = "90s";
/// How long the new pods may take to settle after `helm --wait` returns: old pods terminating,
/// a new pod taking the Lease the old leader released.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);
/// The chart's default `metrics.port`, where `/readyz` is served.
const METRICS_PORT: u16 = 8080;
const STANDING_BY: &str = "ready: standing by for the leader lease";

/// Entry point of `cargo xtask node-test`.
pub fn run(args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("usage: cargo xtask node-test");
    }
    let started = Instant::now();
    let controller = image::build(Which::Controller, None)?;
    let root = repo_root()?;
    let work = scratch(&image::image_dir(&root)?.join("test"), "real-node")?;
    let before = host::snapshot(&work);
    let mut report = Report::default();
    {
        let cluster = NodeCluster::start(&work)?;
        let tags = cluster.import(&controller.archive.path, Which::Controller.repository())?;
        let chart = Chart {
            cluster: &cluster,
            dir: root.join(CHART_DIR),
        };
        report.check(
            "real node: helm install, 2 replicas: one leads, one stands by",
            || {
                chart.install(&tags[0])?;
                chart.settled(2, &[], &tags[0]).map(|_| ())
            },
        );
        report.check(
            "real node: helm upgrade --wait, 2 replicas, new image",
            || chart.upgrade(&tags[1], 2),
        );
        report.check(
            "real node: helm upgrade --wait, 1 replica, new image",
            || {
                chart.helm_upgrade(&["--set", "controller.replicas=1"])?;
                chart.upgrade(&tags[2], 1)
            },
        );
        report.check(
            "real node: helm uninstall leaves no pod or container",
            || chart.uninstall(),
        );
        chart.cleanup();
    }
    report.check("real node: nothing of the node left on the host", || {
        let left = host::new_since(&before, &host::snapshot(&work));
        if !left.is_empty() {
            bail!("left on the host:\n  {}", left.join("\n  "));
        }
        Ok(())
    });
    report.finish_as("node-test", started)
}

/// The chart, installed on the node's cluster.
struct Chart<'a> {
    cluster: &'a NodeCluster,
    dir: std::path::PathBuf,
}

/// A controller pod as the checks see it.
#[derive(Debug)]
struct ControllerPod {
    name: String,
    image: String,
    node: String,
    ready: bool,
    terminating: bool,
}

impl Chart<'_> {
    fn install(&self, tag: &str) -> Result<()> {
        let chart = self.dir.display().to_string();
        let tag = format!("image.tag={tag}");
        let args = [
            "install",
            RELEASE,
            &chart,
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--set",
            &format!("image.repository={}", Which::Controller.repository()),
            "--set",
            &tag,
            "--set",
            "image.digest=",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "controller.replicas=2",
            "--wait",
            "--timeout",
            HELM_WAIT,
        ];
        self.cluster.helm(&args).map(|_| ())
    }

    fn helm_upgrade(&self, sets: &[&str]) -> Result<()> {
        let chart = self.dir.display().to_string();
        let mut args = vec!["upgrade", RELEASE, &chart, "--namespace", NAMESPACE];
        args.extend(["--reuse-values", "--wait", "--timeout", HELM_WAIT]);
        args.extend_from_slice(sets);
        self.cluster.helm(&args).map(|_| ())
    }

    /// `helm upgrade --wait` to `tag` completes, and the rollout settles on new pods.
    fn upgrade(&self, tag: &str, replicas: usize) -> Result<()> {
        let old = self.settled(replicas, &[], "")?;
        let old: Vec<String> = old.into_iter().map(|p| p.name).collect();
        let started = Instant::now();
        self.helm_upgrade(&["--set", &format!("image.tag={tag}")])
            .context("helm upgrade --wait did not complete")?;
        println!(
            "    helm upgrade --wait (replicas: {replicas}) took {:.1} s",
            started.elapsed().as_secs_f64()
        );
        self.settled(replicas, &old, tag).map(|_| ())
    }

    /// Waits until exactly `replicas` controller pods run on the real node, all Ready, none
    /// terminating, none of `old`, each with an image ending in `:tag` (unless `tag` is empty),
    /// and one of them holds the Lease; then checks that the holder answers `/readyz` `ready`
    /// and every other one `ready: standing by ...`.
    fn settled(&self, replicas: usize, old: &[String], tag: &str) -> Result<Vec<ControllerPod>> {
        let deadline = Instant::now() + SETTLE_WITHIN;
        loop {
            let pods = self.controller_pods()?;
            let holder = self.lease_holder()?;
            let problem = settle_problem(&pods, replicas, old, tag, holder.as_deref());
            let Some(problem) = problem else {
                self.check_readyz(&pods, holder.as_deref().unwrap_or_default())?;
                return Ok(pods);
            };
            if Instant::now() > deadline {
                bail!("not settled within {SETTLE_WITHIN:?}: {problem}; pods {pods:?}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn check_readyz(&self, pods: &[ControllerPod], holder: &str) -> Result<()> {
        for pod in pods {
            let path = format!(
                "/api/v1/namespaces/{NAMESPACE}/pods/{}:{METRICS_PORT}/proxy/readyz",
                pod.name
            );
            let body = self.cluster.kubectl(&["get", "--raw", &path])?;
            let want = if pod.name == holder {
                "ready"
            } else {
                STANDING_BY
            };
            if body.trim() != want {
                bail!("{} answers /readyz {body:?}, want {want:?}", pod.name);
            }
        }
        Ok(())
    }

    fn controller_pods(&self) -> Result<Vec<ControllerPod>> {
        let selector =
            format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=controller");
        let text = self.cluster.kubectl(&[
            "get", "pods", "-n", NAMESPACE, "-l", &selector, "-o", "json",
        ])?;
        let list: Value = serde_json::from_str(&text)?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        Ok(items.iter().map(controller_pod).collect())
    }

    fn lease_holder(&self) -> Result<Option<String>> {
        let args = ["get", "lease", LEASE, "-n", NAMESPACE, "--ignore-not-found"];
        let text = self
            .cluster
            .kubectl(&[&args[..], &["-o", "json"]].concat())?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        let lease: Value = serde_json::from_str(&text)?;
        let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default();
        Ok((!holder.is_empty()).then(|| holder.to_owned()))
    }

    /// `helm uninstall --wait`, the namespace deleted; then no pod is bound to the node and
    /// containerd runs no container.
    fn uninstall(&self) -> Result<()> {
        self.cluster
            .helm(&["uninstall", RELEASE, "-n", NAMESPACE, "--wait"])?;
        self.cluster
            .kubectl(&["delete", "namespace", NAMESPACE, "--timeout=90s"])?;
        let deadline = Instant::now() + SETTLE_WITHIN;
        loop {
            let field = format!("spec.nodeName={}", launcher::NODE_NAME);
            let pods = self.cluster.kubectl(&[
                "get",
                "pods",
                "-A",
                "--field-selector",
                &field,
                "-o",
                "name",
            ])?;
            let containers = self.cluster.ctr(&["containers", "ls", "-q"])?;
            if pods.trim().is_empty() && containers.trim().is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("still on the node: pods {pods:?}, containers {containers:?}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Whatever a failed check left: the release and its namespace.
    fn cleanup(&self) {
        let _ = self
            .cluster
            .helm(&["uninstall", RELEASE, "-n", NAMESPACE, "--wait"]);
        let _ = self.cluster.kubectl(&[
            "delete",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "--timeout=90s",
        ]);
    }
}

fn controller_pod(pod: &Value) -> ControllerPod {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let conditions = pod["status"]["conditions"].as_array().cloned();
    let ready = conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    ControllerPod {
        name: text(&pod["metadata"]["name"]),
        image: text(&pod["spec"]["containers"][0]["image"]),
        node: text(&pod["spec"]["nodeName"]),
        ready,
        terminating: !pod["metadata"]["deletionTimestamp"].is_null(),
    }
}

/// Why `pods` are not yet the settled rollout [`Chart::settled`] waits for; `None` when they are.
fn settle_problem(
    pods: &[ControllerPod],
    replicas: usize,
    old: &[String],
    tag: &str,
    holder: Option<&str>,
) -> Option<String> {
    if pods.len() != replicas {
        return Some(format!("{} pods, want {replicas}", pods.len()));
    }
    if let Some(pod) = pods.iter().find(|p| old.contains(&p.name) || p.terminating) {
        return Some(format!("{} is an old or terminating pod", pod.name));
    }
    if let Some(pod) = pods.iter().find(|p| p.node != launcher::NODE_NAME) {
        return Some(format!("{} runs on {:?}", pod.name, pod.node));
    }
    if let Some(pod) = pods.iter().find(|p| !p.ready) {
        return Some(format!("{} is not Ready", pod.name));
    }
    let suffix = format!(":{tag}");
    if let Some(pod) = pods
        .iter()
        .find(|p| !tag.is_empty() && !p.image.ends_with(&suffix))
    {
        return Some(format!("{} runs {}, want tag {tag}", pod.name, pod.image));
    }
    match holder {
        Some(holder) if pods.iter().any(|p| p.name == holder) => None,
        other => Some(format!(
            "the Lease is held by {other:?}, not by one of the pods"
        )),
    }
}

fn kube_command(tool: &str, kubeconfig: &Path) -> Result<Command> {
    let mut cmd = Command::new(tools::kube_tool(tool)?);
    cmd.arg("--kubeconfig").arg(kubeconfig);
    Ok(cmd)
}
