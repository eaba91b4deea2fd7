//! The controller image against a real control plane (`TTDP_TEST_KUBECONFIG`): the chart is
//! installed into a fresh namespace with both built digests; the image's entrypoint runs out of
//! cluster inside the image (`buildah run --isolation chroot`: the image's user 65532, its
//! environment plus the installed Deployment's, the host's network) with a kubeconfig holding a
//! token of the chart's controller ServiceAccount; it must become ready, take its lease, render a policy's DaemonSet with the
//! agent image by digest, and remove its finalizer on deletion, with no request refused.
//! Everything it created is removed at the end, also when a check fails.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::os::unix::fs::PermissionsExt;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::container::Container;
use super::{Report, expect_success, scratch};
use crate::chart::CHART_DIR;
use crate::image::{self, Built};
use crate::tools::{self, output};

pub fn checks(
    root: &Path,
    work: &Path,
    agent: &Built,
    controller: &Built,
    report: &mut Report,
) -> Result<()> {
    let storage = image::image_dir(root)?.join("buildah");
    report.check("controller: ttdp-controller --version", || {
        let ctr = Container::from_archive(&storage, &controller.archive.path)?;
        let out = ctr.run(&[], &[], &["/usr/local/bin/ttdp-controller", "--version"])?;
        expect_success(&out, env!("CARGO_PKG_VERSION"))
    });
    let rootfs = work.join("controller-rootfs");
    report.check(
        "controller: the image holds only its binary and CA bundle",
        || {
            if rootfs.exists() {
                std::fs::remove_dir_all(&rootfs)?;
            }
            controller.archive.unpack(&rootfs)?;
            only_expected_files(&rootfs)
        },
    );
    report.check(
        "controller: drives a policy on the control plane as the chart's ServiceAccount",
        || {
            let kubeconfig = std::env::var_os("TTDP_TEST_KUBECONFIG").context(
            "TTDP_TEST_KUBECONFIG is not set: run inside scripts/test-all.sh, or start a control \
             plane (cargo build -p ttdp-testkit --bin ttdp-control-plane && \
             target/debug/ttdp-control-plane --kubeconfig F) and export TTDP_TEST_KUBECONFIG=F",
        )?;
            let ctr = Container::from_archive(&storage, &controller.archive.path)?;
            let cluster = Cluster::install(root, PathBuf::from(kubeconfig), agent, controller)?;
            cluster.drive(&ctr, &scratch(work, "controller-run")?, agent)
        },
    );
    Ok(())
}

fn only_expected_files(rootfs: &Path) -> Result<()> {
    let out = Command::new("find")
        .arg(".")
        .args(["-type", "f"])
        .current_dir(rootfs)
        .output()?;
    let mut files: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    files.sort();
    let want = [
        "./etc/ssl/certs/ca-certificates.crt",
        "./usr/local/bin/ttdp-controller",
    ];
    if files != want {
        bail!("the controller image holds {files:?}, want {want:?}");
    }
    Ok(())
}

/// The chart installed in a namespace of its own; uninstalled on drop.
struct Cluster {
    kubeconfig: PathBuf,
    namespace: String,
    release: String,
    policy: String,
    controller: Option<Child>,
}

impl Cluster {
    fn install(root: &Path, kubeconfig: PathBuf, agent: &Built, ctl: &Built) -> Result<Self> {
        let suffix = format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis()
                % 0xff_ffff
        );
        let cluster = Self {
            kubeconfig,
            namespace: format!("ttdp-image-{suffix}"),
            release: format!("img-{suffix}"),
            policy: format!("image-test-{suffix}"),
            controller: None,
        };
        let set = |k: &str, v: &str| ["--set".to_owned(), format!("{k}={v}")];
        let mut args = vec![
            "install".to_owned(),
            cluster.release.clone(),
            root.join(CHART_DIR).display().to_string(),
            "--namespace".to_owned(),
            cluster.namespace.clone(),
            "--create-namespace".to_owned(),
        ];
        args.extend(set("image.repository", ctl.which.repository()));
        args.extend(set("image.digest", &ctl.archive.digest));
        args.extend(set("driver.repository", agent.which.repository()));
        args.extend(set("driver.digest", &agent.archive.digest));
        // no kubelet runs the Deployment's pod: pin it to a node that does not exist
        args.extend(set(
            "controller.nodeSelector.kubernetes\\.io/hostname",
            "none",
        ));
        cluster.helm(&args)?;
        Ok(cluster)
    }

    fn helm(&self, args: &[String]) -> Result<String> {
        let mut cmd = Command::new(tools::kube_tool("helm")?);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        output(&mut cmd)
    }

    fn kubectl(&self, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new(tools::kube_tool("kubectl")?);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        output(&mut cmd)
    }

    fn drive(mut self, ctr: &Container, run: &Path, agent: &Built) -> Result<()> {
        let env = self.deployment_env()?;
        let secrets = run.join("kubeconfig");
        self.write_sa_kubeconfig(&secrets)?;
        let port = free_port()?;
        let address = format!("127.0.0.1:{port}");
        let mut env: Vec<(&str, &str)> = env
            .iter()
            .filter(|(k, _)| k != "TTDP_METRICS_ADDRESS")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        env.extend([
            ("KUBECONFIG", "/ttdp/kubeconfig"),
            ("TTDP_METRICS_ADDRESS", &address),
        ]);
        let log = run.join("controller.log");
        // the image's entrypoint, as the Deployment runs it (no command or args of its own)
        let mut cmd = ctr.command(
            &[(&secrets, "/ttdp", true)],
            &env,
            &["/usr/local/bin/ttdp-controller"],
        );
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(run.join("controller.err"))?);
        self.controller = Some(cmd.spawn().context("starting the controller image")?);
        let result = self.exercise(port, agent);
        let logs = std::fs::read_to_string(&log).unwrap_or_default()
            + &std::fs::read_to_string(run.join("controller.err")).unwrap_or_default();
        let refused: Vec<&str> = logs.lines().filter(|l| is_refusal(l)).collect();
        match (result, refused.is_empty()) {
            (Err(e), _) => Err(e.context(format!("controller log {}", log.display()))),
            (Ok(()), false) => bail!("requests were refused:\n{}", refused.join("\n")),
            (Ok(()), true) => Ok(()),
        }
    }

    /// Ready, a DaemonSet with the agent image by digest, the finalizer removed on deletion.
    fn exercise(&mut self, port: u16, agent: &Built) -> Result<()> {
        self.wait("the controller to be ready", Duration::from_secs(90), |c| {
            c.exited()?;
            Ok(http_status(port, "/readyz") == Some(200))
        })?;
        let policy = json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": {"name": self.policy},
            "spec": {"version": "2.8.0", "nodeAffinity": {"matchLabels": {"ttdp.test/run": self.policy}}},
        });
        let file = std::env::temp_dir().join(format!("{}.json", self.policy));
        std::fs::write(&file, policy.to_string())?;
        self.kubectl(&["apply", "-f", &file.display().to_string()])?;
        let ds = format!("ttdrv-{}", self.policy);
        let want = agent.reference();
        self.wait("the policy's DaemonSet", Duration::from_secs(60), |c| {
            c.exited()?;
            let Ok(text) = c.kubectl(&["get", "ds", &ds, "-n", &c.namespace, "-o", "json"]) else {
                return Ok(false);
            };
            let ds: Value = serde_json::from_str(&text)?;
            let image = &ds["spec"]["template"]["spec"]["containers"][0]["image"];
            if image.as_str().is_some_and(|i| i != want) {
                bail!("the DaemonSet runs {image}, want {want}");
            }
            Ok(!image.is_null())
        })?;
        self.kubectl(&["delete", "ttdp", &self.policy, "--timeout=60s"])?;
        Ok(())
    }

    fn exited(&mut self) -> Result<()> {
        if let Some(status) = self
            .controller
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            bail!("the controller exited with {status}");
        }
        Ok(())
    }

    fn wait(
        &mut self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&mut Self) -> Result<bool>,
    ) -> Result<()> {
        let start = Instant::now();
        while !done(self)? {
            if start.elapsed() > limit {
                bail!("no {what} within {} s", limit.as_secs());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(())
    }

    /// The controller container's environment as installed, with the downward API filled in.
    fn deployment_env(&self) -> Result<Vec<(String, String)>> {
        let name = format!("{}-controller", self.release);
        let text = self.kubectl(&["get", "deploy", &name, "-n", &self.namespace, "-o", "json"])?;
        let deploy: Value = serde_json::from_str(&text)?;
        let env = deploy["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .context("the Deployment's container has no env")?;
        env.iter()
            .map(|e| {
                let name = e["name"].as_str().context("env without a name")?.to_owned();
                let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    Some("metadata.namespace") => self.namespace.clone(),
                    Some("metadata.name") => "image-test-controller".to_owned(),
                    Some(other) => bail!("unexpected fieldRef {other}"),
                    None => e["value"].as_str().unwrap_or_default().to_owned(),
                };
                Ok((name, value))
            })
            .collect()
    }

    /// A kubeconfig with a token of the chart's controller ServiceAccount, readable by the
    /// image's user, in `dir` (mounted at `/ttdp`).
    fn write_sa_kubeconfig(&self, dir: &Path) -> Result<()> {
        let sa = format!("{}-controller", self.release);
        let token = self.kubectl(&[
            "create",
            "token",
            &sa,
            "-n",
            &self.namespace,
            "--duration=1h",
        ])?;
        let admin: Value = serde_json::from_str(&self.kubectl(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "--flatten",
            "-o",
            "json",
        ])?)?;
        let cluster = &admin["clusters"][0]["cluster"];
        let config = json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "sa", "user": {"token": token.trim()}}],
            "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": self.namespace}}],
        });
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        std::fs::write(dir.join("kubeconfig"), config.to_string())?;
        std::fs::set_permissions(
            dir.join("kubeconfig"),
            std::fs::Permissions::from_mode(0o644),
        )?;
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.controller.take() {
            // the policy's finalizer needs the controller: delete while it runs
            let _ = self.kubectl(&[
                "delete",
                "ttdp",
                &self.policy,
                "--ignore-not-found",
                "--timeout=30s",
            ]);
            // SIGTERM: buildah passes it on (SIGKILL would leave the controller running)
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let stopped = Instant::now();
            while child.try_wait().ok().flatten().is_none()
                && stopped.elapsed() < Duration::from_secs(20)
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let patch = r#"{"metadata":{"finalizers":null}}"#;
        let _ = self.kubectl(&["patch", "ttdp", &self.policy, "--type=merge", "-p", patch]);
        let _ = self.helm(&[
            "uninstall".into(),
            self.release.clone(),
            "-n".into(),
            self.namespace.clone(),
            "--wait".into(),
        ]);
        let _ = self.kubectl(&["delete", "namespace", &self.namespace, "--timeout=60s"]);
    }
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The HTTP status of `GET path` on loopback, if it answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Whether a controller log line reports a refused request: the status 403 as a number of its
/// own (a timestamp such as `58.354039Z` holds the digits too) or the word "forbidden".
fn is_refusal(line: &str) -> bool {
    line.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|token| token == "403")
        || line.to_lowercase().contains("forbidden")
}

#[cfg(test)]
mod tests {
    use super::is_refusal;

    #[test]
    fn a_refusal_is_a_403_or_forbidden_not_a_timestamp_that_holds_the_digits() {
        let ready = r#"{"timestamp":"2026-12-06T04:55:58.354039Z","level":"INFO","fields":{"message":"initial watches synced; ready"}}"#;
        assert!(!is_refusal(ready));
        assert!(is_refusal(
            r#"ApiError: nodes "n1" is forbidden: User "system:serviceaccount:x:y" cannot patch resource "nodes""#
        ));
        assert!(is_refusal(r#"{"code":403,"reason":"Unknown"}"#));
        assert!(is_refusal("request failed status=403"));
    }
}
