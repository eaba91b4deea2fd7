//! The README's main command, end to end: `ttdp-demo` with a small fleet runs the real
//! controller, agents and plugin, installs 2.7.0, upgrades to 2.8.0 and exits once the upgrade
//! is Ready. The report it writes must show the rollout a user expects: every managed node Done
//! at 2.8.0, the host-managed node untouched, plain nodes untouched, no node left cordoned.
//!
//! Three ways to get a cluster, one test each: a real control plane the demo starts from the
//! assets (or, with `TTDP_TEST_KUBECONFIG`, that cluster through `--kubeconfig`); an existing
//! cluster through `--kubeconfig`, which the demo must leave as it found it; and, only when no
//! assets are at hand, the imitation, which the demo must announce. A missing control plane
//! fails the first two tests; it never turns them into runs on the imitation. A fourth test ends
//! the demo as a user does, with Ctrl-C at its prompt, and checks that it stops cleanly.
//!
//! The controller, agent and plugin binaries come from the same target directory as this test;
//! when they are missing they are built with `cargo build --workspace --bins`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde_json::Value;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_testkit::launcher::{ASSETS_ENV, EXISTING_CLUSTER_ENV};
use ttdp_testkit::procs::{children_of, is_running};
use ttdp_testkit::sim::SCENARIO_LABEL;

/// The demo's own limit for install plus upgrade.
const DEMO_TIMEOUT: &str = "150s";
/// The test's limit for the whole demo process (control plane, start and shutdown included).
const PROCESS_TIMEOUT: Duration = Duration::from_secs(300);
/// Limit for building missing binaries.
const BUILD_TIMEOUT: Duration = Duration::from_secs(1200);

const BINARIES: [&str; 3] = ["ttdp-controller", "ttdp-agent", "kubectl-tt-driver"];

/// One demo at a time: each runs a controller, agents and maybe a control plane on a few CPUs.
static ONE_DEMO: Mutex<()> = Mutex::new(());

/// `target/<profile>`, where cargo put the demo binary.
fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_ttdp-demo"))
        .parent()
        .expect("the demo binary has a directory")
        .to_path_buf()
}

/// Waits for `child` at most `limit`, killing it after; returns its output and whether it
/// finished in time.
fn wait_bounded(mut child: std::process::Child, limit: Duration) -> (Output, bool) {
    let start = Instant::now();
    let finished = loop {
        if child.try_wait().expect("waiting for a child").is_some() {
            break true;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (
        child
            .wait_with_output()
            .expect("collecting a child's output"),
        finished,
    )
}

/// The other binaries the demo drives, built when missing.
fn other_binaries() -> Vec<PathBuf> {
    let dir = bin_dir();
    let paths: Vec<PathBuf> = BINARIES.iter().map(|b| dir.join(b)).collect();
    if paths.iter().all(|p| p.is_file()) {
        return paths;
    }
    let target = dir.parent().expect("the profile directory has a parent");
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    build
        .args(["build", "--workspace", "--bins"])
        .env("CARGO_TARGET_DIR", target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let (output, finished) = wait_bounded(build.spawn().expect("cannot run cargo"), BUILD_TIMEOUT);
    assert!(
        finished && output.status.success(),
        "the demo needs {BINARIES:?} in {}; `cargo build --workspace --bins` failed{}:\n{}",
        dir.display(),
        if finished { "" } else { " (timed out)" },
        String::from_utf8_lossy(&output.stderr)
    );
    for path in &paths {
        assert!(
            path.is_file(),
            "{} is still missing after building the workspace",
            path.display()
        );
    }
    paths
}

/// `ttdp-demo` with the controller, agent and plugin binaries it drives.
fn demo_command() -> Command {
    let binaries = other_binaries();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ttdp-demo"));
    command
        .arg("--controller")
        .arg(&binaries[0])
        .arg("--agent")
        .arg(&binaries[1])
        .arg("--plugin")
        .arg(&binaries[2]);
    command
}

fn nodes_of_kind<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    report["nodes"]
        .as_array()
        .expect("report.nodes is a list")
        .iter()
        .filter(|n| n["kind"] == kind)
        .collect()
}

/// What one demo run left: its output, its report and the first line of stdout.
struct Run {
    stdout: String,
    context: String,
    report: Value,
}

/// Runs the demo with `tenstorrent` + `plain` nodes, `args` and `env`, and asserts it succeeded.
fn run_demo(tenstorrent: u16, plain: u16, args: &[&str], env: &[(&str, &str)]) -> Run {
    let _one = ONE_DEMO
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let work = tempfile::tempdir().unwrap();
    let report_path = work.path().join("report.json");
    let mut command = demo_command();
    command
        .args(["--nodes", &tenstorrent.to_string()])
        .args(["--plain-nodes", &plain.to_string()])
        .args(["--speed", "0.05", "--max-unavailable", "1"])
        .args(["--exit-after-rollout", "--plain", "--timeout", DEMO_TIMEOUT])
        .arg("--report")
        .arg(&report_path)
        .arg("--log-dir")
        .arg(work.path().join("logs"))
        .args(args)
        .env_remove(EXISTING_CLUSTER_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let child = command.spawn().expect("cannot start ttdp-demo");
    let (output, finished) = wait_bounded(child, PROCESS_TIMEOUT);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let context = format!("--- stdout\n{stdout}\n--- stderr\n{stderr}");
    assert!(
        finished,
        "the demo did not exit within {PROCESS_TIMEOUT:?}\n{context}"
    );
    assert!(
        output.status.success(),
        "the demo failed ({})\n{context}",
        output.status
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(&report_path).expect("the demo writes its report"))
            .expect("the report is JSON");
    Run {
        stdout,
        context,
        report,
    }
}

/// The checks every successful run must pass: `managed` nodes Done at 2.8.0, the host-managed
/// node untouched, plain nodes untouched, nothing left cordoned, workloads evicted exactly on
/// upgraded nodes, and what the user sees printed.
fn check_rollout(run: &Run, managed_nodes: usize, plain_nodes: usize) {
    let report = &run.report;
    assert_eq!(report["success"], true, "{report:#}");
    assert_eq!(
        report["problems"].as_array().map(Vec::len),
        Some(0),
        "{report:#}"
    );
    let managed = nodes_of_kind(report, "tenstorrent");
    assert_eq!(
        managed.len(),
        managed_nodes,
        "the last Tenstorrent node is host-managed: {report:#}"
    );
    for node in &managed {
        assert_eq!(node["state"], "Done", "{node:#}");
        assert_eq!(node["statusVersion"], "2.8.0", "{node:#}");
        assert_eq!(node["kmdVersionLabel"], "2.8.0", "{node:#}");
        assert_eq!(node["installModeLabel"], "container", "{node:#}");
    }
    let host = nodes_of_kind(report, "host-managed");
    assert_eq!(host.len(), 1, "{report:#}");
    assert_eq!(host[0]["state"], "HostManaged", "{:#}", host[0]);
    assert_eq!(host[0]["installModeLabel"], "host", "{:#}", host[0]);
    assert_eq!(
        host[0]["kmdVersionLabel"], "2.6.1",
        "the DKMS driver stays: {:#}",
        host[0]
    );
    let plain = nodes_of_kind(report, "plain");
    assert_eq!(plain.len(), plain_nodes, "{report:#}");
    for node in &plain {
        assert!(
            node["state"].is_null(),
            "a plain node is not in the policy: {node:#}"
        );
        assert!(
            node["kmdVersionLabel"].is_null() && node["installModeLabel"].is_null(),
            "{node:#}"
        );
    }
    for node in report["nodes"].as_array().unwrap() {
        assert_eq!(
            node["cordoned"], false,
            "no node is left cordoned: {node:#}"
        );
        assert!(node["cordonedBy"].is_null(), "{node:#}");
    }
    for workload in report["workloads"].as_array().unwrap() {
        assert_ne!(
            workload["running"], workload["expectedEvicted"],
            "{workload:#}"
        );
    }
    assert_eq!(
        report["upgrade"]["perNode"]
            .as_object()
            .map(serde_json::Map::len),
        Some(managed_nodes),
        "each managed node went through the upgrade: {report:#}"
    );
    assert_eq!(
        report["upgrade"]["maxInFlight"].as_u64(),
        Some(1),
        "maxUnavailable 1 upgrades one node at a time: {report:#}"
    );
    let context = &run.context;
    assert!(
        run.stdout.contains("Draining"),
        "the upgrade drains nodes\n{context}"
    );
    assert!(
        run.stdout.contains("NODE") && run.stdout.contains("STATE"),
        "the plugin's table is shown\n{context}"
    );
    assert!(
        run.stdout.contains("Timings") && run.stdout.contains("total"),
        "timings are printed\n{context}"
    );
}

#[test]
fn the_demo_upgrades_a_small_fleet_node_by_node_on_a_real_control_plane() {
    // The suites' cluster when one is named (a disposable cluster, or a control plane kept up for
    // the session), else a control plane the demo starts itself from the assets.
    let existing = std::env::var(EXISTING_CLUSTER_ENV).ok();
    let args: Vec<&str> = match &existing {
        Some(path) => vec!["--kubeconfig", path],
        None => Vec::new(),
    };
    let run = run_demo(4, 1, &args, &[]);
    let expected = if existing.is_some() {
        "existing"
    } else {
        "launched"
    };
    assert_eq!(
        run.report["cluster"], expected,
        "the demo must run on a real control plane; provide the assets (../shared/kube or {ASSETS_ENV})\n{}",
        run.context
    );
    let first = run.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("cluster: a real control plane")
            || first.starts_with("cluster: the existing cluster"),
        "the first line says which cluster: {first}"
    );
    check_rollout(&run, 3, 1);
}

#[test]
fn with_kubeconfig_the_demo_joins_an_existing_cluster_and_removes_what_it_created() {
    let kubeconfig = ttdp_testkit::launcher::test_kubeconfig();
    let path = kubeconfig.display().to_string();
    let run = run_demo(3, 1, &["--kubeconfig", &path], &[]);
    assert_eq!(run.report["cluster"], "existing", "{}", run.context);
    check_rollout(&run, 2, 1);
    // On a shared cluster the policy is named after the demo's random prefix, which labels its
    // nodes too.
    let prefix = run.report["policy"].as_str().unwrap().to_owned();
    assert!(prefix.starts_with("demo-"), "{prefix}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = ttdp_testkit::sim::cluster::client_for(&kubeconfig)
            .await
            .unwrap();
        let nodes: Api<Node> = Api::all(client.clone());
        let left = nodes
            .list(&ListParams::default().labels(&format!("{SCENARIO_LABEL}={prefix}")))
            .await
            .unwrap();
        assert!(
            left.items.is_empty(),
            "the demo's nodes are deleted: {:?}",
            left.items
        );
        let policies: Api<TenstorrentDriverPolicy> = Api::all(client);
        assert!(
            policies.get_opt(&prefix).await.unwrap().is_none(),
            "the demo's policy is deleted"
        );
    });
}

#[test]
fn without_a_control_plane_the_demo_says_first_that_it_falls_back_to_the_imitation() {
    let missing = std::env::temp_dir().join("ttdp-demo-test-no-such-assets");
    let run = run_demo(4, 1, &[], &[(ASSETS_ENV, missing.to_str().unwrap())]);
    assert_eq!(run.report["cluster"], "imitation", "{}", run.context);
    let first = run.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("cluster: NO real control plane") && first.contains("does not exist"),
        "the first line says why: {first}"
    );
    assert!(
        run.stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("IMITATION")),
        "the second line says what runs instead\n{}",
        run.context
    );
    check_rollout(&run, 3, 1);
}

/// A user's Ctrl-C at the end, as a terminal sends it: SIGINT to the demo's whole process group.
/// The demo must stop in order (nothing it cannot clean up, exit 0) and take the control plane it
/// started with it; the control plane must not have been stopped under it by the same signal.
/// Without the assets, the suites' cluster through `--kubeconfig`, where the demo deletes what
/// it created.
#[test]
fn ctrl_c_at_the_end_stops_the_demo_and_the_control_plane_it_started() {
    use std::os::unix::process::CommandExt;

    let _one = ONE_DEMO
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let existing = ttdp_testkit::launcher::Assets::locate()
        .err()
        .map(|missing| {
            ttdp_testkit::launcher::try_test_kubeconfig().unwrap_or_else(|e| {
                panic!("no control-plane assets ({missing}) and no cluster: {e}")
            })
        });
    let cluster_args: Vec<String> = existing
        .iter()
        .flat_map(|path| ["--kubeconfig".to_owned(), path.display().to_string()])
        .collect();
    let work = tempfile::tempdir().unwrap();
    let mut child = demo_command()
        .args(&cluster_args)
        .args(["--nodes", "2", "--plain-nodes", "1", "--speed", "0.05"])
        .args(["--plain", "--timeout", DEMO_TIMEOUT])
        .arg("--log-dir")
        .arg(work.path().join("logs"))
        .env_remove(EXISTING_CLUSTER_ENV)
        // The terminal's foreground group, which Ctrl-C signals as a whole.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start ttdp-demo");
    let group = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    // Whatever happens below, the demo's group does not outlive the test.
    let _group_guard = KillGroupOnDrop(group);
    let lines = stdout_lines(child.stdout.take().unwrap());
    let mut seen = String::new();
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    while !seen.contains("until Ctrl-C") {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => seen.push_str(&line),
            Err(_) => panic!("the demo never waited for Ctrl-C:\n{seen}"),
        }
    }
    let first_line = match existing {
        Some(_) => "cluster: the existing cluster",
        None => "cluster: a real control plane started for the demo",
    };
    assert!(seen.starts_with(first_line), "{seen}");
    let plane = component_pids(child.id());
    assert_eq!(
        plane.len(),
        if existing.is_some() { 0 } else { 4 },
        "etcd, API server, controller manager, scheduler: {plane:?}"
    );

    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGINT).unwrap();
    let (output, finished) = wait_bounded(child, Duration::from_secs(90));
    // The rest of stdout: the reader ends when the pipe closes, soon after the demo exits.
    let mut rest = String::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        rest.push_str(&line);
    }
    let context = format!(
        "--- stdout\n{seen}{rest}\n--- stderr\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        finished,
        "the demo did not stop within 90 s of Ctrl-C\n{context}"
    );
    assert!(
        output.status.success(),
        "Ctrl-C ends the demo with success ({})\n{context}",
        output.status
    );
    assert!(rest.contains("stopped."), "{context}");
    assert!(
        !context.contains("warning:"),
        "everything stops cleanly\n{context}"
    );
    let alive: Vec<_> = plane.iter().filter(|pid| is_running(**pid)).collect();
    assert!(
        alive.is_empty(),
        "the control plane is stopped: {alive:?} still run\n{context}"
    );
}

/// Kills a process group when dropped.
struct KillGroupOnDrop(nix::unistd::Pid);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(self.0, nix::sys::signal::Signal::SIGKILL);
    }
}

/// The lines of `stdout` as they come, from a thread that reads until it closes.
fn stdout_lines(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if send.send(line + "\n").is_err() {
                return;
            }
        }
    });
    receive
}

/// The processes of the control plane `parent` started (its children named like them).
fn component_pids(parent: u32) -> Vec<u32> {
    let names = [
        "etcd",
        "kube-apiserver",
        "kube-controller",
        "kube-scheduler",
    ];
    children_of(parent)
        .into_iter()
        .filter(|(_, name)| names.contains(&name.as_str()))
        .map(|(pid, _)| pid)
        .collect()
}
