//! `cargo xtask vm-test`: the real-kernel tests (owned by the VM harness work).

use anyhow::{Result, bail};

pub fn run(_args: &[String]) -> Result<()> {
    bail!("vm-test is not implemented yet")
}
