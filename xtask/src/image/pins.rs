//! `deploy/docker/image-pins.yaml`: every Debian package and Python package the images are made
//! from, with its version, in one file. Read and checked here; cache keys are derived from it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The pins file, relative to the repository root.
pub const PINS_FILE: &str = "deploy/docker/image-pins.yaml";

/// The whole pins file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pins {
    /// Debian suite, mirrors and packages.
    pub debian: DebianPins,
    /// tt-smi and how it is built.
    pub tt_smi: TtSmiPins,
}

/// The Debian side: the suites' mirrors, one builder root per compiler family, and tt-smi's
/// build root.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DebianPins {
    /// sources.list lines per suite (`bookworm`, `trixie`, ...), handed to mmdebstrap.
    pub suites: BTreeMap<String, Vec<String>>,
    /// One builder image's root filesystem per compiler family.
    pub builders: Vec<RootPins>,
    /// The throw-away root tt-smi is built in.
    pub tt_smi_build: RootPins,
}

/// One Debian root filesystem: its suite and the packages on top of minbase.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RootPins {
    /// The compiler family (major gcc version) a builder root serves; absent elsewhere.
    #[serde(default)]
    pub gcc: Option<u8>,
    /// A key of [`DebianPins::suites`].
    pub suite: String,
    /// `package=version` pins.
    pub packages: Vec<String>,
}

impl RootPins {
    /// The pinned version of `package`, if pinned.
    pub fn version_of(&self, package: &str) -> Option<&str> {
        self.packages
            .iter()
            .find_map(|p| p.strip_prefix(package)?.strip_prefix('='))
    }

    /// The pinned `linux-kbuild-<name>` package: (`<name>`, version).
    pub fn kbuild(&self) -> Option<(&str, &str)> {
        self.packages
            .iter()
            .find_map(|p| p.strip_prefix("linux-kbuild-")?.split_once('='))
    }
}

/// tt-smi's version and the PyInstaller build's Python packages.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TtSmiPins {
    /// The tt-smi release on PyPI (also the chart's `driver.ttSmiVersion`).
    pub version: String,
    /// PyInstaller's version.
    pub pyinstaller: String,
    /// The CPython source built in the build root.
    pub python: PythonSource,
    /// `name==version` for every other Python package of the build.
    pub constraints: Vec<String>,
}

/// A CPython source tarball and its sha256.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PythonSource {
    /// Its URL.
    pub source: String,
    /// Its sha256, hex.
    pub sha256: String,
}

impl Pins {
    /// Reads and checks the pins file under `root`.
    pub fn load(root: &Path) -> Result<Self> {
        let path = root.join(PINS_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let pins: Pins =
            serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        pins.check()
            .with_context(|| format!("checking {}", path.display()))?;
        Ok(pins)
    }

    /// The builder root of compiler family `gcc`.
    pub fn builder(&self, gcc: u8) -> Result<&RootPins> {
        self.debian
            .builders
            .iter()
            .find(|b| b.gcc == Some(gcc))
            .with_context(|| format!("{PINS_FILE} has no builder for gcc {gcc}"))
    }

    /// The sources.list lines of `suite`.
    pub fn sources(&self, suite: &str) -> Result<&[String]> {
        self.debian
            .suites
            .get(suite)
            .map(Vec::as_slice)
            .with_context(|| format!("{PINS_FILE} has no suite {suite:?}"))
    }

    /// Every package names an exact version, every version is a plain token (they end up in
    /// shell hooks and command lines), every root's suite has sources, and each served family
    /// has exactly one builder carrying that gcc and a kbuild.
    fn check(&self) -> Result<()> {
        let d = &self.debian;
        let roots = d.builders.iter().chain([&d.tt_smi_build]);
        for root in roots {
            check_root(self, root)?;
        }
        for gcc in FAMILIES {
            let count = d.builders.iter().filter(|b| b.gcc == Some(gcc)).count();
            if count != 1 {
                bail!("debian.builders has {count} entries for gcc {gcc}; exactly one is needed");
            }
        }
        for b in &d.builders {
            let gcc = b.gcc.context("a builder without `gcc`")?;
            if !FAMILIES.contains(&gcc) {
                bail!("builder gcc {gcc} is not one of the served families {FAMILIES:?}");
            }
            if b.version_of(&format!("gcc-{gcc}")).is_none() || b.kbuild().is_none() {
                bail!("the gcc {gcc} builder must pin gcc-{gcc} and a linux-kbuild-* package");
            }
        }
        for pin in &self.tt_smi.constraints {
            match pin.split_once("==") {
                Some((name, version)) if plain(name) && plain(version) => {}
                _ => bail!("Python pin {pin:?} is not package==version"),
            }
        }
        let python = &self.tt_smi.python;
        if !python.source.starts_with("http") || python.sha256.len() != 64 {
            bail!("ttSmi.python needs an http(s) source and a hex sha256");
        }
        for (what, value) in [
            ("ttSmi.version", &self.tt_smi.version),
            ("ttSmi.pyinstaller", &self.tt_smi.pyinstaller),
            ("ttSmi.python.sha256", &python.sha256),
        ] {
            if !plain(value) {
                bail!("{what} {value:?} is empty or has characters other than [A-Za-z0-9.+~:_-]");
            }
        }
        Ok(())
    }
}

/// The compiler families a builder image is made for: the major gcc versions of the kernels
/// of Ubuntu 22.04 (11), Debian 12 (12), Ubuntu 24.04 (13) and Debian 13 (14).
pub const FAMILIES: [u8; 4] = [11, 12, 13, 14];

/// The compiler family of the default agent image.
pub const DEFAULT_FAMILY: u8 = 12;

fn check_root(pins: &Pins, root: &RootPins) -> Result<()> {
    for pin in &root.packages {
        match pin.split_once('=') {
            Some((name, version)) if plain(name) && plain(version) => {}
            _ => bail!("Debian pin {pin:?} is not package=version"),
        }
    }
    if !plain(&root.suite) {
        bail!("suite {:?} is not a plain name", root.suite);
    }
    let sources = pins.sources(&root.suite)?;
    if sources.is_empty() || sources.iter().any(|s| !s.starts_with("deb ")) {
        bail!(
            "debian.suites.{} must be sources.list lines starting with `deb `",
            root.suite
        );
    }
    Ok(())
}

/// A version or package name safe to pass through a shell unquoted.
fn plain(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".+~:_-".contains(&b))
}

/// A short hex key naming a cached artefact built from `parts` (hashed with their lengths, so
/// two different splits never collide).
pub fn cache_key<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::repo_root;

    fn pins() -> Pins {
        Pins::load(&repo_root().unwrap()).unwrap()
    }

    #[test]
    fn the_pins_file_parses_and_every_package_has_a_version() {
        let pins = pins();
        let default = pins.builder(DEFAULT_FAMILY).unwrap();
        assert!(default.version_of("gcc-12").is_some());
        assert!(default.version_of("git").is_some());
        let mut bad = pins;
        bad.debian.builders[0].packages.push("make".into());
        assert!(bad.check().is_err(), "a package without a version passed");
        bad.debian.builders[0].packages.pop();
        bad.tt_smi.version = "6.8.0; rm -rf /".into();
        assert!(
            bad.check().is_err(),
            "a version with a shell command passed"
        );
    }

    #[test]
    fn every_family_has_one_builder_with_its_gcc_and_kbuild() {
        let pins = pins();
        for gcc in FAMILIES {
            let b = pins.builder(gcc).unwrap();
            assert!(b.version_of(&format!("gcc-{gcc}")).is_some(), "gcc {gcc}");
            assert!(b.kbuild().is_some(), "gcc {gcc}");
        }
        assert_eq!(
            pins.builder(14).unwrap().kbuild(),
            Some(("6.12.118+deb13", "6.12.118-1"))
        );
        let mut twice = pins;
        let extra = RootPins {
            gcc: Some(13),
            suite: "trixie".into(),
            packages: twice.builder(13).unwrap().packages.clone(),
        };
        twice.debian.builders.push(extra);
        assert!(twice.check().is_err(), "two builders for gcc 13 passed");
        twice.debian.builders.pop();
        twice.debian.builders.retain(|b| b.gcc != Some(11));
        assert!(twice.check().is_err(), "a missing family passed");
    }

    #[test]
    fn chart_and_dockerfile_name_the_pinned_tt_smi() {
        let root = repo_root().unwrap();
        let want = pins().tt_smi.version;
        let values =
            std::fs::read_to_string(root.join("deploy/helm/tt-k8s-driver-manager/values.yaml"))
                .unwrap();
        let line = format!("ttSmiVersion: \"{want}\"");
        assert!(
            values.lines().any(|l| l.trim() == line),
            "values.yaml's driver.ttSmiVersion is not {want:?} ({PINS_FILE})"
        );
        let dockerfile =
            std::fs::read_to_string(root.join("deploy/docker/agent.Dockerfile")).unwrap();
        let arg = format!("ARG TT_SMI_VERSION={want}");
        assert!(
            dockerfile.lines().any(|l| l.trim() == arg),
            "agent.Dockerfile's TT_SMI_VERSION default is not {want:?}"
        );
    }

    /// Needs PyPI (pip with the machine's index and certificates): the pinned tt-smi and
    /// PyInstaller must exist there, or no agent image can be built.
    #[test]
    fn pinned_tt_smi_and_pyinstaller_resolve_on_pypi() {
        let pins = pins();
        let dest = std::env::temp_dir().join(format!("ttdp-pins-{}", std::process::id()));
        for spec in [
            format!("tt-smi=={}", pins.tt_smi.version),
            format!("pyinstaller=={}", pins.tt_smi.pyinstaller),
        ] {
            let out = std::process::Command::new("python3")
                .args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"])
                .arg(&dest)
                .arg(&spec)
                .output()
                .expect("running python3 -m pip (install python3 and pip)");
            assert!(
                out.status.success(),
                "{spec} does not resolve on PyPI: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = std::fs::remove_dir_all(dest);
    }

    #[test]
    fn a_tt_smi_version_that_does_not_exist_fails_to_resolve() {
        // The check above can fail: the version the chart used to name is not on PyPI.
        let out = std::process::Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"])
            .arg(std::env::temp_dir().join("ttdp-pins-missing"))
            .arg("tt-smi==3.0.0")
            .output()
            .unwrap();
        assert!(!out.status.success());
    }

    #[test]
    fn cache_keys_change_with_any_part() {
        let a = cache_key([b"ab".as_slice(), b"c"]);
        assert_eq!(a.len(), 16);
        assert_ne!(a, cache_key([b"a".as_slice(), b"bc"]));
        assert_eq!(a, cache_key([b"ab".as_slice(), b"c"]));
    }
}
