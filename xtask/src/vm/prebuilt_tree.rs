//! The tree of prebuilt modules scenario `prebuilt` serves from the guest's loopback: what
//! `cargo xtask prebuild` writes for the newest loadable stub version, built from a repository
//! of the stub module against the host's headers (the kernel the guest runs).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ttdp_kmod::KmdVersion;

use super::headers::Headers;
use super::scenarios::STUB_MODULES;
use super::stub_repo;
use crate::prebuild::{Prebuild, build};

/// Where the tree goes in the guest (a web server's document root serves it as `/tt-kmd/...`).
pub const GUEST_DIR: &str = "/srv/www/tt-kmd";

/// What goes into the guest: files as (host path, guest path), variables as (name, value).
pub struct GuestAdditions {
    pub files: Vec<(PathBuf, String)>,
    pub env: Vec<(String, String)>,
}

/// The tree's files for the initramfs, and the guest's variables naming the tree and the version
/// it holds.
pub fn prepare(root: &Path, cache: &Path, headers: &Headers) -> Result<GuestAdditions> {
    let work = cache.join("prebuilt");
    let repo = work.join("stub-repo.git");
    stub_repo::build(root, &work.join("stub-repo-work"), &repo)?;
    let module = STUB_MODULES
        .iter()
        .rev()
        .find(|m| !m.fail_init)
        .context("no loadable stub module version")?;
    let version: KmdVersion = module
        .version
        .parse()
        .map_err(|e| anyhow::anyhow!("stub version: {e}"))?;
    let out = work.join("www");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    let done = build(&Prebuild {
        kernel_headers: headers.dir.clone(),
        kernel_release: None,
        version,
        repository: repo.display().to_string(),
        commit: None,
        out,
        make_args: Vec::new(),
    })?;
    let guest = |file: &Path| -> Result<String> {
        let name = file.file_name().context("a prebuilt file without a name")?;
        Ok(format!(
            "{GUEST_DIR}/{}/{}/{}",
            module.version,
            done.release,
            name.to_string_lossy()
        ))
    };
    let sum = done.ko.with_extension("ko.sha256");
    let files = vec![
        (done.ko.clone(), guest(&done.ko)?),
        (sum.clone(), guest(&sum)?),
    ];
    let env = vec![
        ("TTDP_VM_PREBUILT_DIR".to_owned(), GUEST_DIR.to_owned()),
        (
            "TTDP_VM_PREBUILT_VERSION".to_owned(),
            module.version.to_owned(),
        ),
    ];
    Ok(GuestAdditions { files, env })
}
