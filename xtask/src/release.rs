//! `cargo xtask release <version>`: bumps the workspace version, the path dependencies' versions,
//! the chart's version and appVersion; regenerates the CRD; and checks that the library crates
//! would publish (`cargo publish --dry-run`).

use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{chart::CHART_DIR, crd, tools};

/// The library crates published to crates.io.
const LIBRARIES: [&str; 4] = ["ttdp-api", "ttdp-hostprobe", "ttdp-kmod", "ttdp-drain"];

pub fn run(args: &[String]) -> Result<()> {
    let [version] = args else {
        bail!("usage: cargo xtask release <version>   (e.g. 0.2.0)")
    };
    let ok = version.split('.').count() == 3
        && version
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if !ok {
        bail!("release version {version:?} must be MAJOR.MINOR.PATCH, e.g. 0.2.0");
    }
    let root = crd::workspace_root();
    let old = env!("CARGO_PKG_VERSION");

    let manifest = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).context("reading Cargo.toml")?;
    let text = text
        .replace(
            &format!("version = \"{old}\"\nedition"),
            &format!("version = \"{version}\"\nedition"),
        )
        .replace(
            &format!("version = \"{old}\" }}"),
            &format!("version = \"{version}\" }}"),
        );
    std::fs::write(&manifest, text).context("writing Cargo.toml")?;

    let chart = root.join(CHART_DIR).join("Chart.yaml");
    let text = std::fs::read_to_string(&chart).context("reading Chart.yaml")?;
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("version:") {
                format!("version: {version}")
            } else if l.starts_with("appVersion:") {
                format!("appVersion: \"{version}\"")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&chart, text + "\n").context("writing Chart.yaml")?;

    // Regenerate with the new version compiled in, then dry-run the publication.
    tools::run(
        Command::new("cargo")
            .args(["xtask", "crd"])
            .current_dir(&root),
    )?;
    let mut publish = Command::new("cargo");
    publish
        .args(["publish", "--dry-run", "--allow-dirty"])
        .current_dir(&root);
    for lib in LIBRARIES {
        publish.args(["-p", lib]);
    }
    tools::run(&mut publish)?;
    println!("released {old} -> {version}: review `git diff`, commit, tag v{version}");
    Ok(())
}
