//! `cargo xtask chart`: checks the generated CRD is current, lints the chart strictly and
//! packages it into `target/chart/`: the chart's version from `Chart.yaml` (the chart may change
//! between releases of the images), its appVersion from the workspace version.

use std::process::Command;

use anyhow::{Result, bail};

use crate::{crd, tools};

pub const CHART_DIR: &str = "deploy/helm/tt-k8s-driver-manager";

pub fn run(args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("usage: cargo xtask chart");
    }
    crd::run(&["--check".to_owned()])?;
    let root = crd::workspace_root();
    let helm = tools::kube_tool("helm")?;
    let version = env!("CARGO_PKG_VERSION");
    let chart = root.join(CHART_DIR);
    tools::run(Command::new(&helm).args(["lint", "--strict"]).arg(&chart))?;
    tools::run(
        Command::new(&helm)
            .arg("package")
            .arg(&chart)
            .args(["--app-version", version, "-d"])
            .arg(root.join("target/chart")),
    )?;
    Ok(())
}
