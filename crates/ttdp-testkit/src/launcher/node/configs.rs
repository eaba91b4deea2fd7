//! The real node's configuration files and flags.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::{BRIDGE, NODE_NAME, PAUSE_IMAGE, POD_NETWORK};
use crate::launcher::LaunchError;

/// Where Debian's containernetworking-plugins are.
const CNI_BIN: &str = "/usr/lib/cni";

/// containerd's configuration (written to `dir/containerd.toml`, returned) and the pods' CNI
/// network (`dir/cni/`). Its root, state, socket, runc state and IP allocations are all under
/// `dir`. `restrict_oom_score_adj`: runc may not lower its own OOM score in this machine's
/// container; cgroupfs: the host has no systemd.
pub(super) fn containerd(dir: &Path, socket: &Path) -> Result<PathBuf, LaunchError> {
    let cni = dir.join("cni");
    std::fs::create_dir_all(&cni).map_err(LaunchError::io(cni.display()))?;
    let network = format!(
        r#"{{"cniVersion":"1.0.0","name":"ttdp","plugins":[
  {{"type":"bridge","bridge":"{BRIDGE}","isGateway":true,"ipMasq":true,"hairpinMode":true,
    "ipam":{{"type":"host-local","ranges":[[{{"subnet":"{POD_NETWORK}"}}]],
      "routes":[{{"dst":"0.0.0.0/0"}}],"dataDir":"{ipam}"}}}},
  {{"type":"portmap","capabilities":{{"portMappings":true}}}}]}}
"#,
        ipam = dir.join("ipam").display()
    );
    write(&cni.join("10-ttdp.conflist"), &network)?;
    let config = format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
      Root = "{runc}"
"#,
        root = dir.join("root").display(),
        state = dir.join("state").display(),
        socket = socket.display(),
        cni = cni.display(),
        runc = dir.join("runc").display(),
    );
    let path = dir.join("containerd.toml");
    write(&path, &config)?;
    Ok(path)
}

/// The kubelet's flags, its KubeletConfiguration written to `dir/kubelet.yaml`: cgroup v1 with
/// cgroupfs, no swap check, no node-allocatable enforcement, eviction only on a nearly full disk
/// (a small test disk must not evict the pods), anonymous access allowed (a test node), on
/// free ports of `address`.
pub(super) fn kubelet(
    dir: &Path,
    admin: &Path,
    socket: &Path,
    address: IpAddr,
) -> Result<Vec<String>, LaunchError> {
    let [port, healthz] = free_ports(address)?;
    let config = format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
enforceNodeAllocatable: []
evictionHard:
  memory.available: "1%"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
address: "{address}"
port: {port}
healthzBindAddress: "{address}"
healthzPort: {healthz}
readOnlyPort: 0
containerRuntimeEndpoint: "unix://{socket}"
"#,
        socket = socket.display()
    );
    let path = dir.join("kubelet.yaml");
    write(&path, &config)?;
    Ok(vec![
        format!("--config={}", path.display()),
        format!("--kubeconfig={}", admin.display()),
        format!("--hostname-override={NODE_NAME}"),
        format!("--node-ip={address}"),
        format!("--root-dir={}", dir.join("kubelet").display()),
    ])
}

/// kube-proxy's flags: iptables mode for the pod network, its health and metrics on free
/// loopback ports.
pub(super) fn kube_proxy(admin: &Path) -> Result<Vec<String>, LaunchError> {
    let loopback = IpAddr::from([127, 0, 0, 1]);
    let [healthz, metrics] = free_ports(loopback)?;
    Ok(vec![
        format!("--kubeconfig={}", admin.display()),
        format!("--hostname-override={NODE_NAME}"),
        "--proxy-mode=iptables".into(),
        format!("--cluster-cidr={POD_NETWORK}"),
        format!("--healthz-bind-address=127.0.0.1:{healthz}"),
        format!("--metrics-bind-address=127.0.0.1:{metrics}"),
    ])
}

/// Two ports of `address` the kernel had free a moment ago.
fn free_ports(address: IpAddr) -> Result<[u16; 2], LaunchError> {
    let a = std::net::TcpListener::bind((address, 0)).map_err(LaunchError::io("a free port"))?;
    let b = std::net::TcpListener::bind((address, 0)).map_err(LaunchError::io("a free port"))?;
    let port = |l: &std::net::TcpListener| l.local_addr().map(|a| a.port());
    Ok([
        port(&a).map_err(LaunchError::io("a free port"))?,
        port(&b).map_err(LaunchError::io("a free port"))?,
    ])
}

fn write(path: &Path, text: &str) -> Result<(), LaunchError> {
    std::fs::write(path, text).map_err(LaunchError::io(path.display()))
}
