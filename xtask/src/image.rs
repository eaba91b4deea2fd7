//! `cargo xtask image controller|agent [--tag TAG] [--push]`: builds the container images
//! from `deploy/docker/` with docker or podman.

use std::process::Command;

use anyhow::{Result, bail};

use crate::{crd, tools};

const REGISTRY: &str = "ghcr.io/tenstorrent";

pub fn run(args: &[String]) -> Result<()> {
    let usage = "usage: cargo xtask image controller|agent [--tag TAG] [--push]";
    let (mut which, mut tag, mut push) = (None, env!("CARGO_PKG_VERSION").to_owned(), false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "controller" | "agent" => which = Some(a.clone()),
            "--push" => push = true,
            "--tag" => match it.next() {
                Some(t) => tag = t.clone(),
                None => bail!("{usage}"),
            },
            _ => bail!("{usage}"),
        }
    }
    let Some(which) = which else { bail!("{usage}") };
    let (dockerfile, name) = match which.as_str() {
        "controller" => (
            "deploy/docker/controller.Dockerfile",
            "tt-k8s-driver-manager",
        ),
        _ => (
            "deploy/docker/agent.Dockerfile",
            "tt-k8s-driver-manager-builder",
        ),
    };
    let Some(engine) = tools::container_engine() else {
        bail!(
            "no container engine answers here: neither `docker info` nor `podman info` succeeds. \
             Start a Docker daemon or install podman, then run this again."
        );
    };
    let image = format!("{REGISTRY}/{name}:{tag}");
    let root = crd::workspace_root();
    tools::run(
        Command::new(engine)
            .args(["build", "-f", dockerfile, "-t", &image, "."])
            .current_dir(&root),
    )?;
    if push {
        tools::run(Command::new(engine).args(["push", &image]))?;
    }
    println!("built {image}");
    Ok(())
}
