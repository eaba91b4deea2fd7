//! `deploy/docker/image-pins.yaml`: every Debian package and Python package the images are made
//! from, with its version, in one file. Read and checked here; cache keys are derived from it.

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

/// The Debian side: one suite, its sources, and `package=version` lists.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DebianPins {
    /// e.g. `bookworm`.
    pub suite: String,
    /// sources.list lines handed to mmdebstrap.
    pub sources: Vec<String>,
    /// Packages of the agent image's root filesystem, on top of minbase.
    pub agent: Vec<String>,
    /// Packages of the throw-away root tt-smi is built in.
    pub tt_smi_build: Vec<String>,
}

/// tt-smi's version and the PyInstaller build's Python packages.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TtSmiPins {
    /// The tt-smi release on PyPI (also the chart's `driver.ttSmiVersion`).
    pub version: String,
    /// PyInstaller's version.
    pub pyinstaller: String,
    /// `name==version` for every other Python package of the build.
    pub constraints: Vec<String>,
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

    /// Every package names an exact version, and every version is a plain token (they end up in
    /// shell hooks and command lines).
    fn check(&self) -> Result<()> {
        let d = &self.debian;
        for pin in d.agent.iter().chain(&d.tt_smi_build) {
            match pin.split_once('=') {
                Some((name, version)) if plain(name) && plain(version) => {}
                _ => bail!("Debian pin {pin:?} is not package=version"),
            }
        }
        for pin in &self.tt_smi.constraints {
            match pin.split_once("==") {
                Some((name, version)) if plain(name) && plain(version) => {}
                _ => bail!("Python pin {pin:?} is not package==version"),
            }
        }
        for (what, value) in [
            ("debian.suite", &d.suite),
            ("ttSmi.version", &self.tt_smi.version),
            ("ttSmi.pyinstaller", &self.tt_smi.pyinstaller),
        ] {
            if !plain(value) {
                bail!("{what} {value:?} is empty or has characters other than [A-Za-z0-9.+~:_-]");
            }
        }
        if d.sources.is_empty() || d.sources.iter().any(|s| !s.starts_with("deb ")) {
            bail!("debian.sources must be sources.list lines starting with `deb `");
        }
        Ok(())
    }
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
        assert!(pins.debian.agent.iter().any(|p| p.starts_with("gcc-12=")));
        assert!(pins.debian.agent.iter().any(|p| p.starts_with("git=")));
        let mut bad = pins;
        bad.debian.agent.push("make".into());
        assert!(bad.check().is_err(), "a package without a version passed");
        bad.debian.agent.pop();
        bad.tt_smi.version = "6.8.0; rm -rf /".into();
        assert!(
            bad.check().is_err(),
            "a version with a shell command passed"
        );
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
