//! Processes as tests see them in `/proc`: the children of a process, and whether one still runs.

/// `(pid, command name)` of every process whose parent is `parent`. The name is the kernel's,
/// cut at 15 characters (`kube-controller-manager` shows as `kube-controller`).
pub fn children_of(parent: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let field = |key: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(key))
                    .map(str::trim)
            };
            let name = field("Name:")?.to_owned();
            (field("PPid:")? == parent.to_string()).then_some((pid, name))
        })
        .collect()
}

/// Whether `pid` still runs (a zombie does not).
pub fn is_running(pid: u32) -> bool {
    // The state follows the command name, which is in parentheses.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .is_some_and(|(_, state)| !state.trim_start().starts_with('Z'))
}
