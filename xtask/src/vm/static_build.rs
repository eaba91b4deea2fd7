//! Builds a scenario's test, binary and example targets as static executables (the guest has no libc):
//! `--target x86_64-unknown-linux-gnu` with `-C target-feature=+crt-static`, located through
//! cargo's JSON messages.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::elf::is_static_elf;
use super::scenarios::Scenario;

/// The target every static build names (the toolchain here has no musl target).
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// `cargo <args> --target TARGET` in `root`, with `+crt-static` added to the caller's
/// RUSTFLAGS: glibc linked in, so the executable runs without a libc beside it (the guest, the
/// scratch images). The VM tests and the images share it, and with it one build tree.
pub fn static_cargo(root: &Path, args: &[&str]) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut rustflags = std::env::var("RUSTFLAGS").unwrap_or_default();
    rustflags.push_str(" -C target-feature=+crt-static");
    let mut cmd = Command::new(cargo);
    cmd.args(args)
        .args(["--target", TARGET])
        .env("RUSTFLAGS", rustflags.trim())
        .current_dir(root);
    cmd
}

/// Where a built executable goes in the guest.
#[derive(Debug)]
pub struct Executable {
    /// The static executable on the host.
    pub host: PathBuf,
    /// Its absolute path in the guest.
    pub guest: String,
}

/// Builds every target of `scenario`.
pub fn build(root: &Path, scenario: &Scenario) -> Result<Vec<Executable>> {
    let mut executables = Vec::new();
    for (package, test) in scenario.tests {
        let host = cargo_build(
            root,
            &["test", "--no-run", "-p", package, "--test", test],
            "test",
            test,
        )?;
        executables.push(Executable {
            host,
            guest: format!("/tests/{package}/{test}"),
        });
    }
    let programs = (scenario.bins.iter().map(|t| ("bin", t)))
        .chain(scenario.examples.iter().map(|t| ("example", t)));
    for (kind, (package, name)) in programs {
        let flag = format!("--{kind}");
        // the scenarios kill and pause the agent at the swap's test hooks
        let args = [
            "build",
            "-p",
            package,
            "--features",
            "test-hooks",
            &flag,
            name,
        ];
        let host = cargo_build(root, &args, kind, name)?;
        executables.push(Executable {
            host,
            guest: format!("/opt/ttdp/bin/{name}"),
        });
    }
    Ok(executables)
}

/// Runs one cargo build and returns the executable of the target `name` of kind `kind`.
fn cargo_build(root: &Path, args: &[&str], kind: &str, name: &str) -> Result<PathBuf> {
    let mut child = static_cargo(root, args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo")?;
    let stdout = child.stdout.take().context("cargo has no stdout")?;
    let mut found = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's output")?;
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" || message["target"]["name"] != name {
            continue;
        }
        let kinds = message["target"]["kind"].as_array();
        if !kinds.is_some_and(|kinds| kinds.iter().any(|k| k == kind)) {
            continue;
        }
        if let Some(executable) = message["executable"].as_str() {
            found = Some(PathBuf::from(executable));
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!("`cargo {}` for the VM failed ({status})", args.join(" "));
    }
    let executable = found.with_context(|| {
        format!(
            "`cargo {}` built no {kind} executable named {name}",
            args.join(" ")
        )
    })?;
    let bytes =
        std::fs::read(&executable).with_context(|| format!("reading {}", executable.display()))?;
    if !is_static_elf(&bytes) {
        bail!(
            "{} is dynamically linked; the VM has no libc (is RUSTFLAGS overriding +crt-static?)",
            executable.display()
        );
    }
    Ok(executable)
}
