//! The self-contained tt-smi: `deploy/docker/build-tt-smi.sh` runs PyInstaller inside a
//! throw-away Debian root (mmdebstrap's `--format=null`, the pinned `ttSmiBuild` packages) and
//! the onefile binary is copied out. Cached under `<target>/image/cache/` by a key of the pins and
//! the script; nothing of the Python root reaches an image.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::oci;
use super::pins::{Pins, cache_key};
use super::rootfs;

const SCRIPT: &str = "deploy/docker/build-tt-smi.sh";
/// Where the build happens inside the throw-away root (the script's `$out`).
const GUEST_DIR: &str = "/opt/tt-smi-build";

/// Environment variables passed from the host into the build: a proxy, if the host uses one.
const PASSED_ENV: [&str; 6] = [
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

/// The built `tt-smi`, building it when the cache has none for these pins.
pub fn build(root: &Path, cache: &Path, pins: &Pins) -> Result<PathBuf> {
    let script = root.join(SCRIPT);
    let script_text =
        std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?;
    let t = &pins.tt_smi;
    let root_pins = &pins.debian.tt_smi_build;
    let key = cache_key(
        [
            script_text.as_slice(),
            root_pins.suite.as_bytes(),
            t.version.as_bytes(),
            t.pyinstaller.as_bytes(),
            t.python.source.as_bytes(),
            t.python.sha256.as_bytes(),
        ]
        .into_iter()
        .chain(pins.sources(&root_pins.suite)?.iter().map(|s| s.as_bytes()))
        .chain(root_pins.packages.iter().map(|s| s.as_bytes()))
        .chain(t.constraints.iter().map(|s| s.as_bytes())),
    );
    let dir = cache.join(format!("tt-smi-{}-{key}", t.version));
    let binary = dir.join("tt-smi");
    if binary.is_file() {
        println!("image: tt-smi {} {} (cached)", t.version, binary.display());
        return Ok(binary);
    }
    rootfs::require_mmdebstrap()?;
    let inputs = dir.join("inputs");
    std::fs::create_dir_all(&inputs).with_context(|| format!("creating {}", inputs.display()))?;
    std::fs::copy(&script, inputs.join("build-tt-smi.sh"))
        .with_context(|| format!("copying {}", script.display()))?;
    std::fs::write(
        inputs.join("constraints.txt"),
        t.constraints.join("\n") + "\n",
    )
    .context("writing the pip constraints")?;
    let ca = host_ca_bundle()?;
    std::fs::copy(&ca, inputs.join("ca.crt"))
        .with_context(|| format!("copying {}", ca.display()))?;
    let python = python_source(cache, pins)?;
    std::fs::copy(&python, inputs.join("python.tar.gz"))
        .with_context(|| format!("copying {}", python.display()))?;
    run_build(pins, &inputs, &dir)?;
    if !binary.is_file() {
        bail!("the tt-smi build left no {}", binary.display());
    }
    report_unpinned(&dir.join("freeze.txt"), pins);
    println!("image: built tt-smi {} {}", t.version, binary.display());
    Ok(binary)
}

/// The pinned CPython source tarball, downloaded once into `cache` and checked against its
/// sha256.
fn python_source(cache: &Path, pins: &Pins) -> Result<PathBuf> {
    let python = &pins.tt_smi.python;
    let file = cache.join(format!("python-src-{}.tar.gz", &python.sha256[..16]));
    if !file.is_file() {
        let partial = file.with_extension("partial");
        let status = std::process::Command::new("curl")
            .args([
                "--fail",
                "--silent",
                "--show-error",
                "--location",
                "--retry",
                "3",
            ])
            .arg("--output")
            .arg(&partial)
            .arg(&python.source)
            .status()
            .context("running curl")?;
        if !status.success() {
            bail!("downloading {} failed ({status})", python.source);
        }
        std::fs::rename(&partial, &file)?;
    }
    let sum = oci::sha256_file(&file)?;
    if sum.strip_prefix("sha256:") != Some(python.sha256.as_str()) {
        let _ = std::fs::remove_file(&file);
        bail!(
            "{} has sha256 {sum}, not the pinned {}",
            python.source,
            python.sha256
        );
    }
    Ok(file)
}

/// The CA bundle the host's pip trusts (PyPI may be reached through a TLS-inspecting proxy
/// whose CA only the host knows): `PIP_CERT`, `REQUESTS_CA_BUNDLE`, `SSL_CERT_FILE`, or
/// Debian's bundle.
fn host_ca_bundle() -> Result<PathBuf> {
    ["PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .chain([PathBuf::from("/etc/ssl/certs/ca-certificates.crt")])
        .find(|p| p.is_file())
        .context("no CA bundle for pip: set PIP_CERT or install ca-certificates")
}

/// One mmdebstrap run: install the build packages, copy the inputs in, run the script with a
/// clean environment (the host's `REQUESTS_CA_BUNDLE` would name a path that does not exist
/// there and override pip's `--cert`), copy the results out.
fn run_build(pins: &Pins, inputs: &Path, out: &Path) -> Result<()> {
    let t = &pins.tt_smi;
    let mut env = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
        "HOME=/root".to_owned(),
        format!("TT_SMI_VERSION={}", t.version),
        format!("PYINSTALLER_VERSION={}", t.pyinstaller),
        format!("PIP_CONSTRAINT={GUEST_DIR}/constraints.txt"),
        format!("PIP_CERT={GUEST_DIR}/ca.crt"),
    ];
    for name in PASSED_ENV {
        if let Ok(value) = std::env::var(name) {
            env.push(format!("{name}={value}"));
        }
    }
    let env: Vec<String> = env.iter().map(|e| shell_quote(e)).collect();
    let mut cmd = rootfs::mmdebstrap(
        pins,
        &pins.debian.tt_smi_build,
        "null",
        Path::new("/dev/null"),
    )?;
    cmd.arg(format!("--customize-hook=mkdir -p \"$1{GUEST_DIR}\""))
        .arg(format!(
            "--customize-hook=copy-in {0}/build-tt-smi.sh {0}/constraints.txt {0}/ca.crt {0}/python.tar.gz {GUEST_DIR}",
            inputs.display()
        ))
        .arg(format!(
            "--customize-hook=chroot \"$1\" env -i {} sh {GUEST_DIR}/build-tt-smi.sh",
            env.join(" ")
        ))
        .arg(format!(
            "--customize-hook=copy-out {GUEST_DIR}/dist/tt-smi {GUEST_DIR}/freeze.txt {}",
            out.display()
        ));
    let status = cmd.status().context("running mmdebstrap")?;
    if !status.success() {
        bail!(
            "building tt-smi {} with PyInstaller failed ({status}); the output above says why \
             (a pin in deploy/docker/image-pins.yaml that does not resolve, or PyPI unreachable)",
            t.version
        );
    }
    Ok(())
}

/// Prints the build's Python packages that the pins do not list (after a tt-smi bump: copy
/// them into `ttSmi.constraints`).
fn report_unpinned(freeze: &Path, pins: &Pins) {
    let Ok(text) = std::fs::read_to_string(freeze) else {
        return;
    };
    let t = &pins.tt_smi;
    let pinned = |line: &str| {
        t.constraints.iter().any(|c| c.eq_ignore_ascii_case(line))
            || line.eq_ignore_ascii_case(&format!("tt-smi=={}", t.version))
            || line.eq_ignore_ascii_case(&format!("pyinstaller=={}", t.pyinstaller))
    };
    let unpinned: Vec<&str> = text.lines().filter(|l| !pinned(l.trim())).collect();
    if !unpinned.is_empty() {
        println!(
            "image: note: Python packages not in ttSmi.constraints: {}",
            unpinned.join(", ")
        );
    }
}

/// Single-quotes `s` for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_keeps_values_whole() {
        assert_eq!(shell_quote("A=b c"), "'A=b c'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
