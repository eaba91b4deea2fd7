//! `cargo xtask`: project automation (CRD generation, chart and image builds, releases, the
//! real-kernel VM tests, the demo, the benchmarks and the source shape check).

mod bench;
mod chart;
mod crd;
mod demo;
mod image;
mod image_test;
mod krew;
mod node_test;
mod prebuild;
mod reference;
mod release;
mod shape;
mod tools;
mod vm;

use anyhow::{Result, bail};

const USAGE: &str = "usage: cargo xtask <command> [args]

commands:
  crd [--check]   generate the CRD YAML into the Helm chart (or fail if the committed one is stale)
  demo [FLAGS]    run the simulated-cluster demo (see `cargo xtask demo --help`)
  bench           run the benchmarks and check their targets
  chart           lint and package the Helm chart into target/chart/
  image agent|controller [--engine docker|podman|buildah]
                  build a container image (docker or podman if one answers, else buildah) into
                  the OCI archive <target>/image/<name>.oci.tar; prints its digest and sizes
  image-test      build both images and test them: commands inside them (buildah), the stub
                  module built by the agent image's toolchain, sizes against their budgets, the
                  controller image against the control plane TTDP_TEST_KUBECONFIG names
  node-test       the chart's controller on a real node (containerd, kubelet, kube-proxy beside a
                  control plane of its own, as root): helm install and helm upgrade --wait with
                  its readiness probe really running; nothing of the node left on the host
  release VERSION bump versions, regenerate, build both images, pin their digests in the
                  chart's values, package and check the chart, dry-run publishing the libraries
  krew DIR        fill the krew manifest's URIs and checksums from the release archives in DIR
  prebuild --kernel-headers DIR --version V [--out DIR] ...
                  build tt-kmd's .ko for the kernel of DIR, with its .sha256, into a tree a web
                  server serves as-is for spec.source.prebuilt (see `cargo xtask prebuild --help`)
  shape [--dir DIR]... [--max-file-lines N] [--max-fn-lines N]
                  fail on source files over 600 lines of code or functions over 80 lines
                  (default: the controller crate; tests aside)
  vm-test         boot a real Linux kernel under QEMU and run the real-kernel tests inside it";

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    match cmd.as_str() {
        "crd" => crd::run(&rest),
        "bench" => bench::run(&rest),
        "chart" => chart::run(&rest),
        "demo" => demo::run(&rest),
        "image" => image::run(&rest),
        "image-test" => image_test::run(&rest),
        "node-test" => node_test::run(&rest),
        "release" => release::run(&rest),
        "krew" => krew::run(&rest),
        "prebuild" => prebuild::run(&rest),
        "shape" => shape::run(&rest),
        "vm-test" => vm::run(&rest),
        "" | "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown xtask command {other:?}\n\n{USAGE}"),
    }
}
