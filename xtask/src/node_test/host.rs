//! What a real node could leave on the host, as a set of lines to compare before and after:
//! mount points, iptables and ip6tables chains, network interfaces, network namespaces, pod
//! logs, `kubepods` cgroups, the node's folders in /tmp, and the node's processes (containerd
//! and its shims, the kubelet, kube-proxy, or anything whose command line names the test's
//! folder or the node's).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The host now; `work` is the test's folder (the launcher's run folders are under it).
pub fn snapshot(work: &Path) -> BTreeSet<String> {
    let mut lines = BTreeSet::new();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let work = work.display().to_string();
    // What names the node's (other work on the machine mounts and starts things too).
    let ours = [
        work.as_str(),
        "ttdp-node-",
        "/run/netns",
        "containerd",
        "kubelet",
        "kube-proxy",
        "/var/lib/cni",
    ];
    let is_ours = |text: &str| ours.iter().any(|n| text.contains(n));
    lines.extend(
        mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| is_ours(m))
            .map(|m| format!("mount {m}")),
    );
    for family in ["iptables-save", "ip6tables-save"] {
        let out = Command::new(family).output();
        let text = out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let mut table = String::new();
        for line in text.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name.to_owned();
            }
            if let Some(chain) = line.strip_prefix(':') {
                let chain = chain.split(' ').next().unwrap_or_default();
                lines.insert(format!("{family} {table} chain {chain}"));
            }
        }
    }
    let folders = [
        "/sys/class/net",
        "/run/netns",
        "/var/log/pods",
        "/var/log/containers",
        "/var/lib/cni",
        "/run/containerd",
        "/tmp",
    ];
    for folder in folders {
        if Path::new(folder).exists() {
            lines.insert(format!("folder {folder}"));
        }
        let entries = std::fs::read_dir(folder).into_iter().flatten().flatten();
        let entries = entries.map(|e| e.path().display().to_string());
        // /tmp is everyone's: only the node's folders there.
        let entries = entries.filter(|e| folder != "/tmp" || e.starts_with("/tmp/ttdp-node-"));
        lines.extend(entries.map(|e| format!("entry {e}")));
    }
    let cgroups = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten();
    lines.extend(
        cgroups
            .map(|c| c.path().join("kubepods"))
            .filter(|p| p.exists())
            .map(|p| format!("cgroup {}", p.display())),
    );
    let procs = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    for entry in procs {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if is_ours(&cmdline) {
            let pid = entry.file_name().to_string_lossy().into_owned();
            lines.insert(format!("process {pid} {}", cmdline.trim()));
        }
    }
    lines
}

/// The lines of `after` that `before` lacks.
pub fn new_since(before: &BTreeSet<String>, after: &BTreeSet<String>) -> Vec<String> {
    after.difference(before).cloned().collect()
}
