//! `cargo xtask release <version>`: bumps the workspace version, the path dependencies' versions,
//! the chart's version and appVersion; regenerates the CRD; builds both images and writes their
//! digests into the chart's default values (images by digest, never a moving tag); packages the
//! chart and checks that every image the packaged chart renders is one of the built digests;
//! and checks that the library crates would publish (`cargo publish --dry-run`).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::image::{self, Built, Which, oci::is_digest};
use crate::{chart::CHART_DIR, crd, tools};

/// The library crates published to crates.io.
const LIBRARIES: [&str; 6] = [
    "ttdp-selector",
    "ttdp-api",
    "ttdp-hostprobe",
    "ttdp-kmd-types",
    "ttdp-kmod",
    "ttdp-drain",
];

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

    // Regenerate with the new version compiled in, build the images, pin them in the chart.
    tools::run(
        Command::new("cargo")
            .args(["xtask", "crd"])
            .current_dir(&root),
    )?;
    let built = [
        image::build(Which::Agent, None)?,
        image::build(Which::Controller, None)?,
    ];
    pin_digests(&root, &built)?;
    // a new xtask binary: the chart is packaged with the new version compiled in
    tools::run(
        Command::new("cargo")
            .args(["xtask", "chart"])
            .current_dir(&root),
    )?;
    let packaged = root
        .join("target/chart")
        .join(format!("tt-k8s-driver-manager-{version}.tgz"));
    check_chart_images(&packaged, &built)?;
    let mut publish = Command::new("cargo");
    publish
        .args(["publish", "--dry-run", "--allow-dirty"])
        .current_dir(&root);
    for lib in LIBRARIES {
        publish.args(["-p", lib]);
    }
    tools::run(&mut publish)?;
    for b in &built {
        println!("release: {} image {}", b.which.name(), b.reference());
    }
    println!(
        "released {old} -> {version}: push the images (docs/images.md), review `git diff`, \
         commit, tag v{version}; pack each platform's kubectl-tt-driver and \
         kubectl_complete-tt-driver into the plugin archives and run `cargo xtask krew DIR`"
    );
    Ok(())
}

/// Writes each built image's digest into the chart's values.yaml.
fn pin_digests(root: &Path, built: &[Built]) -> Result<()> {
    let path = root.join(CHART_DIR).join("values.yaml");
    let mut text = std::fs::read_to_string(&path).context("reading values.yaml")?;
    for b in built {
        text = set_digest(&text, values_section(b.which), &b.archive.digest)?;
    }
    std::fs::write(&path, text).context("writing values.yaml")
}

/// The top-level values.yaml section holding an image's repository and digest.
fn values_section(which: Which) -> &'static str {
    match which {
        Which::Agent | Which::Builder(_) => "driver",
        Which::Controller => "image",
    }
}

/// `values` with the `digest:` line of the top-level `section` set to `digest`.
fn set_digest(values: &str, section: &str, digest: &str) -> Result<String> {
    if !is_digest(digest) {
        bail!("{digest:?} is not a sha256 digest");
    }
    let mut in_section = false;
    let mut replaced = false;
    let lines: Vec<String> = values
        .lines()
        .map(|line| {
            if !line.starts_with([' ', '#']) && !line.is_empty() {
                in_section = line.trim_end() == format!("{section}:");
            }
            if in_section && !replaced && line.starts_with("  digest:") {
                replaced = true;
                return format!("  digest: \"{digest}\"");
            }
            line.to_owned()
        })
        .collect();
    if !replaced {
        bail!("values.yaml has no `digest:` under `{section}:`");
    }
    Ok(lines.join("\n") + "\n")
}

/// Renders the packaged chart with its defaults and checks its images against the built ones.
fn check_chart_images(packaged: &Path, built: &[Built]) -> Result<()> {
    let helm = tools::kube_tool("helm")?;
    let out = Command::new(helm)
        .args(["template", "release-check"])
        .arg(packaged)
        .output()
        .context("running helm template")?;
    if !out.status.success() {
        bail!(
            "helm template {} failed: {}",
            packaged.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rendered = String::from_utf8_lossy(&out.stdout);
    let want: Vec<String> = built.iter().map(Built::reference).collect();
    check_rendered(&rendered, &want[1], &want[0])?;
    println!(
        "release: the packaged chart {} names the built images",
        packaged.display()
    );
    Ok(())
}

/// The controller container's image must be `controller` and the agents' default image
/// (`TTDP_DEFAULT_IMAGE`) `agent`; and no other image may appear.
fn check_rendered(rendered: &str, controller: &str, agent: &str) -> Result<()> {
    let images: Vec<&str> = rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .map(|i| i.trim_matches('"'))
        .collect();
    if images != [controller] {
        bail!("the chart's controller image is {images:?}, but the built one is {controller}");
    }
    let mut lines = rendered.lines();
    let default_image = lines
        .find(|l| l.trim() == "- name: TTDP_DEFAULT_IMAGE")
        .and_then(|_| lines.next())
        .and_then(|l| l.trim().strip_prefix("value: "))
        .map(|v| v.trim_matches('"'))
        .context("the chart renders no TTDP_DEFAULT_IMAGE")?;
    if default_image != agent {
        bail!("the chart's default agent image is {default_image}, but the built one is {agent}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn digests_go_under_their_own_section() {
        let values =
            "image:\n  repository: r\n  digest: \"\"\n\ndriver:\n  # note\n  digest: \"x\"\n";
        let v = set_digest(values, "driver", D2).unwrap();
        let v = set_digest(&v, "image", D1).unwrap();
        assert_eq!(
            v,
            format!(
                "image:\n  repository: r\n  digest: \"{D1}\"\n\ndriver:\n  # note\n  digest: \"{D2}\"\n"
            )
        );
        assert!(set_digest(values, "metrics", D1).is_err());
        assert!(set_digest(values, "image", "latest").is_err());
    }

    #[test]
    fn the_release_check_fails_on_any_other_image() {
        let render = |c: &str, a: &str| {
            format!(
                "      containers:\n        - name: controller\n          image: {c}\n          env:\n            - name: TTDP_DEFAULT_IMAGE\n              value: \"{a}\"\n"
            )
        };
        let (c, a) = (format!("r/c@{D1}"), format!("r/a@{D2}"));
        check_rendered(&render(&c, &a), &c, &a).unwrap();
        assert!(check_rendered(&render(&c, &a), &a, &c).is_err());
        assert!(check_rendered(&render("r/c:0.1.0", &a), &c, &a).is_err());
        assert!(check_rendered(&render(&c, "r/a:latest"), &c, &a).is_err());
        assert!(
            check_rendered("image: x\n", "x", &a).is_err(),
            "no default image rendered"
        );
    }

    /// The committed chart names images by real digests (what the last release built).
    #[test]
    fn the_chart_defaults_name_images_by_digest() {
        let root = crate::tools::repo_root().unwrap();
        let values = std::fs::read_to_string(root.join(CHART_DIR).join("values.yaml")).unwrap();
        for section in ["image", "driver"] {
            let mut in_section = false;
            let digest = values.lines().find_map(|l| {
                if !l.starts_with([' ', '#']) && !l.is_empty() {
                    in_section = l == format!("{section}:");
                }
                l.strip_prefix("  digest: ").filter(|_| in_section)
            });
            let digest = digest.unwrap().trim_matches('"');
            assert!(is_digest(digest), "{section}.digest {digest:?}");
            assert_ne!(
                digest,
                format!("sha256:{}", "0".repeat(64)),
                "{section}.digest is a placeholder"
            );
        }
    }
}
