//! A buildah working container made from an OCI archive, to run commands inside the image the
//! way a container runtime would (`buildah run --isolation chroot`: the image's root, its
//! environment and user, with bind mounts), removed with its image on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};

use crate::image::Engine;

/// A bind mount: host path, container path, read-only.
pub type Mount<'a> = (&'a Path, &'a str, bool);

/// One working container.
#[derive(Debug)]
pub struct Container {
    storage: PathBuf,
    name: String,
    image_id: String,
}

impl Container {
    /// `buildah from oci-archive:<archive>` in the private storage `storage`.
    pub fn from_archive(storage: &Path, archive: &Path) -> Result<Self> {
        let out = Engine::buildah(storage)
            .args(["from", "--quiet", "--pull-never"])
            .arg(format!("oci-archive:{}", archive.display()))
            .output()
            .context("running buildah from (install buildah; run as root)")?;
        if !out.status.success() {
            bail!(
                "buildah from {} failed: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let name = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let inspect = Engine::buildah(storage)
            .args(["inspect", "--format", "{{.FromImageID}}", &name])
            .output()
            .context("running buildah inspect")?;
        Ok(Self {
            storage: storage.to_path_buf(),
            name,
            image_id: String::from_utf8_lossy(&inspect.stdout).trim().to_owned(),
        })
    }

    /// Runs `cmd` inside the container with `env` added to the image's and `mounts` bound.
    ///
    /// A successful run that printed nothing is run once more: buildah's chroot runner was seen
    /// to lose the whole output of a process that exits at once (`--version`), so an empty
    /// answer says nothing about the image. A command that really prints nothing prints nothing
    /// twice.
    pub fn run(&self, mounts: &[Mount<'_>], env: &[(&str, &str)], cmd: &[&str]) -> Result<Output> {
        let once = || {
            self.command(mounts, env, cmd)
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("running {cmd:?} in the image"))
        };
        let out = once()?;
        if out.status.success() && out.stdout.is_empty() && out.stderr.is_empty() {
            return once();
        }
        Ok(out)
    }

    /// The `buildah run` command for `cmd`, as the image's user, with its environment plus
    /// `env`, and `mounts`; the container gets the host's network, `/dev` and `/proc` (chroot
    /// isolation), as a privileged-free runtime would give it its own. SIGTERM to the returned
    /// process ends `cmd` too.
    pub fn command(&self, mounts: &[Mount<'_>], env: &[(&str, &str)], cmd: &[&str]) -> Command {
        let mut run = Engine::buildah(&self.storage);
        run.args(["run", "--isolation", "chroot"]);
        for (name, value) in env {
            run.args(["--env", &format!("{name}={value}")]);
        }
        for (host, guest, read_only) in mounts {
            let opts = if *read_only { ":ro" } else { "" };
            run.arg("-v")
                .arg(format!("{}:{guest}{opts}", host.display()));
        }
        run.arg(&self.name).arg("--").args(cmd);
        run
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let quiet = |mut c: Command| {
            let _ = c.stdout(Stdio::null()).stderr(Stdio::null()).status();
        };
        let mut rm = Engine::buildah(&self.storage);
        rm.args(["rm", &self.name]);
        quiet(rm);
        if !self.image_id.is_empty() {
            let mut rmi = Engine::buildah(&self.storage);
            rmi.args(["rmi", "-f", &self.image_id]);
            quiet(rmi);
        }
    }
}

/// The output's stdout and stderr, for messages.
pub fn both(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .trim()
    .to_owned()
}
