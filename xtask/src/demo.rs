//! `cargo xtask demo`: the simulated-cluster demo (placeholder until the demo lands).

use anyhow::{Result, bail};

pub fn run(_args: &[String]) -> Result<()> {
    bail!("the demo is not implemented yet")
}
