//! The control-plane launcher as a test run meets it: missing assets fail loudly with what to
//! provide, a started control plane serves the admin kubeconfig, and killing the process that
//! started it leaves no etcd or Kubernetes process behind; the API server's audit log holds the
//! requests of the audited identity and no one else's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ttdp_testkit::launcher::{ASSETS_ENV, Assets, ControlPlane, EXISTING_CLUSTER_ENV, LaunchError};
use ttdp_testkit::procs;

const LAUNCHER: &str = env!("CARGO_BIN_EXE_ttdp-control-plane");
const COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

#[test]
fn a_folder_without_the_binaries_names_what_is_missing() {
    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir(empty.path().join("bin")).unwrap();
    std::fs::write(empty.path().join("bin/etcd"), "").unwrap();
    let error = Assets::in_folder(empty.path()).unwrap_err();
    assert!(matches!(error, LaunchError::MissingAssets(_)), "{error:?}");
    let message = error.to_string();
    for missing in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        assert!(message.contains(missing), "{message}");
    }
    assert!(!message.contains("lacks etcd"), "{message}");
    assert!(
        message.contains(ASSETS_ENV),
        "says how to provide them: {message}"
    );
}

#[test]
fn missing_assets_fail_the_launch_and_say_how_to_provide_them() {
    let output = Command::new(LAUNCHER)
        .env(ASSETS_ENV, "/nonexistent/kube-assets")
        .env_remove(EXISTING_CLUSTER_ENV)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/nonexistent/kube-assets does not exist"),
        "{stderr}"
    );
    assert!(stderr.contains("../shared/kube"), "{stderr}");
    assert!(stderr.contains(EXISTING_CLUSTER_ENV), "{stderr}");
}

#[test]
fn a_killed_launcher_takes_its_control_plane_with_it() {
    let runs = tempfile::tempdir().unwrap();
    let mut launcher = Command::new(LAUNCHER)
        .arg("--runs")
        .arg(runs.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(launcher.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let kubeconfig = line.trim();
    assert!(Path::new(kubeconfig).is_file(), "printed {line:?}");
    let get = Command::new(kubectl())
        .args(["--kubeconfig", kubeconfig, "get", "--raw", "/readyz"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "ok");

    let children = children_of(launcher.id());
    let mut names: Vec<&str> = children.iter().map(|(_, name)| name.as_str()).collect();
    names.sort();
    assert_eq!(names, COMPONENTS.to_vec());

    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: Vec<_> = children
            .iter()
            .filter(|(pid, _)| procs::is_running(*pid))
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still running after SIGKILL: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_audit_log_counts_the_audited_identity_alone() {
    let assets = Assets::locate().unwrap();
    let runs = tempfile::tempdir().unwrap();
    let plane = ControlPlane::start(&assets, runs.path()).unwrap();
    let mut log = plane.audit_log();
    let run = |kubeconfig: &Path, args: &[&str]| {
        let out = Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    };
    let audited = plane.audited_kubeconfig();
    run(audited, &["create", "configmap", "counted"]);
    run(audited, &["get", "configmap", "counted"]);
    run(plane.kubeconfig(), &["create", "configmap", "not-counted"]);
    run(plane.kubeconfig(), &["get", "configmap", "not-counted"]);
    // A record is written once its request is answered: wait for the second one.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while seen.len() < 2 && Instant::now() < deadline {
        seen.extend(
            log.take()
                .unwrap()
                .into_iter()
                .filter(|r| r.resource == "configmaps"),
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The admin's requests were answered before the audited ones were seen; give any record
    // of them the same time again.
    std::thread::sleep(Duration::from_millis(500));
    seen.extend(
        log.take()
            .unwrap()
            .into_iter()
            .filter(|r| r.resource == "configmaps"),
    );
    let verbs: Vec<(&str, u16, bool)> = seen
        .iter()
        .map(|r| (r.verb.as_str(), r.code, r.is_write()))
        .collect();
    assert_eq!(verbs, [("create", 201, true), ("get", 200, false)]);
}

/// `(pid, component)` of every child of `parent`, the kernel's cut names mapped back to the
/// components' (`kube-controller` is kube-controller-manager).
fn children_of(parent: u32) -> Vec<(u32, String)> {
    procs::children_of(parent)
        .into_iter()
        .map(|(pid, comm)| {
            let name = COMPONENTS.into_iter().find(|c| c.starts_with(&comm));
            (pid, name.map_or(comm, str::to_owned))
        })
        .collect()
}

fn kubectl() -> String {
    std::env::var("TTDP_KUBECTL").unwrap_or_else(|_| {
        let ours = Path::new(&std::env::var("HOME").unwrap()).join(".local/ttdp-tools/bin/kubectl");
        if ours.is_file() {
            ours.display().to_string()
        } else {
            "kubectl".to_string()
        }
    })
}
