//! `cargo xtask krew DIR`: fills the krew manifest (`deploy/krew/tt-driver.yaml`) for this
//! workspace's version: the release URIs and the sha256 of each platform's archive, read from
//! the archives (named as in the URIs) that the release build left in DIR. Fails, changing
//! nothing, when an archive is missing or lacks one of the executables it must ship: the plugin
//! and its completion helper (what kubectl runs to complete policy and node names).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{crd, tools};

/// The manifest, relative to the workspace root.
const MANIFEST: &str = "deploy/krew/tt-driver.yaml";

/// The executables every release archive holds at its root.
const EXECUTABLES: [&str; 2] = ["kubectl-tt-driver", "kubectl_complete-tt-driver"];

pub fn run(args: &[String]) -> Result<()> {
    let [dir] = args else {
        bail!(
            "usage: cargo xtask krew DIR   (DIR holds the release archives named as in {MANIFEST})"
        )
    };
    let path = crd::workspace_root().join(MANIFEST);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {MANIFEST}"))?;
    let text = set_version(&text, env!("CARGO_PKG_VERSION"));
    let mut sums = BTreeMap::new();
    let mut missing = Vec::new();
    for file in archive_names(&text) {
        let archive = Path::new(dir).join(&file);
        match std::fs::read(&archive) {
            Ok(bytes) => {
                let lacking = lacking_executables(&listing(&archive)?);
                if !lacking.is_empty() {
                    bail!("{} lacks {}", archive.display(), lacking.join(" and "));
                }
                sums.insert(file, tools::sha256_hex(&bytes));
            }
            Err(_) => missing.push(archive.display().to_string()),
        }
    }
    if !missing.is_empty() {
        bail!(
            "missing release archives (build each platform's {} and pack them at the archive's root, named as in the manifest): {}",
            EXECUTABLES.join(" and "),
            missing.join(", ")
        );
    }
    std::fs::write(&path, fill_checksums(&text, &sums)?)
        .with_context(|| format!("writing {MANIFEST}"))?;
    println!("{MANIFEST}: version and {} checksums filled", sums.len());
    Ok(())
}

/// The file names in a `.tar.gz` archive, one a line (`tar -tzf`).
fn listing(archive: &Path) -> Result<String> {
    let out = Command::new("tar")
        .arg("-tzf")
        .arg(archive)
        .output()
        .with_context(|| format!("running tar -tzf {}", archive.display()))?;
    if !out.status.success() {
        bail!(
            "cannot list {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The [`EXECUTABLES`] not at the root of an archive listed as `listing`.
fn lacking_executables(listing: &str) -> Vec<&'static str> {
    EXECUTABLES
        .into_iter()
        .filter(|exe| !listing.lines().any(|l| l.trim_start_matches("./") == *exe))
        .collect()
}

/// `spec.version` and the release URIs set to `version`.
fn set_version(text: &str, version: &str) -> String {
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            if let Some(uri) = trimmed.strip_prefix("uri: ") {
                let (base, file) = uri.rsplit_once('/').unwrap_or(("", uri));
                let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
                let target = file
                    .strip_prefix("kubectl-tt-driver-v")
                    .and_then(|rest| rest.split_once('-'))
                    .map_or(file, |(_, target)| target);
                format!("{indent}uri: {base}/v{version}/kubectl-tt-driver-v{version}-{target}")
            } else if trimmed.starts_with("version: v") && indent.len() == 2 {
                format!("{indent}version: v{version}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The archive file names the manifest's URIs point at.
fn archive_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix("uri: "))
        .filter_map(|uri| uri.rsplit_once('/').map(|(_, file)| file.to_owned()))
        .collect()
}

/// Each platform's `sha256:` set from `sums` (by the file name of the URI above it).
fn fill_checksums(text: &str, sums: &BTreeMap<String, String>) -> Result<String> {
    let mut current: Option<&String> = None;
    let mut out = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if let Some(file) = archive_names(line).into_iter().next() {
            current = sums.get(&file);
            out.push(line.to_owned());
        } else if trimmed.starts_with("sha256: ") {
            let Some(sum) = current.take() else {
                bail!("{MANIFEST}: a sha256 line without a uri line above it");
            };
            out.push(format!("{indent}sha256: \"{sum}\""));
        } else {
            out.push(line.to_owned());
        }
    }
    Ok(out.join("\n") + "\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_committed_manifest_is_filled_for_a_new_version_with_each_archives_checksum() {
        let text = std::fs::read_to_string(crd::workspace_root().join(MANIFEST)).unwrap();
        let text = set_version(&text, "9.8.7");
        assert!(text.contains("\n  version: v9.8.7\n"));
        let names = archive_names(&text);
        assert_eq!(names.len(), 3, "one archive per platform");
        assert!(
            names.contains(&"kubectl-tt-driver-v9.8.7-x86_64-unknown-linux-musl.tar.gz".into())
        );
        assert!(text.contains(
            "releases/download/v9.8.7/kubectl-tt-driver-v9.8.7-aarch64-apple-darwin.tar.gz"
        ));
        let sums: BTreeMap<String, String> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), format!("{:x}", i + 10).repeat(64)))
            .collect();
        let filled = fill_checksums(&text, &sums).unwrap();
        for sum in sums.values() {
            assert!(filled.contains(&format!("sha256: \"{sum}\"")));
        }
        assert!(!filled.contains(&"0".repeat(64)), "no placeholder left");
        assert_eq!(filled.lines().count(), text.lines().count());
    }

    #[test]
    fn an_archive_must_ship_the_plugin_and_its_completion_helper() {
        assert_eq!(
            lacking_executables("kubectl-tt-driver\nLICENSE\n"),
            ["kubectl_complete-tt-driver"]
        );
        assert!(
            lacking_executables("./kubectl-tt-driver\n./kubectl_complete-tt-driver\n").is_empty()
        );
        assert_eq!(
            lacking_executables("bin/kubectl-tt-driver\n").len(),
            2,
            "at the root only"
        );
    }

    #[test]
    fn the_manifest_installs_every_executable_on_every_platform() {
        let text = std::fs::read_to_string(crd::workspace_root().join(MANIFEST)).unwrap();
        let platforms = archive_names(&text).len();
        for exe in EXECUTABLES {
            let copied = text.matches(&format!("- from: {exe}\n")).count();
            assert_eq!(copied, platforms, "{exe} is not in every platform's files");
        }
    }
}
