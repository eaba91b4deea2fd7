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
            if *bin == "ttdp-agent" {
                check_release_agent(&path, &bytes)?;
            }
            Ok((*bin, path))
        })
        .collect()
}

/// Fails unless the agent at `path` (its contents `bytes`) is a release build: the test hooks'
/// variables appear nowhere in it (they are compiled out, not merely unset), and it refuses
/// `TTDP_KERNEL=sim` at startup. A workspace-wide feature (the demo's or the tests') leaking into
/// the image build would let an image's environment kill a swap half-way or fake the kernel.
pub fn check_release_agent(path: &Path, bytes: &[u8]) -> Result<()> {
    for hook in ["TTDP_TEST_KILL_AT", "TTDP_TEST_PAUSE_AT"] {
        if bytes.windows(hook.len()).any(|w| w == hook.as_bytes()) {
            bail!(
                "{} honours the test hook {hook}: it was built with the `test-hooks` feature, which release images leave off",
                path.display()
            );
        }
    }
    // a host root that does not exist: whatever the build, the agent changes nothing
    let output = Command::new(path)
        .arg("run")
        .env_clear()
        .env("TT_KMD_VERSION", "2.8.0")
        .env("TTDP_KERNEL", "sim")
        .env("TTDP_REPORT", "none")
        .env("TTDP_TT_SMI_PATH", "none")
        .env("TTDP_HOST_ROOT", "/nonexistent/ttdp-release-check")
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() || !stderr.contains("release build") {
        bail!(
            "{} accepts TTDP_KERNEL=sim: it was built with the `sim` feature, which release images leave off ({}; {stderr})",
            path.display(),
            output.status
        );
    }
    Ok(())
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
