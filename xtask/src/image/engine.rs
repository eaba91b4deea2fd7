//! The container engines that can build the images from the same Dockerfile and context:
//! Docker and Podman (`build`, then `save` to an OCI archive) when their daemon or service
//! answers, else buildah (daemonless, as root, `vfs` storage of its own under
//! `<target>/image/buildah/`, so it touches no other storage on the machine).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::tools;

/// One way to build an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    /// `docker build` + `docker save` (OCI layout since Docker 25).
    Docker,
    /// `podman build` + `podman save --format oci-archive`.
    Podman,
    /// `buildah bud` + `buildah push oci-archive:`, storage under the given directory.
    Buildah {
        /// Root of buildah's private storage.
        storage: PathBuf,
    },
}

/// What to build.
#[derive(Debug)]
pub struct BuildSpec<'a> {
    /// The Dockerfile.
    pub dockerfile: &'a Path,
    /// The prepared context directory.
    pub context: &'a Path,
    /// `--build-arg` pairs.
    pub build_args: &'a [(&'a str, String)],
    /// A local name for the image while it is built.
    pub name: &'a str,
    /// The OCI archive to write.
    pub archive: &'a Path,
}

fn answers(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Engine {
    /// `wanted` (docker, podman or buildah), or the first that answers: docker, podman, buildah.
    pub fn pick(wanted: Option<&str>, image_dir: &Path) -> Result<Self> {
        let buildah = || Engine::Buildah {
            storage: image_dir.join("buildah"),
        };
        match wanted {
            Some("docker") => return Ok(Engine::Docker),
            Some("podman") => return Ok(Engine::Podman),
            Some("buildah") => return Ok(buildah()),
            Some(other) => bail!("unknown engine {other:?}: docker, podman or buildah"),
            None => {}
        }
        if answers("docker", "info") {
            Ok(Engine::Docker)
        } else if answers("podman", "info") {
            Ok(Engine::Podman)
        } else if answers("buildah", "--version") {
            Ok(buildah())
        } else {
            bail!(
                "no container engine answers: `docker info` and `podman info` fail and buildah is \
                 not installed. Start Docker, or `apt-get install buildah` (daemonless; run as root)"
            )
        }
    }

    /// The engine's name as the user would type it.
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Docker => "docker",
            Engine::Podman => "podman",
            Engine::Buildah { .. } => "buildah",
        }
    }

    /// `buildah` with this engine's private storage (vfs: no kernel overlay or fuse needed).
    pub fn buildah(storage: &Path) -> Command {
        let mut cmd = Command::new("buildah");
        cmd.arg("--root")
            .arg(storage.join("root"))
            .arg("--runroot")
            .arg(storage.join("run"))
            .args(["--storage-driver", "vfs"]);
        cmd
    }

    /// Builds `spec` and writes its OCI archive.
    pub fn build(&self, spec: &BuildSpec<'_>) -> Result<()> {
        let partial = spec.archive.with_extension("partial");
        let _ = std::fs::remove_file(&partial);
        let tag = format!("localhost/{}:build", spec.name);
        let (mut build, mut save, mut remove) = match self {
            Engine::Docker | Engine::Podman => {
                let engine = self.name();
                let mut save = Command::new(engine);
                save.arg("save");
                if *self == Engine::Podman {
                    save.args(["--format", "oci-archive"]);
                }
                save.arg("-o").arg(&partial).arg(&tag);
                let mut remove = Command::new(engine);
                remove.args(["rmi", &tag]);
                (Command::new(engine), save, remove)
            }
            Engine::Buildah { storage } => {
                let mut build = Self::buildah(storage);
                // fixed timestamps: the same context gives the same layers
                build.args(["bud", "--timestamp", "0"]);
                let mut save = Self::buildah(storage);
                save.args(["push", &tag]).arg(format!(
                    "oci-archive:{}:{}",
                    partial.display(),
                    spec.name
                ));
                let mut remove = Self::buildah(storage);
                remove.args(["rmi", "-f", &tag]);
                (build, save, remove)
            }
        };
        if matches!(self, Engine::Docker | Engine::Podman) {
            build.arg("build");
        }
        build.arg("-f").arg(spec.dockerfile).args(["-t", &tag]);
        for (name, value) in spec.build_args {
            build.args(["--build-arg", &format!("{name}={value}")]);
        }
        build.arg(spec.context);
        tools::run(&mut build)
            .with_context(|| format!("building {} with {}", spec.name, self.name()))?;
        let saved = tools::run(&mut save);
        // the archive is the result; the engine's copy is only in the way (vfs copies are big)
        let _ = remove.stdout(Stdio::null()).stderr(Stdio::null()).status();
        saved.with_context(|| format!("writing {}", partial.display()))?;
        std::fs::rename(&partial, spec.archive)
            .with_context(|| format!("renaming to {}", spec.archive.display()))?;
        Ok(())
    }
}
