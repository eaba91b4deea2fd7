//! A bare git repository of the stub module shaped like tt-kmd's: one commit and one tag
//! `ttkmd-<version>` per [`STUB_MODULES`] entry, each carrying its version in a
//! `VERSION` file (and a `FAIL_INIT` marker for the broken one) and a udev rule
//! `udev-50-tenstorrent.rules` like tt-kmd's with a mode of its own, so a plain
//! `make -C <build tree> M=<src> modules` builds it. Guests that build modules (with the host's
//! `/usr`) fetch from it the way the agent fetches tt-kmd.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::scenarios::STUB_MODULES;

/// Builds the repository at `dest` (a bare repository), using `work` as scratch space.
pub fn build(root: &Path, work: &Path, dest: &Path) -> Result<()> {
    for dir in [work, dest] {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
    }
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let source = root.join("tests/vm/stub-module");
    git(work, &["init", "--quiet", "--initial-branch=main"])?;
    for module in STUB_MODULES {
        for name in ["Kbuild", "tenstorrent.c"] {
            std::fs::copy(source.join(name), work.join(name))
                .with_context(|| format!("copying {name} into {}", work.display()))?;
        }
        std::fs::write(work.join("VERSION"), format!("{}\n", module.version))
            .context("writing VERSION")?;
        std::fs::write(
            work.join("udev-50-tenstorrent.rules"),
            format!(
                "KERNEL==\"tenstorrent*\", MODE=\"{}\", SYMLINK+=\"tenstorrent-%n\"\n",
                module.udev_mode
            ),
        )
        .context("writing udev-50-tenstorrent.rules")?;
        let marker = work.join("FAIL_INIT");
        if module.fail_init {
            std::fs::write(&marker, "init returns -EINVAL on purpose\n")
                .context("writing FAIL_INIT")?;
        } else if marker.exists() {
            std::fs::remove_file(&marker).context("removing FAIL_INIT")?;
        }
        git(work, &["add", "--all"])?;
        let message = format!("stub tenstorrent module {}", module.version);
        git(
            work,
            &["commit", "--quiet", "--allow-empty", "-m", &message],
        )?;
        git(work, &["tag", &format!("ttkmd-{}", module.version)])?;
    }
    let dest_arg = dest
        .to_str()
        .context("the stub repository path is not UTF-8")?;
    git(work, &["clone", "--quiet", "--bare", ".", dest_arg])
}

/// Runs `git` in `dir` with a fixed identity and no user or system configuration.
fn git(dir: &Path, args: &[&str]) -> Result<()> {
    let output = Command::new("git")
        .args([
            "-c",
            "user.name=ttdp vm-test",
            "-c",
            "user.email=vm-test@ttdp.invalid",
        ])
        .args(["-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .context("running git")?;
    if !output.status.success() {
        bail!(
            "`git {}` in {} failed ({}): {}",
            args.join(" "),
            dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
