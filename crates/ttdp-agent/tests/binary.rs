//! The real `ttdp-agent` binary as a child process, the way the testkit's simulated kubelets and
//! the VM tests run it: `TTDP_KERNEL=sim`, a temporary host root, `--report file:PATH`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Node, TT_SMI_CONTENT, TT_SMI_VERSION};
use ttdp_agent::reporting::ReportFile;
use ttdp_api::agent_report::AgentPhase;
use ttdp_api::names::labels;

const AGENT: &str = env!("CARGO_BIN_EXE_ttdp-agent");
const WAIT: Duration = Duration::from_secs(60);

/// A command for the agent with a clean environment (only PATH, for git, make and cc).
fn agent_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(AGENT);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// The environment of a simulated node's agent pod, reporting to `report`.
fn node_env(cmd: &mut Command, node: &Node, version: &str) {
    cmd.env("TT_KMD_VERSION", version)
        .env("NODE_NAME", "node-1")
        .env("TTDP_HOST_ROOT", node.host().dir())
        .env("TTDP_KERNEL", "sim")
        .env("TT_KMD_REPOSITORY", node.repo.url())
        .env("TT_SMI_VERSION", TT_SMI_VERSION)
        .env("TTDP_TT_SMI_PATH", &node.tt_smi)
        .env("TTDP_PROBE_PERIOD", "100ms")
        .env("TTDP_RETRY_INITIAL", "50ms")
        .env("TTDP_RETRY_MAX", "500ms")
        .env("TTDP_BUILD_JOBS", "2")
        .env("TTDP_BUILD_DIR", node.dir.path().join("work"))
        .env("TTDP_LOG_FORMAT", "json");
}

fn report_path(node: &Node) -> PathBuf {
    node.dir.path().join("report.json")
}

fn spawn_agent(node: &Node, version: &str) -> Child {
    let mut cmd = agent_command(&["run", "--report"]);
    cmd.arg(format!("file:{}", report_path(node).display()));
    node_env(&mut cmd, node, version);
    // logs go to files, not pipes: nobody reads a pipe while the agent runs, and a full one
    // would block it
    let log = std::fs::File::create(log_path(node)).unwrap();
    let errors = std::fs::File::create(node.dir.path().join("agent.stderr")).unwrap();
    cmd.stdout(log).stderr(errors).spawn().unwrap()
}

/// Where [`spawn_agent`] sends the agent's stdout (its logs).
fn log_path(node: &Node) -> PathBuf {
    node.dir.path().join("agent.log")
}

fn wait_for_report(
    path: &Path,
    what: &str,
    mut done: impl FnMut(&ReportFile) -> bool,
) -> ReportFile {
    let started = Instant::now();
    loop {
        if let Ok(file) = ReportFile::read(path)
            && done(&file)
        {
            return file;
        }
        assert!(started.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits for the child to exit within `limit`, returning its exit status.
fn wait_exit(mut child: Child, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            panic!("the agent did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn probe(node: &Node, version: &str) -> Output {
    agent_command(&["probe"])
        .env("TT_KMD_VERSION", version)
        .env("TTDP_HOST_ROOT", node.host().dir())
        .output()
        .unwrap()
}

#[test]
fn the_binary_installs_upgrades_reports_to_a_file_and_stops_on_sigterm() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    let path = report_path(&node);
    assert!(!probe(&node, "2.0.0").status.success());

    let child = spawn_agent(&node, "2.0.0");
    let file = wait_for_report(&path, "a Ready report", |f| {
        f.report
            .as_ref()
            .is_some_and(|r| r.phase == AgentPhase::Ready)
    });
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    assert_eq!(file.node, "node-1");
    assert_eq!(file.labels[labels::KMD_VERSION], "2.0.0");
    assert_eq!(file.labels[labels::INSTALL_MODE], "container");
    assert_eq!(file.labels[labels::TT_SMI_VERSION], TT_SMI_VERSION);
    assert!(file.events.iter().any(|e| e.reason == "ModuleReplaced"));
    assert_eq!(std::fs::read(node.host_tt_smi()).unwrap(), TT_SMI_CONTENT);

    let ready = probe(&node, "2.0.0");
    assert!(ready.status.success());
    assert!(String::from_utf8_lossy(&ready.stdout).contains("tenstorrent 2.0.0 is loaded"));

    sigterm(&child);
    let status = wait_exit(child, Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    assert_eq!(
        node.loaded().as_deref(),
        Some("2.0.0"),
        "never unloads on exit"
    );

    // structured logs: one JSON object per line, one line per step with its timings
    let stdout = std::fs::read_to_string(log_path(&node)).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not json ({e}): {l}")))
        .collect();
    let step = |name: &str| lines.iter().find(|l| l["step"] == name).cloned();
    let ensure = step("ensure-ko").expect("an ensure-ko line");
    assert_eq!(ensure["cache"], "miss");
    assert!(
        ensure["build_ms"].is_u64() && ensure["fetch_ms"].is_u64(),
        "{ensure}"
    );
    let swap = step("swap").expect("a swap line");
    assert!(swap["unload_ms"].is_u64() && swap["load_ms"].is_u64() && swap["total_ms"].is_u64());
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "shutting down; the loaded module stays loaded")
    );

    // a second run (a restarted pod) finds the target loaded: no build, no swap
    std::fs::remove_dir_all(node.repo.dir()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let child = spawn_agent(&node, "2.0.0");
    let again = wait_for_report(&path, "Ready again", |f| {
        f.report
            .as_ref()
            .is_some_and(|r| r.phase == AgentPhase::Ready)
    });
    assert!(
        again
            .events
            .iter()
            .all(|e| e.reason != "ModuleReplaced" && e.reason != "ModuleInstalled"),
        "{:?}",
        again.events
    );
    sigterm(&child);
    assert!(wait_exit(child, Duration::from_secs(10)).success());
}

#[test]
fn the_binary_waits_for_holders_without_crash_looping() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    node.kernel().hold(1234, "python3").unwrap();
    let path = report_path(&node);
    let mut child = spawn_agent(&node, "2.0.0");
    let file = wait_for_report(&path, "WaitingForHolders", |f| {
        f.report
            .as_ref()
            .is_some_and(|r| r.phase == AgentPhase::WaitingForHolders)
    });
    let report = file.report.unwrap();
    assert_eq!(
        report.holders_text().as_deref(),
        Some("held by pid 1234 (python3)")
    );
    assert!(
        file.events
            .iter()
            .any(|e| e.reason == "DeviceHeld" && e.note.contains("held by pid 1234 (python3)"))
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "still running");
    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));

    node.kernel().release(1234).unwrap();
    wait_for_report(&path, "Ready after the holder left", |f| {
        f.report
            .as_ref()
            .is_some_and(|r| r.phase == AgentPhase::Ready)
    });
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    sigterm(&child);
    assert!(wait_exit(child, Duration::from_secs(10)).success());
}

#[test]
fn sigterm_during_a_build_exits_promptly_with_the_old_module_loaded() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    node.slow_builds(30);
    let path = report_path(&node);
    let child = spawn_agent(&node, "2.0.0");
    wait_for_report(&path, "Building", |f| {
        f.report
            .as_ref()
            .is_some_and(|r| r.phase == AgentPhase::Building)
    });
    sigterm(&child);
    let status = wait_exit(child, Duration::from_secs(5));
    assert!(status.success(), "{status:?}");
    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));
}

#[test]
fn missing_or_malformed_settings_are_startup_errors_naming_the_variable() {
    let node = Node::new(&[]);
    // (variable the error must name, extra env, arguments)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a [&'a str]);
    let cases: Vec<Case> = vec![
        ("TT_KMD_VERSION", vec![], &["run"]),
        ("TT_KMD_VERSION", vec![("TT_KMD_VERSION", "v2")], &["run"]),
        (
            "TT_FORCE_UNLOAD",
            vec![("TT_FORCE_UNLOAD", "maybe")],
            &["run"],
        ),
        ("TTDP_KERNEL", vec![("TTDP_KERNEL", "qemu")], &["run"]),
        ("TTDP_REPORT", vec![("TTDP_REPORT", "stdout")], &["run"]),
        (
            "TTDP_PROBE_PERIOD",
            vec![("TTDP_PROBE_PERIOD", "soon")],
            &["run"],
        ),
        (
            "TT_SMI_VERSION",
            vec![("TT_SMI_VERSION", "3.0+local")],
            &["run"],
        ),
        ("NODE_NAME", vec![("NODE_NAME", "Node_1")], &["run"]),
        ("NODE_NAME", vec![("NODE_NAME", "")], &["run"]),
        ("TT_KMD_VERSION", vec![], &["probe"]),
    ];
    for (variable, env, args) in cases {
        let mut cmd = agent_command(args);
        cmd.env("TTDP_HOST_ROOT", node.host().dir());
        if variable != "TT_KMD_VERSION" {
            cmd.env("TT_KMD_VERSION", "2.0.0");
        }
        cmd.env("TTDP_REPORT", "none")
            .env("TTDP_TT_SMI_PATH", "none");
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let output = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{variable} {env:?}: {output:?}");
        assert!(stderr.contains(variable), "{variable} {env:?}: {stderr}");
    }

    // cross-field checks, done after parsing, still name the variable
    let mut kube_without_node = agent_command(&["run"]);
    kube_without_node
        .env("TT_KMD_VERSION", "2.0.0")
        .env("TTDP_HOST_ROOT", node.host().dir())
        .env("TTDP_TT_SMI_PATH", "none");
    let output = kube_without_node.output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("NODE_NAME is not set"));

    let mut no_smi_version = agent_command(&["run", "--report", "none"]);
    no_smi_version
        .env("TT_KMD_VERSION", "2.0.0")
        .env("TTDP_HOST_ROOT", node.host().dir())
        .env("TTDP_TT_SMI_PATH", &node.tt_smi);
    let output = no_smi_version.output().unwrap();
    assert!(String::from_utf8_lossy(&output.stderr).contains("TT_SMI_VERSION is not set"));

    let mut kube_without_pod = agent_command(&["run"]);
    kube_without_pod
        .env("TT_KMD_VERSION", "2.0.0")
        .env("NODE_NAME", "node-1")
        .env("TTDP_HOST_ROOT", node.host().dir())
        .env("TTDP_TT_SMI_PATH", "none");
    let output = kube_without_pod.output().unwrap();
    assert!(String::from_utf8_lossy(&output.stderr).contains("POD_NAME is not set"));
}

#[test]
fn a_host_root_without_proc_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let output = agent_command(&["--report", "none"])
        .env("TT_KMD_VERSION", "2.0.0")
        .env("TTDP_HOST_ROOT", dir.path())
        .env("TTDP_TT_SMI_PATH", "none")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&dir.path().display().to_string()) && stderr.contains("kernel release"),
        "{stderr}"
    );
}

#[test]
fn the_kernel_build_dir_flag_points_make_at_headers_mounted_elsewhere() {
    let node = Node::new(&["2.0.0"]);
    // the host's /lib/modules/<release>/build link is missing (headers mounted at another path)
    std::fs::remove_file(
        node.host()
            .path(format!("/lib/modules/{}/build", common::RELEASE)),
    )
    .unwrap();
    let path = report_path(&node);

    let child = spawn_agent(&node, "2.0.0");
    let failed = wait_for_report(&path, "HeadersMissing", |f| {
        f.report
            .as_ref()
            .is_some_and(|r| r.phase == AgentPhase::Failed)
    });
    assert_eq!(
        failed.report.unwrap().reason.as_deref(),
        Some("HeadersMissing")
    );
    sigterm(&child);
    assert!(wait_exit(child, Duration::from_secs(10)).success());
    std::fs::remove_file(&path).unwrap();

    let headers = node.host().dir().join("usr/src/linux-headers-{release}");
    let mut cmd = agent_command(&["run", "--report"]);
    cmd.arg(format!("file:{}", path.display()));
    node_env(&mut cmd, &node, "2.0.0");
    let child = cmd
        .env("TTDP_KERNEL_BUILD_DIR", &headers)
        .env("TTDP_MAKE_ARGS", "CC=cc")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_report(&path, "Ready with the headers found", |f| {
        f.report
            .as_ref()
            .is_some_and(|r| r.phase == AgentPhase::Ready)
    });
    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    sigterm(&child);
    assert!(wait_exit(child, Duration::from_secs(10)).success());
}

#[test]
fn an_image_without_tt_smi_runs_without_copying_or_labelling_it() {
    let node = Node::new(&["2.0.0"]);
    let path = report_path(&node);
    let mut cmd = agent_command(&["run", "--report"]);
    cmd.arg(format!("file:{}", path.display()));
    node_env(&mut cmd, &node, "2.0.0");
    let child = cmd
        .env_remove("TT_SMI_VERSION")
        .env("TTDP_TT_SMI_PATH", node.dir.path().join("no-tt-smi-here"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let file = wait_for_report(&path, "Ready", |f| {
        f.report
            .as_ref()
            .is_some_and(|r| r.phase == AgentPhase::Ready)
    });
    assert!(!file.labels.contains_key(labels::TT_SMI_VERSION));
    assert!(!node.host_tt_smi().exists());
    sigterm(&child);
    assert!(wait_exit(child, Duration::from_secs(10)).success());
}

/// An image whose environment says `TTDP_REPORT=none` (or `file:`) must not run in a pod: those
/// backends swap the driver without the controller's upgrade grant. Each sign of a pod (the
/// kubelet's `KUBERNETES_SERVICE_HOST`, the DaemonSet's downward-API `POD_NAME`) is enough.
#[test]
fn in_a_pod_the_agent_refuses_to_run_without_the_upgrade_grant() {
    let node = Node::new(&["1.0.0"]);
    let file_report = format!("file:{}", report_path(&node).display());
    for (pod_var, pod_value) in [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("POD_NAME", "ttdrv-fleet-abcde"),
    ] {
        for report in ["none", file_report.as_str()] {
            let mut cmd = agent_command(&["run"]);
            node_env(&mut cmd, &node, "1.0.0");
            cmd.env("TTDP_REPORT", report)
                .env(pod_var, pod_value)
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let child = cmd.spawn().unwrap();
            // before the check existed the agent ran on: bounded, so the test fails, not hangs
            let (status, stderr) = wait_exit_or_kill(child, Duration::from_secs(20));
            assert!(!status.success(), "{pod_var} {report}: {status:?}");
            assert!(
                stderr.contains("TTDP_REPORT")
                    && stderr.contains("upgrade grant")
                    && stderr.contains("the DaemonSet sets kube"),
                "{pod_var} {report}: {stderr}"
            );
        }
    }
    assert_eq!(node.loaded(), None, "nothing was loaded");
}

/// Waits at most `limit` for `child` to exit (killing it after), and returns its status and
/// stderr.
fn wait_exit_or_kill(mut child: Child, limit: Duration) -> (ExitStatus, String) {
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        use std::io::Read;
        pipe.read_to_string(&mut stderr).unwrap();
    }
    (status, stderr)
}

/// A proxy on loopback that answers every request with 403 and records its first line.
fn refusing_proxy() -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (seen, requests) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut first = String::new();
            if reader.read_line(&mut first).is_ok() {
                let _ = seen.send(first.trim().to_owned());
            }
            let _ = (&stream).write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
        }
    });
    (url, requests)
}

#[test]
fn the_source_clone_goes_through_the_proxy_the_pod_is_given() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    let (proxy, requests) = refusing_proxy();
    let mut cmd = agent_command(&["run", "--report"]);
    cmd.arg(format!("file:{}", report_path(&node).display()));
    node_env(&mut cmd, &node, "2.0.0");
    // A host nobody resolves: only the proxy can reach it, as on a network behind one.
    cmd.env(
        "TT_KMD_REPOSITORY",
        "https://git.example.internal/tenstorrent/tt-kmd.git",
    )
    .env("HTTPS_PROXY", &proxy)
    .env("https_proxy", &proxy)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let child = cmd.spawn().unwrap();
    let request = requests.recv_timeout(WAIT);
    sigterm(&child);
    let status = wait_exit(child, Duration::from_secs(10));
    assert_eq!(
        request.as_deref(),
        Ok("CONNECT git.example.internal:443 HTTP/1.1"),
        "git asked the proxy for the repository"
    );
    assert!(status.success(), "{status:?}");
    assert_eq!(
        node.loaded().as_deref(),
        Some("1.0.0"),
        "the working driver stays"
    );
}
