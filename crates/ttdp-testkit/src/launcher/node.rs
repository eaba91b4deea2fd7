//! One real node beside the control plane: containerd (root, state, socket and runc state of its
//! own in a fresh `/tmp/ttdp-node-*`, so a system containerd is never touched), the kubelet and
//! kube-proxy (their logs in the control plane's run folder), on the host's non-loopback
//! address. Pods really run on it: a chart's Deployment
//! runs with its probes, in-cluster clients reach the API server through the `kubernetes`
//! Service (kube-proxy's iptables rules), and `kubectl logs` reaches the kubelet.
//!
//! There is no registry: the sandbox ("pause") image is built locally (busybox-static's `sleep`
//! in an image from scratch, with buildah) and imported, as tests import theirs with
//! `ctr --address <RealNode::containerd_socket> -n k8s.io images import`.
//!
//! Stopping removes what the node put on the host ([`host`]): containers, mounts, network
//! namespaces, the pod bridge, the iptables chains the kubelet, kube-proxy and the CNI plugins
//! added, the pod cgroups, and the log folders of pods.

mod configs;
pub mod host;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::LaunchError;
use super::assets::{Assets, kube_dir};
use super::process::Processes;

/// The node's name (one real node per machine: its bridge, ports and iptables rules are the
/// host's).
pub const NODE_NAME: &str = "ttdp-real-node";

/// The pods' addresses, on the bridge [`BRIDGE`].
pub const POD_NETWORK: &str = "10.88.0.0/16";

/// The bridge the CNI plugin puts pods on.
pub const BRIDGE: &str = "ttdp0";

/// The local sandbox image every pod's network namespace is held by.
pub const PAUSE_IMAGE: &str = "localhost/ttdp-pause:1";

/// Where containerd's own tools are (Debian's `containerd` package).
const CONTAINERD: &str = "/usr/bin/containerd";
const CTR: &str = "/usr/bin/ctr";

/// How long the node may take to register Ready and kube-proxy to write the Service rules.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// A running real node; dropping it stops it and cleans the host (see the module docs).
#[derive(Debug)]
pub struct RealNode {
    dir: PathBuf,
    socket: PathBuf,
    address: IpAddr,
    /// The kubelet and kube-proxy, stopped first.
    daemons: Processes,
    /// containerd, stopped once its containers are gone.
    runtime: Processes,
    before: host::HostState,
}

impl RealNode {
    /// Starts containerd, the kubelet and kube-proxy against the API server of `admin` (which
    /// must listen on `address` too), their logs in `logs`, and returns once the node is Ready
    /// and the `kubernetes` Service has its rules.
    ///
    /// Their state goes to a fresh `/tmp/ttdp-node-*` (removed when the node stops): the
    /// kubelet and containerd make Unix sockets in it, whose paths must stay under 108 bytes.
    pub(super) fn start(
        logs: &Path,
        admin: &Path,
        address: IpAddr,
    ) -> Result<RealNode, LaunchError> {
        let assets = Assets::locate_node()?;
        let pause = pause_image()?;
        let before = host::HostState::record();
        let dir = tempfile::Builder::new()
            .prefix("ttdp-node-")
            .tempdir_in("/tmp")
            .map_err(LaunchError::io("a folder for the node in /tmp"))?
            .keep();
        let dir = dir.as_path();
        let socket = dir.join("containerd.sock");
        let mut node = RealNode {
            dir: dir.to_path_buf(),
            socket: socket.clone(),
            address,
            daemons: Processes::new(logs.to_path_buf(), admin.to_path_buf())?,
            runtime: Processes::new(logs.to_path_buf(), admin.to_path_buf())?,
            before,
        };
        let containerd_config = configs::containerd(dir, &socket)?;
        let args = [format!("--config={}", containerd_config.display())];
        node.runtime
            .spawn_program("containerd", Path::new(CONTAINERD), &args)?;
        node.wait_for_containerd()?;
        node.ctr(&["images", "import", "--base-name", pause_repository()])
            .arg(&pause)
            .output()
            .map_err(LaunchError::io("ctr images import (the sandbox image)"))
            .and_then(|out| checked("ctr images import", out))?;
        let kubelet = configs::kubelet(dir, admin, &socket, address)?;
        node.daemons
            .spawn_program("kubelet", &assets.binary("kubelet"), &kubelet)?;
        let proxy = configs::kube_proxy(admin)?;
        node.daemons
            .spawn_program("kube-proxy", &assets.binary("kube-proxy"), &proxy)?;
        node.daemons
            .wait_for("kubelet", "did not register a Ready node", node_ready)?;
        node.wait_for_service_rules()?;
        Ok(node)
    }

    /// containerd's socket, for `ctr --address`.
    pub fn containerd_socket(&self) -> &Path {
        &self.socket
    }

    /// The address the node, and the API server, are reached on.
    pub fn address(&self) -> IpAddr {
        self.address
    }

    /// `ctr --address <socket> -n k8s.io ARGS`.
    fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(CTR);
        cmd.arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io"])
            .args(args);
        cmd
    }

    fn wait_for_containerd(&mut self) -> Result<(), LaunchError> {
        self.poll("containerd", "did not answer on its socket", |node| {
            let out = node.ctr(&["version"]).output();
            out.is_ok_and(|o| o.status.success())
        })
    }

    /// kube-proxy has written the `kubernetes` Service's rules: pods reach the API server.
    fn wait_for_service_rules(&mut self) -> Result<(), LaunchError> {
        self.poll("kube-proxy", "wrote no rule for default/kubernetes", |_| {
            let out = Command::new("iptables")
                .args(["-w", "-t", "nat", "-S", "KUBE-SERVICES"])
                .output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("default/kubernetes"))
        })
    }

    fn poll(
        &mut self,
        component: &'static str,
        problem: &str,
        done: impl Fn(&RealNode) -> bool,
    ) -> Result<(), LaunchError> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            self.runtime.check_running()?;
            self.daemons.check_running()?;
            if done(self) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(LaunchError::Component {
                    component,
                    problem: format!("{problem} after {READY_WITHIN:?}"),
                    log: self.daemons.log(component),
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Kills every container still running (a test that cleaned up leaves none), so that the
    /// shims exit with them.
    fn remove_containers(&self) {
        let list = |what: &str| {
            self.ctr(&[what, "ls", "-q"])
                .output()
                .map(|o| {
                    let text = String::from_utf8_lossy(&o.stdout);
                    text.split_whitespace()
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        for task in list("tasks") {
            let _ = self.ctr(&["tasks", "delete", "--force", &task]).output();
        }
        for container in list("containers") {
            let _ = self.ctr(&["containers", "delete", &container]).output();
        }
    }

    fn stop(&mut self) {
        self.daemons.stop();
        self.remove_containers();
        self.runtime.stop();
        host::clean(&self.before, &self.dir);
        let left = self.before.leftovers(&self.dir);
        if left.is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("the real node left on the host:\n  {}", left.join("\n  "));
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The address other hosts, and pods, reach this one on: `TTDP_NODE_IP`, else the source
/// address of the default route (a UDP socket's connect sends nothing).
pub(super) fn host_address() -> Result<IpAddr, LaunchError> {
    if let Some(text) = std::env::var_os("TTDP_NODE_IP") {
        let text = text.to_string_lossy();
        return text
            .parse()
            .map_err(|e| LaunchError::Kube(format!("TTDP_NODE_IP={text}: {e}")));
    }
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").map_err(LaunchError::io("a UDP socket"))?;
    // TEST-NET-3: never a local network, so the kernel picks the default route.
    socket.connect("203.0.113.1:9").map_err(LaunchError::io(
        "finding the default route's address (set TTDP_NODE_IP)",
    ))?;
    let address = socket
        .local_addr()
        .map_err(LaunchError::io("the default route's address"))?
        .ip();
    if address.is_loopback() || address.is_unspecified() {
        return Err(LaunchError::Kube(format!(
            "the default route's address is {address}: set TTDP_NODE_IP to a non-loopback address"
        )));
    }
    Ok(address)
}

/// Whether the node has registered with condition Ready=True.
async fn node_ready(client: kube::Client) -> Option<()> {
    let nodes: Api<Node> = Api::all(client);
    let node = nodes.get_opt(NODE_NAME).await.ok().flatten()?;
    let conditions = node.status?.conditions?;
    conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
        .then_some(())
}

fn pause_repository() -> &'static str {
    PAUSE_IMAGE.split(':').next().unwrap_or(PAUSE_IMAGE)
}

/// The sandbox image's OCI archive, `<target>/ttdp-kube/pause.oci.tar`, built once: a static
/// busybox's `sleep` as the entrypoint, in an image from scratch.
fn pause_image() -> Result<PathBuf, LaunchError> {
    let parent = kube_dir();
    let archive = parent.join("pause.oci.tar");
    if archive.is_file() {
        return Ok(archive);
    }
    std::fs::create_dir_all(&parent).map_err(LaunchError::io(parent.display()))?;
    let storage = tempfile::tempdir_in(&parent).map_err(LaunchError::io("buildah storage"))?;
    let staging = storage.path().join("pause.oci.tar");
    let root = storage.path().join("root");
    let runroot = storage.path().join("run");
    let buildah = |args: &[&str]| -> Result<String, LaunchError> {
        let out = Command::new("buildah")
            .arg("--root")
            .arg(&root)
            .arg("--runroot")
            .arg(&runroot)
            .args(["--storage-driver", "vfs"])
            .args(args)
            .output()
            .map_err(LaunchError::io("running buildah (the sandbox image)"))?;
        checked(&format!("buildah {}", args.join(" ")), out)
    };
    let busybox = busybox_static()?;
    let container = buildah(&["from", "scratch"])?;
    let container = container.trim();
    buildah(&["copy", container, &busybox, "/busybox"])?;
    let entrypoint = r#"["/busybox","sleep","999999999"]"#;
    buildah(&["config", "--entrypoint", entrypoint, container])?;
    buildah(&["commit", "-q", container, PAUSE_IMAGE])?;
    let target = format!("oci-archive:{}:{PAUSE_IMAGE}", staging.display());
    buildah(&["push", "-q", PAUSE_IMAGE, &target])?;
    // Another process may have won the race: its archive is as good as ours.
    let _ = std::fs::rename(&staging, &archive);
    Ok(archive)
}

/// busybox-static's binary (Debian's package puts it at /bin/busybox): the sandbox image has no
/// libraries, so a dynamically linked busybox (one that names an ELF interpreter) cannot serve.
fn busybox_static() -> Result<String, LaunchError> {
    let path = std::env::var("TTDP_BUSYBOX_STATIC").unwrap_or_else(|_| "/bin/busybox".into());
    let missing = |why: &str| {
        LaunchError::MissingAssets(format!(
            "{path} {why}: install busybox-static or set TTDP_BUSYBOX_STATIC"
        ))
    };
    let bytes = std::fs::read(&path).map_err(|e| missing(&e.to_string()))?;
    match has_interpreter(&bytes) {
        Some(false) => Ok(path),
        Some(true) => Err(missing("is dynamically linked")),
        None => Err(missing("is not a 64-bit ELF executable")),
    }
}

/// Whether a 64-bit little-endian ELF file has a `PT_INTERP` program header; `None` if it is
/// not one.
fn has_interpreter(elf: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if elf.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let number = |at: usize, size: usize| -> Option<usize> {
        let bytes = elf.get(at..at + size)?;
        Some(
            bytes
                .iter()
                .rev()
                .fold(0usize, |n, b| (n << 8) | usize::from(*b)),
        )
    };
    let (table, entry, count) = (number(0x20, 8)?, number(0x36, 2)?, number(0x38, 2)?);
    let mut headers = (0..count).map(|i| number(table + i * entry, 4));
    headers.try_fold(false, |found, kind| {
        Some(found || kind? == PT_INTERP as usize)
    })
}

/// `out`'s stdout, or an error with its stderr.
fn checked(what: &str, out: std::process::Output) -> Result<String, LaunchError> {
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(LaunchError::Kube(format!(
            "{what} failed ({}): {}",
            out.status,
            stderr.trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
