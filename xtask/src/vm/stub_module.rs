//! Builds the stub `tenstorrent` module (`tests/vm/stub-module/`) on the host against the Debian
//! headers, once per [`STUB_MODULES`] entry, in
//! `<cache>/modules/<release>/<version>/`. A build is reused while its copied sources are identical
//! to the repository's.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::headers::Headers;
use super::scenarios::{STUB_MODULES, StubModule};

/// The files that make up the stub module's source.
const SOURCES: &[&str] = &["Kbuild", "tenstorrent.c"];

/// One built, debug-stripped stub module.
#[derive(Debug)]
pub struct BuiltModule {
    /// What was built.
    pub module: &'static StubModule,
    /// The `tenstorrent.ko` file.
    pub ko: PathBuf,
}

/// Builds (or reuses) every stub module version.
pub fn build_all(root: &Path, cache: &Path, headers: &Headers) -> Result<Vec<BuiltModule>> {
    let source_dir = root.join("tests/vm/stub-module");
    STUB_MODULES
        .iter()
        .map(|module| {
            let dir = cache
                .join("modules")
                .join(&headers.release)
                .join(module.version);
            let ko = build(&source_dir, &dir, headers, module)?;
            Ok(BuiltModule { module, ko })
        })
        .collect()
}

fn build(source_dir: &Path, dir: &Path, headers: &Headers, module: &StubModule) -> Result<PathBuf> {
    let ko = dir.join("tenstorrent.ko");
    let mut up_to_date = ko.is_file();
    for name in SOURCES {
        let source = source_dir.join(name);
        let wanted =
            std::fs::read(&source).with_context(|| format!("reading {}", source.display()))?;
        let copy = dir.join(name);
        if std::fs::read(&copy).ok().as_deref() != Some(wanted.as_slice()) {
            up_to_date = false;
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            std::fs::write(&copy, &wanted)
                .with_context(|| format!("writing {}", copy.display()))?;
        }
    }
    if up_to_date {
        return Ok(ko);
    }
    // A stale .ko must not survive a failed build.
    if ko.exists() {
        std::fs::remove_file(&ko).with_context(|| format!("removing {}", ko.display()))?;
    }

    let mut make = Command::new("timeout");
    make.arg("300")
        .arg("make")
        .arg("-C")
        .arg(&headers.dir)
        .arg(format!("M={}", dir.display()))
        .arg(format!("TT_STUB_VERSION={}", module.version));
    if module.fail_init {
        make.arg("TT_STUB_FAIL_INIT=1");
    }
    make.arg("modules");
    let output = make.output().context("running make for the stub module")?;
    if !output.status.success() {
        bail!(
            "building the stub module {} against {} failed ({}):\n{}{}",
            module.version,
            headers.dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let status = Command::new("strip")
        .arg("--strip-debug")
        .arg(&ko)
        .status()
        .context("running strip")?;
    if !status.success() {
        bail!("strip --strip-debug {} failed ({status})", ko.display());
    }
    Ok(ko)
}
