//! The commit and the machine every benchmark figure is recorded with.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

/// Commit and machine description.
pub struct Machine {
    pub commit: String,
    pub dirty: bool,
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub load_average: String,
}

impl Machine {
    /// Reads `git rev-parse --short HEAD`, `/proc/cpuinfo`, `/proc/meminfo` and `/proc/loadavg`.
    pub fn describe(root: &Path) -> Self {
        let git = |args: &[&str]| {
            Command::new("git")
                .args(args)
                .current_dir(root)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        };
        let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Self {
            commit,
            dirty,
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model: cpu_model(&cpuinfo),
            memory_gib: memory_gib(&meminfo),
            load_average: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    /// One line: commit, CPUs, model, memory, load.
    pub fn header(&self) -> String {
        format!(
            "commit {}{} · {} CPUs ({}) · {:.1} GiB memory · load average {} at start",
            self.commit,
            if self.dirty {
                " (with uncommitted changes)"
            } else {
                ""
            },
            self.cpus,
            self.cpu_model,
            self.memory_gib,
            self.load_average
        )
    }

    /// The same, for results.json.
    pub fn json(&self) -> Value {
        json!({ "commit": self.commit, "dirty": self.dirty, "cpus": self.cpus, "cpu_model": self.cpu_model,
            "memory_gib": self.memory_gib, "load_average": self.load_average })
    }
}

fn cpu_model(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn memory_gib(meminfo: &str) -> f64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_are_read_from_proc() {
        assert_eq!(
            cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n"),
            "AMD EPYC 7B13"
        );
        assert_eq!(memory_gib("MemTotal:       25165824 kB\n"), 24.0);
        assert_eq!(cpu_model(""), "unknown CPU");
    }
}
