//! A Debian kernel of another suite than the host's (Debian 13's 6.12 for the gcc 14 builder),
//! named by the builder's pinned `linux-kbuild-<version>` package: its headers and its image are
//! fetched with `apt-get download` through a private apt configuration that lists only that
//! suite's mirrors (the host's own sources and package state are not touched), and unpacked
//! with `dpkg-deb`, cached under `<target>/image/cache/debian-kernel/<release>/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::image::{self, pins::Pins};
use crate::tools::repo_root;

/// One Debian kernel, as pinned by a builder's kbuild package.
#[derive(Debug, Clone)]
pub struct PinnedKernel {
    /// e.g. `6.12.118+deb13`: the kbuild package's name without `linux-kbuild-`.
    pub base: String,
    /// The packages' version, e.g. `6.12.118-1`.
    pub version: String,
    /// The suite whose mirrors have it.
    pub suite: String,
    /// `<cache>/debian-kernel/<release>/`.
    pub dir: PathBuf,
    /// A kbuild package to unpack into the headers tree too (when the image does not carry it).
    pub kbuild: Option<String>,
}

/// An unpacked headers tree: `usr/src/linux-headers-<release>{,-common}` and
/// `lib/modules/<release>/build` leading to the former, as on a node.
#[derive(Debug, Clone)]
pub struct HeadersTree {
    /// The kernel release, e.g. `6.12.118+deb13-amd64`.
    pub release: String,
    /// The unpacked root (mount its `usr/src` and `lib/modules`).
    pub root: PathBuf,
}

impl PinnedKernel {
    /// The kernel the gcc `gcc` builder's kbuild package serves.
    pub fn of_builder(gcc: u8) -> Result<Self> {
        let root = repo_root()?;
        let pins = Pins::load(&root)?;
        let builder = pins.builder(gcc)?;
        let (base, version) = builder.kbuild().context("the builder pins no kbuild")?;
        if !base.contains('+') {
            bail!(
                "linux-kbuild-{base} names no kernel version: this builder serves any {base} kernel"
            );
        }
        Self::new(base, version, &builder.suite, None)
    }

    /// The kernel `<base>-amd64` at `version` from `suite`, with `kbuild` (a package name)
    /// unpacked beside its headers when given.
    pub fn new(base: &str, version: &str, suite: &str, kbuild: Option<&str>) -> Result<Self> {
        let dir = image::image_dir(&repo_root()?)?
            .join("cache/debian-kernel")
            .join(format!("{base}-amd64"));
        Ok(Self {
            base: base.to_owned(),
            version: version.to_owned(),
            suite: suite.to_owned(),
            dir,
            kbuild: kbuild.map(str::to_owned),
        })
    }

    /// `<base>-amd64`.
    pub fn release(&self) -> String {
        format!("{}-amd64", self.base)
    }

    /// The headers of this kernel, unpacked (downloaded once).
    pub fn headers(&self) -> Result<HeadersTree> {
        let root = self.dir.join("headers");
        let release = self.release();
        let done = root.join(".complete");
        if !done.is_file() {
            let mut names = vec![
                format!("linux-headers-{release}"),
                format!("linux-headers-{}-common", self.base),
            ];
            names.extend(self.kbuild.clone());
            let debs = self.download(&names)?;
            if root.exists() {
                std::fs::remove_dir_all(&root)?;
            }
            for deb in &debs {
                dpkg_extract(deb, &root)?;
            }
            let modules = root.join("lib/modules").join(&release);
            std::fs::create_dir_all(&modules)?;
            let _ = std::fs::remove_file(modules.join("build"));
            std::os::unix::fs::symlink(
                format!("/usr/src/linux-headers-{release}"),
                modules.join("build"),
            )
            .context("linking lib/modules/<release>/build")?;
            std::fs::write(&done, "").context("marking the headers unpacked")?;
        }
        Ok(HeadersTree { release, root })
    }

    /// The kernel image package `linux-image-<release>` (downloaded once).
    pub fn image_deb(&self) -> Result<PathBuf> {
        let debs = self.download(&[format!("linux-image-{}", self.release())])?;
        debs.into_iter().next().context("no kernel image package")
    }

    /// `apt-get download NAME=VERSION...` into `<dir>/debs/` (skipped for those already there);
    /// returns the `.deb` files in the order of `names`.
    fn download(&self, names: &[String]) -> Result<Vec<PathBuf>> {
        let debs = self.dir.join("debs");
        std::fs::create_dir_all(&debs)?;
        let find = |name: &str| {
            let prefix = format!("{name}_");
            std::fs::read_dir(&debs).ok().and_then(|entries| {
                entries.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
                })
            })
        };
        let missing: Vec<String> = names
            .iter()
            .filter(|n| find(n).is_none())
            .map(|n| format!("{n}={}", self.version))
            .collect();
        if !missing.is_empty() {
            let apt = self.private_apt()?;
            apt_get(&apt, &debs, &["update"])?;
            let mut args = vec!["download"];
            args.extend(missing.iter().map(String::as_str));
            apt_get(&apt, &debs, &args)?;
        }
        names
            .iter()
            .map(|n| find(n).with_context(|| format!("apt-get download left no {n}")))
            .collect()
    }

    /// An apt configuration listing only this suite's pinned mirrors, with its own lists and
    /// cache under `<dir>/apt/`; returns the file for `APT_CONFIG`.
    fn private_apt(&self) -> Result<PathBuf> {
        let pins = Pins::load(&repo_root()?)?;
        let apt = self.dir.join("apt");
        for sub in ["lists/partial", "cache/archives/partial"] {
            std::fs::create_dir_all(apt.join(sub))?;
        }
        let sources = apt.join("sources.list");
        std::fs::write(&sources, pins.sources(&self.suite)?.join("\n") + "\n")?;
        let d = apt.display();
        let config = format!(
            "Dir::Etc::SourceList \"{d}/sources.list\";\nDir::Etc::SourceParts \"/dev/null\";\n\
             Dir::State::Lists \"{d}/lists\";\nDir::Cache \"{d}/cache\";\n\
             Dir::State::status \"/dev/null\";\nAPT::Sandbox::User \"root\";\n\
             Acquire::Languages \"none\";\n"
        );
        let file = apt.join("apt.conf");
        std::fs::write(&file, config)?;
        Ok(file)
    }
}

fn apt_get(config: &Path, dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("timeout")
        .args(["600", "apt-get", "-q"])
        .args(args)
        .env("APT_CONFIG", config)
        .current_dir(dir)
        .output()
        .context("running apt-get")?;
    if !out.status.success() {
        bail!(
            "apt-get {} failed ({}): {}{}\nIf a version was not found, Debian moved on: update \
             the builder's linux-kbuild pin in deploy/docker/image-pins.yaml",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// `dpkg-deb -x DEB DIR`.
pub fn dpkg_extract(deb: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let status = Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb)
        .arg(dir)
        .status()
        .context("running dpkg-deb")?;
    if !status.success() {
        bail!("dpkg-deb -x {} failed ({status})", deb.display());
    }
    Ok(())
}
