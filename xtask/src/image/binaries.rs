//! The images' static binaries: `ttdp-agent` and `ttdp-controller`, release profile, glibc
//! linked statically (`+crt-static`; the machine's toolchain has no musl target). Both are
//! built by one cargo invocation whatever image is asked for, so the shared dependencies are
//! compiled once with one feature set and the second image finds them built.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::tools;
use crate::vm::is_static_elf;
use crate::vm::static_build::{TARGET, static_cargo};
const BINARIES: [(&str, &str); 2] = [
    ("ttdp-agent", "ttdp-agent"),
    ("ttdp-controller", "ttdp-controller"),
];

/// Builds both binaries and returns `(name, path)` of each.
pub fn build(root: &Path) -> Result<Vec<(&'static str, PathBuf)>> {
    let mut cmd = static_cargo(root, &["build", "--release", "--locked"]);
    for (package, bin) in BINARIES {
        cmd.args(["-p", package, "--bin", bin]);
    }
    tools::run(&mut cmd).context("building the images' static binaries")?;
    let dir = tools::target_dir(root)?.join(TARGET).join("release");
    BINARIES
        .iter()
        .map(|(_, bin)| {
            let path = dir.join(bin);
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            if !is_static_elf(&bytes) {
                bail!(
                    "{} is dynamically linked (is RUSTFLAGS overriding +crt-static?)",
                    path.display()
                );
            }
            Ok((*bin, path))
        })
        .collect()
}

/// Copies `binary` to `dest` without its symbol table (an image needs none).
pub fn install_stripped(binary: &Path, dest: &Path) -> Result<()> {
    let status = Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(dest)
        .arg(binary)
        .status()
        .context("running strip (install binutils)")?;
    if !status.success() {
        bail!("strip {} failed ({status})", binary.display());
    }
    Ok(())
}
