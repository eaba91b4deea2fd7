//! Finding the external tools xtask drives (helm, kubectl) and running commands.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

/// The repository root (the parent of the xtask crate).
pub fn repo_root() -> Result<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .context("xtask's manifest directory has no parent")
}

/// `CARGO_TARGET_DIR` (relative to the current directory) or `<root>/target`.
pub fn target_dir(root: &Path) -> Result<PathBuf> {
    Ok(match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => std::env::current_dir()
            .context("reading the current directory")?
            .join(dir),
        None => root.join("target"),
    })
}

/// Finds `name` (helm or kubectl): `$TTDP_<NAME>`, then `~/.local/ttdp-tools/bin`, then PATH.
pub fn kube_tool(name: &str) -> Result<PathBuf> {
    if let Ok(p) = std::env::var(format!("TTDP_{}", name.to_uppercase())) {
        return Ok(PathBuf::from(p));
    }
    if let Some(home) = std::env::var_os("HOME") {
        let p = PathBuf::from(home).join(".local/ttdp-tools/bin").join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    if let Some(p) = on_path(name) {
        return Ok(p);
    }
    bail!(
        "{name} not found: run `bash .ci/kube-tools` (installs kubectl and helm into ~/.local/ttdp-tools/bin)"
    )
}

/// The first executable called `name` on PATH.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs a command, failing with its name when it does not succeed.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status()?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// `cmd`'s stdout, or an error with its stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The lowercase hex sha256 of `bytes`, as `sha256sum` prints it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}
