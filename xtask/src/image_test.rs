//! `cargo xtask image-test`: builds both images (or reuses archives built from the same inputs)
//! and tests what is in them, each check reported like a test and the command failing when one
//! fails (a missing tool is a failure, never a skip):
//! - agent, inside the image (`buildah run --isolation chroot`): `ttdp-agent --version`; the
//!   readiness probe command (`ttdp-agent probe`, as the DaemonSet execs it) ready on a host
//!   whose module is at the target version and not ready on another; tt-smi runs (`--version`
//!   prints the pinned version, `--help` exits 0) with no Python in the image; the toolchain
//!   builds the stub `tenstorrent` module against the VM kernel's headers mounted the way the
//!   DaemonSet mounts the host's (`/lib/modules` and `/usr/src` at their own paths, read-only),
//!   and the module carries the version it was built with;
//! - controller: the image holds only its binary and the CA bundle; `ttdp-controller
//!   --version` runs inside it; its binary, run from the unpacked image as its non-root user
//!   with the chart's controller ServiceAccount token, drives a policy on the control plane
//!   `TTDP_TEST_KUBECONFIG` names ([`controller`]);
//! - builders, one per compiler family (`agent-gcc11` to `agent-gcc14`): the family's gcc and
//!   the stub module built against Debian kernel headers ([`builders`]);
//! - every image: size within its budget.
//!
//! That the image's module loads in a real kernel, and that the agent run from the image's
//! unpacked root filesystem installs it, is `cargo xtask vm-test --scenario agent-image`.

pub mod builders;
pub mod container;
mod controller;
mod tt_smi_glibc;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use container::{Container, Mount, both};

use crate::image::{self, Built, Which, pins::Pins};
use crate::tools::repo_root;
use crate::vm::newest_headers;

/// The version the image's toolchain builds the stub module at.
pub const IMAGE_STUB_VERSION: &str = "4.0.0";

/// Entry point of `cargo xtask image-test`.
pub fn run(args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("usage: cargo xtask image-test");
    }
    let started = Instant::now();
    let agent = image::build(Which::Agent, None)?;
    let controller = image::build(Which::Controller, None)?;
    let root = repo_root()?;
    let work = image::image_dir(&root)?.join("test");
    let mut report = Report::default();
    agent_checks(&root, &work, &agent, &mut report)?;
    controller::checks(&root, &work, &agent, &controller, &mut report)?;
    let builders = builders::checks(&root, &work, &mut report)?;
    for built in [&agent, &controller].into_iter().chain(&builders) {
        report.check(
            &format!("{} size within budget", built.which.name()),
            || size_within_budget(built),
        );
    }
    report.finish(started)
}

fn size_within_budget(built: &Built) -> Result<()> {
    if built.uncompressed > built.which.budget() {
        bail!(
            "{:.1} MB uncompressed is over the {:.0} MB budget",
            built.uncompressed as f64 / 1e6,
            built.which.budget() as f64 / 1e6
        );
    }
    Ok(())
}

/// Passed and failed checks, printed as they run.
#[derive(Debug, Default)]
pub struct Report {
    passed: usize,
    failed: Vec<String>,
}

impl Report {
    /// Runs one check and records it.
    pub fn check(&mut self, name: &str, f: impl FnOnce() -> Result<()>) {
        match f() {
            Ok(()) => {
                self.passed += 1;
                println!("test {name} ... ok");
            }
            Err(e) => {
                println!("test {name} ... FAILED\n    {e:#}");
                self.failed.push(name.to_owned());
            }
        }
    }

    fn finish(self, started: Instant) -> Result<()> {
        self.finish_as("image-test", started)
    }

    /// Prints the totals under `command`'s name; fails if a check failed.
    pub fn finish_as(self, command: &str, started: Instant) -> Result<()> {
        println!(
            "\n{command}: {} passed; {} failed; finished in {:.0} s",
            self.passed,
            self.failed.len(),
            started.elapsed().as_secs_f64()
        );
        if !self.failed.is_empty() {
            bail!("{command} checks failed: {}", self.failed.join(", "));
        }
        Ok(())
    }
}

/// A fresh scratch directory `work/<name>`.
pub fn scratch(work: &Path, name: &str) -> Result<PathBuf> {
    let dir = work.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn agent_checks(root: &Path, work: &Path, agent: &Built, report: &mut Report) -> Result<()> {
    let storage = image::image_dir(root)?.join("buildah");
    let ctr = Container::from_archive(&storage, &agent.archive.path)?;
    let pins = Pins::load(root)?;
    report.check("agent: ttdp-agent --version", || {
        let out = ctr.run(&[], &[], &["ttdp-agent", "--version"])?;
        let want = format!("ttdp-agent {}", env!("CARGO_PKG_VERSION"));
        expect_success(&out, &want)
    });
    report.check("agent: readiness probe command", || probe_check(work, &ctr));
    report.check("agent: tt-smi runs without Python", || {
        let out = ctr.run(&[], &[], &["/opt/ttdp/tt-smi", "--version"])?;
        expect_success(&out, &pins.tt_smi.version)?;
        let help = ctr.run(&[], &[], &["/opt/ttdp/tt-smi", "--help"])?;
        expect_success(&help, "usage")?;
        let env = ctr.run(
            &[],
            &[],
            &["sh", "-c", "echo TT_SMI_VERSION=$TT_SMI_VERSION"],
        )?;
        expect_success(&env, &format!("TT_SMI_VERSION={}", pins.tt_smi.version))?;
        let python = ctr.run(
            &[],
            &[],
            &["sh", "-c", "command -v python3 || command -v python"],
        )?;
        if python.status.success() {
            bail!("the image has a Python: {}", both(&python));
        }
        Ok(())
    });
    report.check(
        "agent: its tt-smi runs in a Debian 11 root (glibc 2.31)",
        || {
            let dir = scratch(work, "tt-smi")?;
            let mounts: [Mount<'_>; 1] = [(&dir, "/out", false)];
            let out = ctr.run(&mounts, &[], &["cp", "/opt/ttdp/tt-smi", "/out/tt-smi"])?;
            expect_success(&out, "")?;
            let version = &pins.tt_smi.version;
            tt_smi_glibc::runs_in(&pins, "bullseye", "2.31", &dir.join("tt-smi"), version)
        },
    );
    report.check(
        "agent: toolchain builds the stub module (DaemonSet mounts)",
        || {
            let ko = build_stub_module(root, &work.join("stub-module"), &ctr)?;
            // the .modinfo section: what /sys/module/tenstorrent/version reports once loaded
            let tag = format!("version={IMAGE_STUB_VERSION}\0");
            let bytes = std::fs::read(&ko)?;
            if !bytes.windows(tag.len()).any(|w| w == tag.as_bytes()) {
                bail!("{} has no {tag:?} in its modinfo", ko.display());
            }
            Ok(())
        },
    );
    Ok(())
}

/// `ttdp-agent probe` as the DaemonSet runs it: ready when the host's module is at the target
/// version, not ready otherwise.
fn probe_check(work: &Path, ctr: &Container) -> Result<()> {
    let host = scratch(work, "probe-host")?;
    let module = host.join("sys/module/tenstorrent");
    std::fs::create_dir_all(&module)?;
    std::fs::write(module.join("initstate"), "live\n")?;
    std::fs::write(module.join("version"), "2.8.0\n")?;
    let mounts: [Mount<'_>; 1] = [(&host, "/host", true)];
    let ready = ctr.run(
        &mounts,
        &[("TT_KMD_VERSION", "2.8.0")],
        &["ttdp-agent", "probe"],
    )?;
    expect_success(&ready, "")?;
    let other = ctr.run(
        &mounts,
        &[("TT_KMD_VERSION", "2.9.0")],
        &["ttdp-agent", "probe"],
    )?;
    if other.status.success() {
        bail!(
            "the probe said ready for 2.9.0 with 2.8.0 loaded: {}",
            both(&other)
        );
    }
    Ok(())
}

/// Builds `tests/vm/stub-module` at [`IMAGE_STUB_VERSION`] with the agent image's make and gcc
/// against the VM kernel's headers, mounted as the DaemonSet mounts the host's; returns the
/// `.ko` (in `dir`).
pub fn build_stub_module(root: &Path, dir: &Path, ctr: &Container) -> Result<PathBuf> {
    let headers = newest_headers()?;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let src = root.join("tests/vm/stub-module");
    for name in ["Kbuild", "tenstorrent.c"] {
        std::fs::copy(src.join(name), dir.join(name)).with_context(|| format!("copying {name}"))?;
    }
    let kdir = format!("/lib/modules/{}/build", headers.release);
    let version = format!("TT_STUB_VERSION={IMAGE_STUB_VERSION}");
    let mounts: [Mount<'_>; 3] = [
        (Path::new("/lib/modules"), "/lib/modules", true),
        (Path::new("/usr/src"), "/usr/src", true),
        (dir, "/build", false),
    ];
    let out = ctr.run(
        &mounts,
        &[],
        &["make", "-C", &kdir, "M=/build", &version, "modules"],
    )?;
    let ko = dir.join("tenstorrent.ko");
    if !out.status.success() || !ko.is_file() {
        bail!(
            "the image's toolchain did not build the stub module: {}",
            both(&out)
        );
    }
    Ok(ko)
}

/// Fails unless `out` succeeded and its output contains `want`.
pub fn expect_success(out: &std::process::Output, want: &str) -> Result<()> {
    let text = both(out);
    if !out.status.success() {
        bail!("exited with {}: {text}", out.status);
    }
    if !text.to_lowercase().contains(&want.to_lowercase()) {
        bail!("output lacks {want:?}: {text}");
    }
    Ok(())
}
