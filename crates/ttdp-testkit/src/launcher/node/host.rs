//! What a real node puts on the host outside its run folder, recorded before it starts and
//! removed after it stops: mounts (under the run folder, and the pods' network namespaces in
//! `/run/netns`), the iptables chains of the kubelet, kube-proxy and the CNI plugins (`KUBE-*`,
//! `CNI-*`) and the rules jumping to them, the pod bridge, the `kubepods` cgroups, the pods' log
//! folders, IP forwarding (the bridge plugin turns it on), and containerd's shim sockets folder.
//! Only what was not there before is removed, so that a host's own rules stay.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::BRIDGE;

/// iptables and ip6tables: the kubelet writes both.
const FAMILIES: [&str; 2] = ["iptables", "ip6tables"];
const TABLES: [&str; 3] = ["filter", "nat", "mangle"];
/// The chains the kubelet and kube-proxy (`KUBE-`) and the CNI plugins (`CNI-`) create.
const OWNED_CHAINS: [&str; 2] = ["KUBE-", "CNI-"];
/// Folders whose new entries are the node's: network namespaces, pod and container logs, the CNI
/// plugins' cached results.
const HOST_FOLDERS: [&str; 4] = [
    "/run/netns",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni/results",
];
/// The folders above and their parents that the node creates when missing.
const CREATED_FOLDERS: [&str; 5] = [
    "/run/netns",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni/results",
    "/var/lib/cni",
];
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// Where containerd's shims put their sockets whatever its configured state folder.
const SHIM_SOCKETS: &str = "/run/containerd";
const CGROUPS: &str = "/sys/fs/cgroup";

/// The host as it was before the node started.
#[derive(Debug, Clone, Default)]
pub struct HostState {
    chains: BTreeSet<String>,
    entries: BTreeSet<PathBuf>,
    folders: BTreeSet<PathBuf>,
    cgroups: BTreeSet<PathBuf>,
    ip_forward: Option<String>,
    shim_sockets: bool,
    bridge: bool,
}

impl HostState {
    /// What the host holds now.
    pub fn record() -> HostState {
        HostState {
            chains: owned_chains(),
            entries: host_entries(),
            folders: existing_folders(),
            cgroups: kubepods_cgroups(),
            ip_forward: std::fs::read_to_string(IP_FORWARD).ok(),
            shim_sockets: Path::new(SHIM_SOCKETS).exists(),
            bridge: bridge_exists(),
        }
    }

    /// What the node (run in `dir`) left on the host since [`HostState::record`], one line
    /// each; empty when nothing.
    pub fn leftovers(&self, dir: &Path) -> Vec<String> {
        let mut left: Vec<String> = mounts_to_remove(self, dir)
            .into_iter()
            .map(|m| format!("mount {}", m.display()))
            .collect();
        let entries = host_entries();
        let new_entries = entries.difference(&self.entries);
        left.extend(new_entries.map(|e| format!("file {}", e.display())));
        let folders = existing_folders();
        let new_folders = folders.difference(&self.folders);
        left.extend(new_folders.map(|f| format!("folder {}", f.display())));
        let chains = owned_chains();
        left.extend(
            chains
                .difference(&self.chains)
                .map(|c| format!("chain {c}")),
        );
        let cgroups = kubepods_cgroups();
        left.extend(
            cgroups
                .difference(&self.cgroups)
                .map(|c| format!("cgroup {}", c.display())),
        );
        if bridge_exists() && !self.bridge {
            left.push(format!("network interface {BRIDGE}"));
        }
        left.extend(
            processes_in(dir)
                .into_iter()
                .map(|p| format!("process {p}")),
        );
        left
    }
}

/// Removes what the node left (see the module docs); best effort, since it runs on the way out.
pub(super) fn clean(before: &HostState, dir: &Path) {
    for mount in mounts_to_remove(before, dir) {
        let _ = Command::new("umount").arg("-l").arg(&mount).output();
    }
    for entry in host_entries().difference(&before.entries) {
        let _ = std::fs::remove_dir_all(entry).or_else(|_| std::fs::remove_file(entry));
    }
    // Emptied above; the list holds children before their parents.
    for folder in CREATED_FOLDERS.map(Path::new) {
        if !before.folders.contains(folder) {
            let _ = std::fs::remove_dir(folder);
        }
    }
    remove_chains(before);
    if bridge_exists() && !before.bridge {
        let _ = Command::new("ip").args(["link", "delete", BRIDGE]).output();
    }
    for cgroup in kubepods_cgroups().difference(&before.cgroups) {
        remove_cgroup(cgroup);
    }
    if let Some(value) = &before.ip_forward {
        let _ = std::fs::write(IP_FORWARD, value);
    }
    if !before.shim_sockets {
        let _ = std::fs::remove_dir_all(SHIM_SOCKETS);
    }
}

/// Mount points under `dir`, and new network namespaces, deepest first.
fn mounts_to_remove(before: &HostState, dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|m| {
            m.starts_with(dir)
                || (m.starts_with(HOST_FOLDERS[0]) && !before.entries.contains(m.as_path()))
        })
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    mounts.dedup();
    mounts
}

fn host_entries() -> BTreeSet<PathBuf> {
    HOST_FOLDERS
        .iter()
        .filter_map(|folder| std::fs::read_dir(folder).ok())
        .flat_map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())))
        .collect()
}

fn existing_folders() -> BTreeSet<PathBuf> {
    CREATED_FOLDERS
        .iter()
        .map(PathBuf::from)
        .filter(|f| f.is_dir())
        .collect()
}

/// Every `KUBE-*` and `CNI-*` chain as `<family> <table> <chain>`.
fn owned_chains() -> BTreeSet<String> {
    let mut chains = BTreeSet::new();
    for family in FAMILIES {
        for table in TABLES {
            for rule in rules(family, table) {
                if let [flag, chain] = rule.as_slice()
                    && flag == "-N"
                    && is_owned(chain)
                {
                    chains.insert(format!("{family} {table} {chain}"));
                }
            }
        }
    }
    chains
}

fn is_owned(chain: &str) -> bool {
    OWNED_CHAINS.iter().any(|prefix| chain.starts_with(prefix))
}

/// Deletes every rule that jumps to a new chain, then the new chains themselves.
fn remove_chains(before: &HostState) {
    for family in FAMILIES {
        for table in TABLES {
            let new = |chain: &str| {
                is_owned(chain) && !before.chains.contains(&format!("{family} {table} {chain}"))
            };
            let all = rules(family, table);
            let iptables = |args: &[String]| {
                let _ = Command::new(family)
                    .args(["-w", "-t", table])
                    .args(args)
                    .output();
            };
            for rule in &all {
                let jumps_to_new = rule
                    .windows(2)
                    .any(|w| (w[0] == "-j" || w[0] == "-g") && new(&w[1]));
                if rule.first().is_some_and(|f| f == "-A") && jumps_to_new {
                    let mut delete = rule.clone();
                    delete[0] = "-D".into();
                    iptables(&delete);
                }
            }
            let chains: Vec<&String> = all
                .iter()
                .filter(|r| r.len() == 2 && r[0] == "-N" && new(&r[1]))
                .map(|r| &r[1])
                .collect();
            for chain in &chains {
                iptables(&["-F".into(), (*chain).clone()]);
            }
            for chain in &chains {
                iptables(&["-X".into(), (*chain).clone()]);
            }
        }
    }
}

/// `<family> -t <table> -S`, each rule split into its words.
fn rules(family: &str, table: &str) -> Vec<Vec<String>> {
    let out = Command::new(family)
        .args(["-w", "-t", table, "-S"])
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    text.lines().map(split_words).collect()
}

/// Splits a line of `iptables -S` into words as a shell would: double quotes group, a backslash
/// escapes the next character.
fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.get_or_insert_default().extend(chars.next()),
            '"' => {
                quoted = !quoted;
                word.get_or_insert_default();
            }
            ' ' if !quoted => words.extend(word.take()),
            c => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word);
    words
}

fn bridge_exists() -> bool {
    Path::new("/sys/class/net").join(BRIDGE).exists()
}

/// `<cgroup>/<controller>/kubepods` of every mounted controller.
fn kubepods_cgroups() -> BTreeSet<PathBuf> {
    let Ok(controllers) = std::fs::read_dir(CGROUPS) else {
        return BTreeSet::new();
    };
    controllers
        .filter_map(|c| c.ok().map(|c| c.path().join("kubepods")))
        .filter(|p| p.is_dir())
        .collect()
}

/// Removes a cgroup and its children, deepest first (a cgroup folder goes with `rmdir` once it
/// has no children and no processes).
fn remove_cgroup(path: &Path) {
    if let Ok(children) = std::fs::read_dir(path) {
        for child in children.filter_map(|c| c.ok()) {
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&child.path());
            }
        }
    }
    let _ = std::fs::remove_dir(path);
}

/// Processes whose command line names `dir` (containerd, its shims, the kubelet), as
/// `<pid> <command line>`.
fn processes_in(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let pid = e.file_name().to_string_lossy().into_owned();
            (cmdline.contains(&needle) && pid != std::process::id().to_string())
                .then(|| format!("{pid} {}", cmdline.trim()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::split_words;

    #[test]
    fn iptables_rules_split_like_a_shell_with_quoted_comments() {
        let rule = r#"-A KUBE-FIREWALL ! -s 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -j DROP"#;
        let words = split_words(rule);
        assert_eq!(words[0], "-A");
        assert_eq!(words[8], "block incoming localnet connections");
        assert_eq!(words.last().map(String::as_str), Some("DROP"));
        assert_eq!(
            split_words(r#"-A X -m comment --comment "a \"b\" c""#)[5],
            r#"a "b" c"#
        );
        assert_eq!(split_words(r#"--comment """#), vec!["--comment", ""]);
    }
}
