//! `kubectl_complete-tt-driver`: what kubectl (1.26 and later) runs to complete the arguments
//! of `kubectl tt driver` (installed as `kubectl_complete-tt_driver`, the same for krew's
//! `kubectl tt-driver`). It hands the words over to the plugin's `__complete`, so the answer
//! comes from the same code and the same cluster access as the plugin itself.
//!
//! The plugin is looked for next to this file (where `cargo install` and the release archive
//! put both; a symlink to this file is followed), then on PATH under both names kubectl runs it
//! by. It stays a separate, small executable because kubectl looks for completion under this
//! name and would otherwise need a second copy of the plugin.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The plugin's names: as built, and as krew links it.
const PLUGIN_NAMES: [&str; 2] = ["kubectl-tt-driver", "kubectl-tt_driver"];

/// The plugin executable: beside this file's real location, else on PATH.
fn plugin() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(PLUGIN_NAMES[0])))
        .filter(|p| p.is_file());
    beside.or_else(|| {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .flat_map(|dir| PLUGIN_NAMES.map(|name| dir.join(name)))
            .find(|p| p.is_file())
    })
}

fn main() -> ExitCode {
    let words: Vec<OsString> = std::env::args_os().skip(1).collect();
    let Some(plugin) = plugin() else {
        eprintln!("kubectl_complete-tt-driver: kubectl-tt-driver not found beside it or on PATH");
        // Cobra's "error" directive: the shell offers nothing.
        println!(":1");
        return ExitCode::SUCCESS;
    };
    let err = Command::new(&plugin).arg("__complete").args(words).exec();
    eprintln!(
        "kubectl_complete-tt-driver: cannot run {}: {err}",
        plugin.display()
    );
    println!(":1");
    ExitCode::SUCCESS
}
