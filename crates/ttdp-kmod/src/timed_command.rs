//! Running a helper program (git, make, a post-load validation command) with its output captured
//! and a hard timeout.

use std::io::{Read, Seek};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::KmodError;

/// How a finished (or killed) command ended.
#[derive(Debug)]
pub struct CommandRun {
    /// Whether it exited with status 0.
    pub success: bool,
    /// `exit status 2`, `killed by signal 9`...
    pub status: String,
    /// Its stdout and stderr, interleaved.
    pub log: String,
    /// Whether it was killed for running past the timeout.
    pub timed_out: bool,
    /// How long it ran.
    pub elapsed: Duration,
}

/// Runs `command` in its own process group, stdout and stderr captured together; after `timeout`
/// the whole group gets SIGKILL.
pub fn run_logged(
    mut command: Command,
    program: &str,
    timeout: Duration,
) -> Result<CommandRun, KmodError> {
    let spawn_error = |source| KmodError::Spawn {
        program: program.to_string(),
        source,
    };
    let mut log = tempfile::tempfile().map_err(spawn_error)?;
    let stdout = log.try_clone().map_err(spawn_error)?;
    let stderr = log.try_clone().map_err(spawn_error)?;
    command
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .env("LC_ALL", "C");
    let started = Instant::now();
    let mut child = command.spawn().map_err(spawn_error)?;
    let mut pause = Duration::from_millis(5);
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(spawn_error)? {
            break status;
        }
        if started.elapsed() >= timeout {
            timed_out = true;
            if let Ok(pid) = i32::try_from(child.id()) {
                // the group id is the child's pid (process_group(0)); make's compilers die with it
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            break child.wait().map_err(spawn_error)?;
        }
        std::thread::sleep(pause.min(timeout.saturating_sub(started.elapsed())));
        pause = (pause * 2).min(Duration::from_millis(100));
    };
    let mut bytes = Vec::new();
    log.rewind()
        .and_then(|()| log.read_to_end(&mut bytes))
        .map_err(spawn_error)?;
    Ok(CommandRun {
        success: status.success() && !timed_out,
        status: status.to_string(),
        log: String::from_utf8_lossy(&bytes).into_owned(),
        timed_out,
        elapsed: started.elapsed(),
    })
}

/// The last `lines` lines of a log, for error messages.
pub fn log_tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_status_are_captured() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let run = run_logged(cmd, "sh", Duration::from_secs(10)).unwrap();
        assert!(!run.success && !run.timed_out);
        assert!(run.status.contains('3'), "{}", run.status);
        assert!(
            run.log.contains("out") && run.log.contains("err"),
            "{}",
            run.log
        );
    }

    #[test]
    fn a_command_past_its_timeout_is_killed_with_its_children() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; sleep 30 & wait"]);
        let run = run_logged(cmd, "sh", Duration::from_millis(300)).unwrap();
        assert!(run.timed_out && !run.success);
        assert!(run.elapsed < Duration::from_secs(5), "{:?}", run.elapsed);
        assert!(run.log.contains("started"));
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        let err = run_logged(
            Command::new("/nonexistent/make"),
            "make",
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert_eq!(err.reason(), "ToolMissing");
        assert!(err.to_string().contains("install make"), "{err}");
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(log_tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(log_tail("a", 5), "a");
    }
}
