//! `cargo xtask bench`: the benchmarks (placeholder until they land).

use anyhow::{Result, bail};

pub fn run(_args: &[String]) -> Result<()> {
    bail!("the benchmarks are not implemented yet")
}
