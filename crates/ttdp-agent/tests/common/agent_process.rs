//! The real `ttdp-agent` binary run on a simulated node (`TTDP_KERNEL=sim`), as the kill suites
//! run it: started with a report file, waited on, killed by a test hook and started again.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ttdp_agent::reporting::ReportFile;

use super::Node;

pub const AGENT: &str = env!("CARGO_BIN_EXE_ttdp-agent");
pub const WAIT: Duration = Duration::from_secs(60);

pub fn report_path(node: &Node) -> PathBuf {
    node.dir.path().join("report.json")
}

/// The agent for target `version`, with the extra environment `env`, logging to `log`.
pub fn spawn_agent(node: &Node, version: &str, env: &[(&str, &str)], log: &str) -> Child {
    let mut cmd = Command::new(AGENT);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["run", "--report"])
        .arg(format!("file:{}", report_path(node).display()))
        .env("TT_KMD_VERSION", version)
        .env("NODE_NAME", "node-1")
        .env("TTDP_HOST_ROOT", node.host().dir())
        .env("TTDP_KERNEL", "sim")
        .env("TT_KMD_REPOSITORY", node.repo.url())
        .env("TTDP_TT_SMI_PATH", "none")
        .env("TTDP_PROBE_PERIOD", "100ms")
        .env("TTDP_RETRY_INITIAL", "50ms")
        .env("TTDP_RETRY_MAX", "500ms")
        .env("TTDP_BUILD_JOBS", "2")
        .env("TTDP_BUILD_DIR", node.dir.path().join("work"))
        .env("TTDP_LOG_FORMAT", "json")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    let out = std::fs::File::create(node.dir.path().join(log)).unwrap();
    cmd.stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// Waits until the report file satisfies `done`; panics with the file and the log after [`WAIT`].
pub fn wait_for(
    node: &Node,
    log: &str,
    what: &str,
    done: impl Fn(&ReportFile) -> bool,
) -> ReportFile {
    let started = Instant::now();
    loop {
        if let Ok(file) = ReportFile::read(&report_path(node))
            && done(&file)
        {
            return file;
        }
        if started.elapsed() > WAIT {
            let report = std::fs::read_to_string(report_path(node)).unwrap_or_default();
            let log = std::fs::read_to_string(node.dir.path().join(log)).unwrap_or_default();
            panic!(
                "timed out waiting for {what}; loaded {:?}\n--- report:\n{report}\n--- log:\n{log}",
                node.loaded()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for `child` to die of SIGKILL (the test hook) within [`WAIT`].
pub fn killed(mut child: Child, point: &str) {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.signal(), Some(9), "killed at {point}: {status:?}");
            return;
        }
        if started.elapsed() > WAIT {
            child.kill().unwrap();
            panic!("the agent never reached {point}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
