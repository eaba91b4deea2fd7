//! `cargo xtask demo [FLAGS]`: builds every binary of the workspace and runs `ttdp-demo` with the
//! paths of the controller, agent and plugin binaries it drives. FLAGS go to `ttdp-demo` (see
//! `cargo xtask demo --help`): `--kubeconfig FILE` runs it on an existing cluster; without it the
//! demo starts a real control plane from `TTDP_KUBE_ASSETS` or `../shared/kube`, and only
//! without those falls back to the testkit's imitation API server.
//!
//! The kubeconfig of a cluster the demo starts is copied to `<target>/ttdp-demo/kubeconfig` and
//! its logs go to `<target>/ttdp-demo/logs` unless FLAGS say otherwise.

use std::os::unix::process::CommandExt;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The binaries the demo runs, all built by `cargo build --workspace --bins`.
const DEMO: &str = "ttdp-demo";
const CONTROLLER: &str = "ttdp-controller";
const AGENT: &str = "ttdp-agent";
const PLUGIN: &str = "kubectl-tt-driver";

pub fn run(args: &[String]) -> Result<()> {
    let root = crate::tools::repo_root()?;
    let target = crate::tools::target_dir(&root)?;
    println!("demo: building the workspace's binaries (cargo build --workspace --bins) ...");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--workspace", "--bins"])
        .current_dir(&root)
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("`cargo build --workspace --bins` failed ({status}); the demo needs every binary");
    }
    let bin = target.join("debug");
    let mut command = Command::new(bin.join(DEMO));
    command
        .arg("--controller")
        .arg(bin.join(CONTROLLER))
        .arg("--agent")
        .arg(bin.join(AGENT))
        .arg("--plugin")
        .arg(bin.join(PLUGIN));
    let demo_dir = target.join("ttdp-demo");
    if !has_flag(args, "--kubeconfig") && !has_flag(args, "--write-kubeconfig") {
        command
            .arg("--write-kubeconfig")
            .arg(demo_dir.join("kubeconfig"));
    }
    if !has_flag(args, "--log-dir") {
        command.arg("--log-dir").arg(demo_dir.join("logs"));
    }
    command.args(args).env_remove("TTDP_TEST_KUBECONFIG");
    // Replace this process, so Ctrl-C reaches the demo, which then stops its cluster in order.
    let error = command.exec();
    Err(error).with_context(|| format!("cannot run {}", bin.join(DEMO).display()))
}

/// Whether `flag` was given, as `--flag VALUE` or `--flag=VALUE`.
fn has_flag(args: &[String], flag: &str) -> bool {
    args.iter().any(|a| {
        a == flag
            || a.strip_prefix(flag)
                .is_some_and(|rest| rest.starts_with('='))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_found_in_both_spellings() {
        let args: Vec<String> = ["--nodes", "4", "--kubeconfig=/tmp/k"]
            .map(String::from)
            .to_vec();
        assert!(has_flag(&args, "--kubeconfig"));
        assert!(has_flag(&args, "--nodes"));
        assert!(!has_flag(&args, "--log-dir"));
        assert!(!has_flag(&["--kubeconfigx".to_owned()], "--kubeconfig"));
    }
}
