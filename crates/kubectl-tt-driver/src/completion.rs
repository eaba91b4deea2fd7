//! Shell completion scripts (`completion bash|zsh|fish`), generated from the clap definition so
//! they never drift from the real flags.

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;

/// The executable name completions are registered for.
pub const BIN_NAME: &str = "kubectl-tt-driver";

/// Writes the completion script for `shell`.
pub fn write(shell: Shell, out: &mut impl Write) {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, BIN_NAME, out);
}
