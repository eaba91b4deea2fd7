//! `ttdp-control-plane --with-node` as a child process: a control plane of its own with the real
//! node, stopped (SIGTERM, so that it cleans the host) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{kube_command, output};

/// The node's name, as the launcher registers it.
pub const NODE_NAME: &str = "ttdp-real-node";

/// Starting the control plane, building the sandbox image on first use, and the node turning
/// Ready take about 25 s here.
const UP_WITHIN: Duration = Duration::from_secs(240);
const DOWN_WITHIN: Duration = Duration::from_secs(90);

/// A running `ttdp-control-plane --with-node`.
pub struct NodeCluster {
    child: Child,
    kubeconfig: PathBuf,
    socket: PathBuf,
    err: PathBuf,
}

impl NodeCluster {
    /// Starts the launcher built beside this xtask, its run folder under `work/runs`, and waits
    /// for its two lines: the kubeconfig and containerd's socket.
    pub fn start(work: &Path) -> Result<NodeCluster> {
        let exe = std::env::current_exe()?;
        let launcher = exe.with_file_name("ttdp-control-plane");
        if !launcher.is_file() {
            bail!(
                "{} is missing: cargo build -p ttdp-testkit --bin ttdp-control-plane (the test \
                 script's cargo test --workspace --no-run builds it)",
                launcher.display()
            );
        }
        let out = work.join("control-plane.out");
        let err = work.join("control-plane.err");
        // SIGTERM when this process ends, however it ends: the launcher then cleans the host.
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "TERM", "--"])
            .arg(&launcher)
            .arg("--with-node")
            .arg("--kubeconfig")
            .arg(work.join("kubeconfig"))
            .arg("--runs")
            .arg(work.join("runs"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&err)?)
            .spawn()
            .with_context(|| format!("starting {}", launcher.display()))?;
        let mut cluster = NodeCluster {
            child,
            kubeconfig: PathBuf::new(),
            socket: PathBuf::new(),
            err,
        };
        let started = Instant::now();
        let lines = loop {
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            let lines: Vec<PathBuf> = text.lines().map(PathBuf::from).collect();
            if lines.len() >= 2 {
                break lines;
            }
            if let Some(status) = cluster.child.try_wait()? {
                bail!("the launcher exited ({status}): {}", cluster.stderr());
            }
            if started.elapsed() > UP_WITHIN {
                bail!(
                    "no control plane with a real node within {UP_WITHIN:?}: {}",
                    cluster.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        println!(
            "    control plane and real node up in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        cluster.kubeconfig = lines[0].clone();
        cluster.socket = lines[1].clone();
        Ok(cluster)
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Imports the OCI archive `archive` (whose reference name is a bare tag) as
    /// `repository:<tag>`, and tags it twice more: three names of one image, so that moving the
    /// chart from one to the next changes the pod template as a new version does.
    pub fn import(&self, archive: &Path, repository: &str) -> Result<[String; 3]> {
        let imported = self.ctr(&[
            "images",
            "import",
            "--base-name",
            repository,
            &archive.display().to_string(),
        ])?;
        let name = imported
            .split_whitespace()
            .find(|w| w.starts_with(repository))
            .context(format!("ctr images import named nothing: {imported}"))?
            .to_owned();
        let tags = ["node-test-1", "node-test-2", "node-test-3"].map(String::from);
        for tag in &tags {
            self.ctr(&[
                "images",
                "tag",
                "--force",
                &name,
                &format!("{repository}:{tag}"),
            ])?;
        }
        Ok(tags)
    }

    /// `helm --kubeconfig <its kubeconfig> ARGS`.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        output(kube_command("helm", &self.kubeconfig)?.args(args))
    }

    /// `kubectl --kubeconfig <its kubeconfig> ARGS`.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        output(kube_command("kubectl", &self.kubeconfig)?.args(args))
    }

    /// `ctr --address <its containerd> -n k8s.io ARGS`.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io"]);
        output(cmd.args(args))
    }
}

impl Drop for NodeCluster {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let stopping = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() && stopping.elapsed() < DOWN_WITHIN {
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        println!(
            "    control plane and real node stopped in {:.1} s",
            stopping.elapsed().as_secs_f64()
        );
    }
}
