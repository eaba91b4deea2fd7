//! The builder images, one per compiler family (`cargo xtask image agent --gcc N`): each
//! carries `TTDP_BUILDER_GCC=N` and that gcc under its three names, and builds the stub module
//! against Debian kernel headers mounted as the DaemonSet mounts a node's:
//! - gcc 12 against Debian 12's 6.1 headers (the host's) and gcc 14 against Debian 13's 6.12
//!   headers (downloaded): the kernels' own compilers, so kbuild's compiler check (which Debian
//!   switches off in its headers and the test switches back on, as Ubuntu's headers have it)
//!   stays silent, and the module's `.comment` names only that gcc;
//! - gcc 11 and gcc 13 with `CC=gcc`: no Debian kernel is built with them (their kernels are
//!   Ubuntu's, whose archive these machines do not reach). gcc 13 builds against Debian 12's
//!   6.1 headers and the check warns; gcc 11 cannot (Debian 12's kernel flags include
//!   `-ftrivial-auto-var-init=zero`, new in gcc 12: also checked), so it builds against Debian
//!   11's 5.10 headers (gcc 10), whose kbuild predates the check. Neither image carries those headers' kbuild, so
//!   it is mounted beside them (the host's `/usr/lib/linux-kbuild-6.1`, Debian 11's unpacked),
//!   as Ubuntu's self-contained headers carry their own scripts.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::container::{Container, Mount, both};
use super::{IMAGE_STUB_VERSION, Report, scratch};
use crate::image::{self, Built, Which, pins::FAMILIES};
use crate::vm::debian_kernel::PinnedKernel;
use crate::vm::newest_headers;

/// What kbuild prints when the compiler is not the one the kernel was built with.
const MISMATCH_WARNING: &str = "the compiler differs from the one used to build the kernel";

/// Kernel headers to build against, and how.
pub(crate) struct Target {
    /// For the report, e.g. `Debian 13's 6.12.118+deb13-amd64 headers`.
    what: String,
    release: String,
    /// The host directories mounted at `/usr/src` and `/lib/modules`, and any more.
    mounts: Vec<(PathBuf, String)>,
    /// `CC=gcc` when the headers name another family's compiler.
    plain_cc: bool,
    /// Whether kbuild's compiler check must warn (`Some(true)`) or stay silent (`Some(false)`);
    /// `None` for headers older than the check (Linux 5.10 has none).
    kbuild_warns: Option<bool>,
}

/// Builds every builder image (or reuses it) and checks each.
pub fn checks(root: &Path, work: &Path, report: &mut Report) -> Result<Vec<Built>> {
    let storage = image::image_dir(root)?.join("buildah");
    let mut built = Vec::new();
    for gcc in FAMILIES {
        let image = image::build(Which::Builder(gcc), None)?;
        let ctr = Container::from_archive(&storage, &image.archive.path)?;
        let name = image.which.name();
        report.check(
            &format!("{name}: TTDP_BUILDER_GCC and gcc {gcc} names"),
            || compiler_check(&image, &ctr, gcc),
        );
        let target = target_for(gcc);
        let what = target
            .as_ref()
            .map_or_else(|_| "kernel headers".to_owned(), |t| t.what.clone());
        report.check(&format!("{name}: builds the stub module ({what})"), || {
            let target = target?;
            let dir = scratch(work, &format!("stub-{name}"))?;
            module_check(root, &dir, &ctr, &target, gcc).map(|_| ())
        });
        if gcc == 11 {
            report.check(
                &format!("{name}: cannot build for Debian 12's kernel"),
                || {
                    let dir = scratch(work, &format!("stub-{name}-debian12"))?;
                    gcc11_refuses_debian12(root, &dir, &ctr)
                },
            );
        }
        built.push(image);
    }
    Ok(built)
}

/// `TTDP_BUILDER_GCC=<gcc>` in the image config; `gcc`, `gcc-<gcc>` and
/// `x86_64-linux-gnu-gcc-<gcc>` all run that major version.
fn compiler_check(image: &Built, ctr: &Container, gcc: u8) -> Result<()> {
    let env = image.archive.config_env()?;
    let value = env.iter().find(|(k, _)| k == "TTDP_BUILDER_GCC");
    if value.map(|(_, v)| v.as_str()) != Some(gcc.to_string().as_str()) {
        bail!("the image config has TTDP_BUILDER_GCC {value:?}, not {gcc}");
    }
    for program in [
        "gcc".to_owned(),
        format!("gcc-{gcc}"),
        format!("x86_64-linux-gnu-gcc-{gcc}"),
    ] {
        let out = ctr.run(&[], &[], &[&program, "--version"])?;
        if !out.status.success() {
            bail!("{program} --version failed: {}", both(&out));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let first = text.lines().next().unwrap_or_default();
        if major_of_version_line(first) != Some(gcc) {
            bail!("{program} is not gcc {gcc}: {first:?}");
        }
    }
    Ok(())
}

/// `gcc-14 (Debian 14.2.0-19) 14.2.0` -> 14: the major of the line's last word.
fn major_of_version_line(line: &str) -> Option<u8> {
    line.split_whitespace()
        .last()?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Debian 11's kernel (5.10, built with gcc 10), the gcc 11 image's target: Debian 12's 6.1 is
/// built with `-ftrivial-auto-var-init=zero`, which gcc 11 does not know. Debian's mirrors keep
/// only the newest build: when this stops resolving, take what `apt-cache depends
/// linux-headers-amd64` offers for bullseye-security.
const DEBIAN11_KERNEL: (&str, &str) = ("5.10.0-46", "5.10.262-1");

/// The headers each family is tested against (module documentation).
pub(crate) fn target_for(gcc: u8) -> Result<Target> {
    if gcc == 11 {
        let (base, version) = DEBIAN11_KERNEL;
        let kernel = PinnedKernel::new(base, version, "bullseye", Some("linux-kbuild-5.10"))?;
        let tree = kernel.headers()?;
        let kbuild = "/usr/lib/linux-kbuild-5.10";
        return Ok(Target {
            what: format!("Debian 11's {} headers, no compiler check", tree.release),
            mounts: vec![
                (tree.root.join("usr/src"), "/usr/src".into()),
                (tree.root.join("lib/modules"), "/lib/modules".into()),
                (
                    tree.root.join(kbuild.trim_start_matches('/')),
                    kbuild.into(),
                ),
            ],
            release: tree.release,
            plain_cc: true,
            kbuild_warns: None,
        });
    }
    if gcc == 14 {
        let kernel = PinnedKernel::of_builder(14)?;
        let tree = kernel.headers()?;
        return Ok(Target {
            what: format!("Debian 13's {} headers", tree.release),
            mounts: vec![
                (tree.root.join("usr/src"), "/usr/src".into()),
                (tree.root.join("lib/modules"), "/lib/modules".into()),
            ],
            release: tree.release,
            plain_cc: false,
            kbuild_warns: Some(false),
        });
    }
    debian12_target(gcc)
}

/// Debian 12's 6.1 headers, the host's: the gcc 12 image's own, with `CC=gcc` for the others.
fn debian12_target(gcc: u8) -> Result<Target> {
    let headers = newest_headers()?;
    let mut mounts = vec![
        (PathBuf::from("/usr/src"), "/usr/src".to_owned()),
        (PathBuf::from("/lib/modules"), "/lib/modules".to_owned()),
    ];
    if gcc == 13 {
        let kbuild = "/usr/lib/linux-kbuild-6.1";
        mounts.push((PathBuf::from(kbuild), kbuild.to_owned()));
    }
    let same = gcc == 12;
    Ok(Target {
        what: format!(
            "Debian 12's {} headers{}",
            headers.release,
            if same { "" } else { ", warning expected" }
        ),
        release: headers.release,
        mounts,
        plain_cc: !same,
        kbuild_warns: Some(!same),
    })
}

/// Builds the stub module in `ctr` against `target`; checks kbuild's compiler warning, the
/// module's vermagic (the target's release) and `.comment` (only gcc `gcc`). Returns the `.ko`.
pub(crate) fn module_check(
    root: &Path,
    dir: &Path,
    ctr: &Container,
    target: &Target,
    gcc: u8,
) -> Result<PathBuf> {
    let src = root.join("tests/vm/stub-module");
    for name in ["Kbuild", "tenstorrent.c"] {
        std::fs::copy(src.join(name), dir.join(name)).with_context(|| format!("copying {name}"))?;
    }
    let mut mounts: Vec<Mount<'_>> = target
        .mounts
        .iter()
        .map(|(host, guest)| (host.as_path(), guest.as_str(), true))
        .collect();
    mounts.push((dir, "/build", false));
    let kdir = format!("/lib/modules/{}/build", target.release);
    let version = format!("TT_STUB_VERSION={IMAGE_STUB_VERSION}");
    // Debian's headers switch kbuild's compiler check off; Ubuntu's keep it.
    let mut make = vec![
        "make",
        "-C",
        &kdir,
        "M=/build",
        &version,
        "DEBIAN_KERNEL_NO_CC_VERSION_CHECK=",
    ];
    if target.plain_cc {
        make.push("CC=gcc");
    }
    make.push("modules");
    let out = ctr.run(&mounts, &[], &make)?;
    let ko = dir.join("tenstorrent.ko");
    let log = both(&out);
    if !out.status.success() || !ko.is_file() {
        bail!("the stub module did not build: {log}");
    }
    match (target.kbuild_warns, log.contains(MISMATCH_WARNING)) {
        (Some(false), true) => bail!("kbuild warned of another compiler: {log}"),
        (Some(true), false) => bail!("kbuild did not warn of the other compiler: {log}"),
        _ => {}
    }
    check_module_compiler(&ko, &target.release, gcc)?;
    Ok(ko)
}

/// gcc 11 does not know a flag Debian 12's kernel is built with: the build fails on it, which is
/// why a node's kernel gets the builder of its own family.
fn gcc11_refuses_debian12(root: &Path, dir: &Path, ctr: &Container) -> Result<()> {
    let target = debian12_target(11)?;
    match module_check(root, dir, ctr, &target, 11) {
        Ok(_) => bail!("gcc 11 built a module for Debian 12's kernel"),
        Err(e) if format!("{e:#}").contains("-ftrivial-auto-var-init=zero") => Ok(()),
        Err(e) => bail!("failed for another reason than -ftrivial-auto-var-init: {e:#}"),
    }
}

/// The module's vermagic starts with `release` and every `GCC:` line of its `.comment` is gcc
/// `gcc`.
fn check_module_compiler(ko: &Path, release: &str, gcc: u8) -> Result<()> {
    let bytes = std::fs::read(ko).with_context(|| format!("reading {}", ko.display()))?;
    let vermagic = format!("vermagic={release} ");
    if !bytes
        .windows(vermagic.len())
        .any(|w| w == vermagic.as_bytes())
    {
        bail!("{} has no {vermagic:?}", ko.display());
    }
    let out = Command::new("readelf")
        .args(["-p", ".comment"])
        .arg(ko)
        .output()
        .context("running readelf (binutils)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let compilers: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once("GCC: ").map(|(_, c)| c.trim()))
        .collect();
    if compilers.is_empty() {
        bail!("{} has no GCC line in .comment: {text}", ko.display());
    }
    if let Some(other) = compilers
        .iter()
        .find(|c| major_of_version_line(c) != Some(gcc))
    {
        bail!("{}'s .comment names {other:?}, not gcc {gcc}", ko.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_major_is_read_from_gcc_version_lines() {
        let lines = [
            ("gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0", 12),
            ("x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0", 14),
            ("gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0", 11),
            ("(Debian 13.3.0-16) 13.3.0", 13),
        ];
        for (line, major) in lines {
            assert_eq!(major_of_version_line(line), Some(major), "{line}");
        }
        assert_eq!(major_of_version_line("clang version 18.1.3"), Some(18));
        assert_eq!(major_of_version_line(""), None);
    }
}
