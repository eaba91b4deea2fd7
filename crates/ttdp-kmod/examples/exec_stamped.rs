//! Writes the wall clock, in microseconds since the epoch, to `STAMP_FILE`, then becomes
//! `PROGRAM` (an `execve` in the same process): the start of `PROGRAM` stamped as late as a
//! program outside it can. `cargo xtask bench` (scenario `agent-timing`) times the agent's start
//! to Ready from this stamp: a shell's own clock (busybox `adjtimex` piped into `awk`) costs
//! milliseconds after it reads the time, which would count as the agent's.
//!
//! ```text
//! exec_stamped STAMP_FILE PROGRAM [ARGS...]
//! ```

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};
use std::time::{SystemTime, UNIX_EPOCH};

const USAGE: &str = "usage: exec_stamped STAMP_FILE PROGRAM [ARGS...]";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(stamp_file), Some(program)) = (args.next(), args.next()) else {
        eprintln!("{USAGE}");
        return ExitCode::FAILURE;
    };
    let mut command = Command::new(&program);
    command.args(args);
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    if let Err(e) = std::fs::write(&stamp_file, format!("{micros}\n")) {
        eprintln!("exec_stamped: cannot write {}: {e}", stamp_file.display());
        return ExitCode::FAILURE;
    }
    let error = command.exec();
    eprintln!("exec_stamped: cannot run {}: {error}", program.display());
    ExitCode::FAILURE
}
