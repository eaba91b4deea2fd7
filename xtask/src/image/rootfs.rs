//! Debian root filesystems made by `mmdebstrap` from the pinned packages: the agent image's base
//! (a tar archive, cached under `<target>/image/cache/` by a key of its pins) and the throw-away
//! roots other steps run in (see [`super::tt_smi`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::pins::{Pins, RootPins, cache_key};
use crate::tools;

/// Timestamps inside the root filesystem (mmdebstrap honours `SOURCE_DATE_EPOCH`), fixed so the
/// same pins give the same files; 2023-11-14.
pub const SOURCE_DATE_EPOCH: &str = "1700000000";

/// Documentation, manual pages and translations are not needed to build a module.
const PATH_EXCLUDES: [&str; 4] = [
    "/usr/share/man/*",
    "/usr/share/doc/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
];

/// `mmdebstrap --variant=minbase` of `root`'s suite with its packages on top, writing `target`
/// in `format`; hooks and the like are added by the caller.
pub fn mmdebstrap(pins: &Pins, root: &RootPins, format: &str, target: &Path) -> Result<Command> {
    let sources = pins.sources(&root.suite)?;
    let mut cmd = Command::new("mmdebstrap");
    cmd.args(["--variant=minbase", "--quiet"])
        .arg(format!("--format={format}"))
        .env("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH);
    if !root.packages.is_empty() {
        cmd.arg(format!("--include={}", root.packages.join(",")));
    }
    for exclude in PATH_EXCLUDES {
        cmd.arg(format!("--dpkgopt=path-exclude={exclude}"));
    }
    cmd.arg(&root.suite).arg(target);
    cmd.args(sources);
    Ok(cmd)
}

/// Fails with the install command when mmdebstrap is missing.
pub fn require_mmdebstrap() -> Result<()> {
    if tools::on_path("mmdebstrap").is_none() {
        bail!(
            "mmdebstrap not found: it makes the images' Debian root filesystem. Install it with \
             `apt-get install mmdebstrap` (or run `bash .ci/deps`)"
        );
    }
    Ok(())
}

/// The hook giving a builder root the plain `gcc` name of its family, when the pinned packages
/// do not (Debian's `gcc` package names the suite's default compiler, which is another family
/// for gcc 11 on bookworm and gcc 13 on trixie). `gcc-<N>` and `x86_64-linux-gnu-gcc-<N>` come
/// with the `gcc-<N>` package itself.
fn gcc_name_hook(builder: &RootPins) -> Option<String> {
    let gcc = builder.gcc?;
    builder
        .version_of("gcc")
        .is_none()
        .then(|| format!("--customize-hook=ln -sf gcc-{gcc} \"$1/usr/bin/gcc\""))
}

/// The root filesystem of the builder image for compiler family `gcc` as a tar archive, built
/// once per set of pins.
pub fn builder_rootfs(cache: &Path, pins: &Pins, gcc: u8) -> Result<PathBuf> {
    let builder = pins.builder(gcc)?;
    let hook = gcc_name_hook(builder);
    let key = cache_key(
        [builder.suite.as_bytes()]
            .into_iter()
            .chain(pins.sources(&builder.suite)?.iter().map(|s| s.as_bytes()))
            .chain(builder.packages.iter().map(|s| s.as_bytes()))
            .chain(PATH_EXCLUDES.iter().map(|s| s.as_bytes()))
            .chain(hook.iter().map(|s| s.as_bytes())),
    );
    let tar = cache.join(format!("agent-rootfs-{key}.tar"));
    if tar.is_file() {
        println!(
            "image: gcc {gcc} builder root filesystem {} (cached)",
            tar.display()
        );
        return Ok(tar);
    }
    require_mmdebstrap()?;
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let partial = cache.join(format!("agent-rootfs-{key}.tar.partial"));
    let mut cmd = mmdebstrap(pins, builder, "tar", &partial)?;
    cmd.args(&hook);
    let status = cmd.status().context("running mmdebstrap")?;
    if !status.success() {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "mmdebstrap failed ({status}) building the gcc {gcc} builder root filesystem. If apt \
             said a version \"was not found\", the mirror moved on: update that pin in \
             deploy/docker/image-pins.yaml to what `apt-cache policy <package>` offers"
        );
    }
    std::fs::rename(&partial, &tar).with_context(|| format!("renaming to {}", tar.display()))?;
    println!(
        "image: built the gcc {gcc} builder root filesystem {}",
        tar.display()
    );
    Ok(tar)
}

/// Extracts one file of a tar archive (member names as tar lists them).
pub fn tar_member(archive: &Path, member: &str) -> Result<Vec<u8>> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(member)
        .output()
        .context("running tar")?;
    if !out.status.success() {
        bail!(
            "{member} is not in {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}
