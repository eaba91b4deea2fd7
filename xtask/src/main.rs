//! `cargo xtask`: project automation (CRD generation, chart and image builds, releases, the
//! real-kernel VM tests, the demo and the benchmarks).

mod crd;
mod vm_test;

use anyhow::{Result, bail};

const USAGE: &str = "usage: cargo xtask <command> [args]

commands:
  crd [--check]   generate the CRD YAML into the Helm chart (or fail if the committed one is stale)
  vm-test         boot a real Linux kernel under QEMU and run the real-kernel tests inside it";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    match cmd.as_str() {
        "crd" => crd::run(&rest),
        "vm-test" => vm_test::run(&rest),
        "" | "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown xtask command {other:?}\n\n{USAGE}"),
    }
}
