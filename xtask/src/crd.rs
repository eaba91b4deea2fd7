//! `cargo xtask crd`: writes the generated CRD into the Helm chart.

use anyhow::{Result, bail};

pub fn run(_args: &[String]) -> Result<()> {
    bail!("crd is not implemented yet")
}
