//! The README's main command, end to end: `ttdp-demo` with a small fleet runs the real
//! controller, agents and plugin, installs 2.7.0, upgrades to 2.8.0 and exits once the upgrade
//! is Ready. The report it writes must show the rollout a user expects: every managed node Done
//! at 2.8.0, the host-managed node untouched, plain nodes untouched, no node left cordoned.
//!
//! The controller, agent and plugin binaries come from the same target directory as this test;
//! when they are missing they are built with `cargo build --workspace --bins`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The demo's own limit for install plus upgrade.
const DEMO_TIMEOUT: &str = "100s";
/// The test's limit for the whole demo process (start and shutdown included).
const PROCESS_TIMEOUT: Duration = Duration::from_secs(150);
/// Limit for building missing binaries.
const BUILD_TIMEOUT: Duration = Duration::from_secs(1200);

const BINARIES: [&str; 3] = ["ttdp-controller", "ttdp-agent", "kubectl-tt-driver"];

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

fn nodes_of_kind<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    report["nodes"]
        .as_array()
        .expect("report.nodes is a list")
        .iter()
        .filter(|n| n["kind"] == kind)
        .collect()
}

#[test]
fn the_demo_installs_then_upgrades_a_small_fleet_node_by_node() {
    let binaries = other_binaries();
    let work = tempfile::tempdir().unwrap();
    let report_path = work.path().join("report.json");
    let child = Command::new(env!("CARGO_BIN_EXE_ttdp-demo"))
        .arg("--controller")
        .arg(&binaries[0])
        .arg("--agent")
        .arg(&binaries[1])
        .arg("--plugin")
        .arg(&binaries[2])
        .args([
            "--nodes",
            "4",
            "--plain-nodes",
            "1",
            "--speed",
            "0.05",
            "--max-unavailable",
            "1",
        ])
        .args(["--exit-after-rollout", "--plain", "--timeout", DEMO_TIMEOUT])
        .arg("--report")
        .arg(&report_path)
        .arg("--log-dir")
        .arg(work.path().join("logs"))
        .env_remove("TTDP_TEST_KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start ttdp-demo");
    let (output, finished) = wait_bounded(child, PROCESS_TIMEOUT);
    let stdout = String::from_utf8_lossy(&output.stdout);
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
    assert_eq!(report["success"], true, "{report:#}");
    assert_eq!(
        report["problems"].as_array().map(Vec::len),
        Some(0),
        "{report:#}"
    );

    let managed = nodes_of_kind(&report, "tenstorrent");
    assert_eq!(
        managed.len(),
        3,
        "4 Tenstorrent nodes, the last host-managed: {report:#}"
    );
    for node in &managed {
        assert_eq!(node["state"], "Done", "{node:#}");
        assert_eq!(node["statusVersion"], "2.8.0", "{node:#}");
        assert_eq!(node["kmdVersionLabel"], "2.8.0", "{node:#}");
        assert_eq!(node["installModeLabel"], "container", "{node:#}");
    }
    let host = nodes_of_kind(&report, "host-managed");
    assert_eq!(host.len(), 1, "{report:#}");
    assert_eq!(host[0]["state"], "HostManaged", "{:#}", host[0]);
    assert_eq!(host[0]["installModeLabel"], "host", "{:#}", host[0]);
    assert_eq!(
        host[0]["kmdVersionLabel"], "2.6.1",
        "the DKMS driver stays: {:#}",
        host[0]
    );
    let plain = nodes_of_kind(&report, "plain");
    assert_eq!(plain.len(), 1, "{report:#}");
    assert!(
        plain[0]["state"].is_null(),
        "a plain node is not in the policy: {:#}",
        plain[0]
    );
    assert!(
        plain[0]["kmdVersionLabel"].is_null() && plain[0]["installModeLabel"].is_null(),
        "{:#}",
        plain[0]
    );
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
    assert!(
        report["upgrade"]["perNode"]
            .as_object()
            .map(serde_json::Map::len)
            == Some(3),
        "each managed node went through the upgrade: {report:#}"
    );
    assert!(
        report["upgrade"]["maxInFlight"].as_u64() == Some(1),
        "maxUnavailable 1 upgrades one node at a time: {report:#}"
    );

    // What the user sees: transitions node by node, the plugin's table, the timings.
    assert!(
        stdout.contains("Draining"),
        "the upgrade drains nodes\n{context}"
    );
    assert!(
        stdout.contains("NODE") && stdout.contains("STATE"),
        "the plugin's table is shown\n{context}"
    );
    assert!(
        stdout.contains("Timings") && stdout.contains("total"),
        "timings are printed\n{context}"
    );
}
