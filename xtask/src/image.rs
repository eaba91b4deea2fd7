//! `cargo xtask image agent|controller [--engine docker|podman|buildah]`: builds a container
//! image from `deploy/docker/<name>.Dockerfile` and writes it as an OCI archive
//! `<target>/image/<name>.oci.tar`, printing its digest and sizes. `cargo xtask image agent
//! --gcc N` builds the builder image of compiler family N instead (`agent-gccN`: that family's
//! root filesystem, `TTDP_BUILDER_GCC=N`); plain `agent` is the gcc 12 builder.
//!
//! Both Dockerfiles are `FROM scratch` plus files; this prepares their build context
//! (`<target>/image/<name>/context/`), so docker, podman and the daemonless buildah build the
//! same definition:
//! 1. the static release binaries ([`binaries`]);
//! 2. for the agent: the family's Debian root filesystem made by mmdebstrap from
//!    `deploy/docker/image-pins.yaml` ([`rootfs`]) and the PyInstaller tt-smi ([`tt_smi`]), both
//!    cached by a key of their pins; for the controller: the CA bundle of that root filesystem;
//! 3. the engine build ([`engine`]), skipped when the context, Dockerfile and build arguments
//!    are those of the archive already there (a key file beside it);
//! 4. the archive's digest and sizes, read back from the archive itself ([`oci`]).

mod binaries;
mod engine;
pub mod oci;
pub mod pins;
pub mod rootfs;
mod tt_smi;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub use engine::Engine;
use oci::ImageArchive;
use pins::{Pins, cache_key};

use crate::tools::{self, repo_root};

/// Size budgets (uncompressed, as unpacked on a node), checked by `cargo xtask image-test`;
/// `docs/images.md` states the same figures (a unit test keeps them equal).
pub const AGENT_BUDGET_BYTES: u64 = 450_000_000;
/// The controller's budget.
pub const CONTROLLER_BUDGET_BYTES: u64 = 40_000_000;
/// The builder images' budgets per compiler family (trixie's gcc and kbuild are larger).
pub const BUILDER_BUDGET_BYTES: [(u8, u64); 4] = [
    (11, 450_000_000),
    (12, 450_000_000),
    (13, 500_000_000),
    (14, 500_000_000),
];

/// One of the images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The default builder image each DaemonSet runs (the gcc 12 builder).
    Agent,
    /// The builder image of one compiler family (major gcc version, one of
    /// [`pins::FAMILIES`]).
    Builder(u8),
    /// The controller Deployment's image.
    Controller,
}

impl Which {
    /// `agent`, `agent-gcc<N>` or `controller`.
    pub fn name(self) -> String {
        match self {
            Which::Agent => "agent".into(),
            Which::Builder(gcc) => format!("agent-gcc{gcc}"),
            Which::Controller => "controller".into(),
        }
    }

    /// The repository the chart names by default.
    pub fn repository(self) -> &'static str {
        match self {
            Which::Agent | Which::Builder(_) => "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder",
            Which::Controller => "ghcr.io/tenstorrent/tt-k8s-driver-manager",
        }
    }

    /// The uncompressed size budget.
    pub fn budget(self) -> u64 {
        match self {
            Which::Agent => AGENT_BUDGET_BYTES,
            Which::Builder(gcc) => BUILDER_BUDGET_BYTES
                .iter()
                .find(|(family, _)| *family == gcc)
                .map_or(0, |(_, budget)| *budget),
            Which::Controller => CONTROLLER_BUDGET_BYTES,
        }
    }

    /// The compiler family of a builder image; `None` for the controller.
    pub fn gcc(self) -> Option<u8> {
        match self {
            Which::Agent => Some(pins::DEFAULT_FAMILY),
            Which::Builder(gcc) => Some(gcc),
            Which::Controller => None,
        }
    }

    fn dockerfile(self) -> &'static str {
        match self {
            Which::Agent | Which::Builder(_) => "deploy/docker/agent.Dockerfile",
            Which::Controller => "deploy/docker/controller.Dockerfile",
        }
    }
}

/// A built image: its archive, digest and sizes.
#[derive(Debug, Clone)]
pub struct Built {
    /// Which image.
    pub which: Which,
    /// The archive and what it holds.
    pub archive: ImageArchive,
    /// Unpacked size in bytes.
    pub uncompressed: u64,
}

impl Built {
    /// `repository@digest` with the chart's default repository.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.which.repository(), self.archive.digest)
    }
}

const USAGE: &str = "usage: cargo xtask image agent|controller [--engine docker|podman|buildah]
       cargo xtask image agent --gcc 11|12|13|14 [--engine ...]   (a builder per compiler family)
       cargo xtask image inputs|binaries
       cargo xtask image check-agent PATH   (PATH has no test hooks and refuses TTDP_KERNEL=sim)";

/// Entry point of `cargo xtask image`.
pub fn run(args: &[String]) -> Result<()> {
    let (mut which, mut engine, mut gcc) = (None, None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "agent" => which = Some(Which::Agent),
            "controller" => which = Some(Which::Controller),
            "inputs" if args.len() == 1 => return prepare_inputs(),
            "binaries" if args.len() == 1 => return binaries::build(&repo_root()?).map(|_| ()),
            "check-agent" if args.len() == 2 => {
                let path = PathBuf::from(it.next().context(USAGE)?);
                let bytes =
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                binaries::check_release_agent(&path, &bytes)?;
                println!(
                    "{}: a release agent (no test hooks, no simulated kernel)",
                    path.display()
                );
                return Ok(());
            }
            "--engine" => engine = Some(it.next().context(USAGE)?.clone()),
            "--gcc" => gcc = Some(parse_family(it.next().context(USAGE)?)?),
            _ => bail!("{USAGE}"),
        }
    }
    let which = match (which.context(USAGE)?, gcc) {
        (Which::Agent, Some(gcc)) => Which::Builder(gcc),
        (which, None) => which,
        (_, Some(_)) => bail!("--gcc only applies to the agent image\n{USAGE}"),
    };
    build(which, engine.as_deref())?;
    Ok(())
}

/// A compiler family from the command line: one of [`pins::FAMILIES`].
fn parse_family(arg: &str) -> Result<u8> {
    arg.parse()
        .ok()
        .filter(|gcc| pins::FAMILIES.contains(gcc))
        .with_context(|| {
            format!(
                "--gcc {arg:?}: the builder images serve gcc {:?}",
                pins::FAMILIES
            )
        })
}

/// Builds (or finds cached) what the images are made of besides our binaries: every builder's
/// root filesystem and tt-smi. They take mostly downloads, so the test script starts this while
/// it compiles.
pub fn prepare_inputs() -> Result<()> {
    let root = repo_root()?;
    let cache = image_dir(&root)?.join("cache");
    let pins = Pins::load(&root)?;
    for gcc in pins::FAMILIES {
        rootfs::builder_rootfs(&cache, &pins, gcc)?;
    }
    tt_smi::build(&root, &cache, &pins)?;
    Ok(())
}

/// `<target>/image`.
pub fn image_dir(root: &Path) -> Result<PathBuf> {
    Ok(tools::target_dir(root)?.join("image"))
}

/// Builds `which` (or reuses an archive built from the same inputs) and prints what it is.
pub fn build(which: Which, engine: Option<&str>) -> Result<Built> {
    let root = repo_root()?;
    let dir = image_dir(&root)?;
    let started = std::time::Instant::now();
    let engine = Engine::pick(engine, &dir)?;
    let pins = Pins::load(&root)?;
    let context = dir.join(which.name()).join("context");
    let build_args = prepare_context(&root, &dir, &pins, which, &context)?;
    let dockerfile = root.join(which.dockerfile());
    let archive = dir.join(format!("{}.oci.tar", which.name()));
    let key_file = dir.join(format!("{}.oci.tar.key", which.name()));
    let key = context_key(&dockerfile, &context, &build_args, &engine)?;
    let unchanged =
        archive.is_file() && std::fs::read_to_string(&key_file).is_ok_and(|k| k.trim() == key);
    if unchanged {
        println!(
            "image: {} unchanged since {} was built",
            which.name(),
            archive.display()
        );
    } else if let Some(twin) = archive_with_key(&dir, &key)? {
        // `agent` and `agent-gcc12` are made from the same context: one build serves both.
        let _ = std::fs::remove_file(&archive);
        link_or_copy(&twin, &archive)?;
        std::fs::write(&key_file, &key).context("writing the archive's key")?;
        println!(
            "image: {} is {} (same inputs)",
            which.name(),
            twin.display()
        );
    } else {
        let _ = std::fs::remove_file(&key_file);
        engine.build(&engine::BuildSpec {
            dockerfile: &dockerfile,
            context: &context,
            build_args: &build_args,
            name: &format!("ttdp-{}", which.name()),
            archive: &archive,
        })?;
        std::fs::write(&key_file, &key).context("writing the archive's key")?;
    }
    let archive = ImageArchive::open(&archive)?;
    let built = Built {
        which,
        uncompressed: archive.uncompressed_size()?,
        archive,
    };
    print_built(&built, &engine, started.elapsed());
    Ok(built)
}

fn print_built(built: &Built, engine: &Engine, elapsed: std::time::Duration) {
    let mb = |b: u64| b as f64 / 1e6;
    println!(
        "image: {} built with {} in {:.0} s\n  archive   {}\n  digest    {}\n  reference {}\n  size      {:.1} MB uncompressed (budget {:.0} MB), {:.1} MB compressed",
        built.which.name(),
        engine.name(),
        elapsed.as_secs_f64(),
        built.archive.path.display(),
        built.archive.digest,
        built.reference(),
        mb(built.uncompressed),
        mb(built.which.budget()),
        mb(built.archive.compressed_size),
    );
    if built.uncompressed > built.which.budget() {
        println!(
            "image: warning: {} is over its size budget",
            built.which.name()
        );
    }
}

/// Another archive in `dir` built from the inputs whose key is `key`.
fn archive_with_key(dir: &Path, key: &str) -> Result<Option<PathBuf>> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let Some(archive) = path.to_str().and_then(|p| p.strip_suffix(".key")) else {
            continue;
        };
        let archive = PathBuf::from(archive);
        if archive.is_file() && std::fs::read_to_string(&path).is_ok_and(|k| k.trim() == key) {
            return Ok(Some(archive));
        }
    }
    Ok(None)
}

/// Fills `context` with what the Dockerfile copies; returns the build arguments.
fn prepare_context(
    root: &Path,
    dir: &Path,
    pins: &Pins,
    which: Which,
    context: &Path,
) -> Result<Vec<(&'static str, String)>> {
    let cache = dir.join("cache");
    let gcc = which.gcc().unwrap_or(pins::DEFAULT_FAMILY);
    let rootfs = rootfs::builder_rootfs(&cache, pins, gcc)?;
    let tt_smi = match which {
        Which::Agent | Which::Builder(_) => Some(tt_smi::build(root, &cache, pins)?),
        Which::Controller => None,
    };
    let binaries = binaries::build(root)?;
    if context.exists() {
        std::fs::remove_dir_all(context)
            .with_context(|| format!("clearing {}", context.display()))?;
    }
    std::fs::create_dir_all(context).with_context(|| format!("creating {}", context.display()))?;
    let binary = |name: &str| {
        binaries
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| p.clone())
            .with_context(|| format!("{name} was not built"))
    };
    match (which, tt_smi) {
        (Which::Agent | Which::Builder(_), Some(tt_smi)) => {
            // a hard link: the root filesystem is hundreds of MB
            link_or_copy(&rootfs, &context.join("rootfs.tar"))?;
            binaries::install_stripped(&binary("ttdp-agent")?, &context.join("ttdp-agent"))?;
            std::fs::copy(&tt_smi, context.join("tt-smi")).context("copying tt-smi")?;
            Ok(vec![
                ("TT_SMI_VERSION", pins.tt_smi.version.clone()),
                ("TTDP_BUILDER_GCC", gcc.to_string()),
            ])
        }
        (Which::Agent | Which::Builder(_), None) => bail!("tt-smi was not built"),
        (Which::Controller, _) => {
            let bundle = rootfs::tar_member(&rootfs, "./etc/ssl/certs/ca-certificates.crt")?;
            std::fs::write(context.join("ca-certificates.crt"), bundle)
                .context("writing the CA bundle")?;
            binaries::install_stripped(
                &binary("ttdp-controller")?,
                &context.join("ttdp-controller"),
            )?;
            Ok(Vec::new())
        }
    }
}

fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(())
}

/// A key of everything the engine build reads: the Dockerfile, the build arguments, the engine
/// and the contents of every context file.
fn context_key(
    dockerfile: &Path,
    context: &Path,
    build_args: &[(&str, String)],
    engine: &Engine,
) -> Result<String> {
    let mut parts: Vec<Vec<u8>> = vec![
        std::fs::read(dockerfile).with_context(|| format!("reading {}", dockerfile.display()))?,
        engine.name().as_bytes().to_vec(),
    ];
    parts.extend(
        build_args
            .iter()
            .map(|(k, v)| format!("{k}={v}").into_bytes()),
    );
    let mut entries: Vec<_> = std::fs::read_dir(context)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for path in entries {
        parts.push(
            path.file_name()
                .unwrap_or_default()
                .as_encoded_bytes()
                .to_vec(),
        );
        parts.push(oci::sha256_file(&path)?.into_bytes());
    }
    Ok(cache_key(parts.iter().map(Vec::as_slice)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_state_each_builder_budget() {
        let docs = std::fs::read_to_string(repo_root().unwrap().join("docs/images.md")).unwrap();
        for (gcc, budget) in BUILDER_BUDGET_BYTES {
            let start = format!("| {gcc} | `agent-gcc{gcc}` |");
            let row = docs.lines().find(|l| l.starts_with(&start));
            let row = row.unwrap_or_else(|| panic!("docs/images.md has no row {start:?}"));
            let want = format!("| {} MB |", budget / 1_000_000);
            assert!(
                row.trim_end().ends_with(&want),
                "{row:?} does not end in {want:?}"
            );
        }
    }

    #[test]
    fn only_served_families_are_accepted() {
        assert_eq!(parse_family("13").unwrap(), 13);
        for bad in ["10", "15", "gcc-13", ""] {
            assert!(parse_family(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Which::Builder(14).name(), "agent-gcc14");
        assert_eq!(Which::Builder(14).budget(), 500_000_000);
        assert_eq!(Which::Agent.gcc(), Some(12));
    }
}
