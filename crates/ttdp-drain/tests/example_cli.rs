//! The `drain` example program against the real control plane: kubectl's flags and output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::PathBuf;
use std::process::Output;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::json;
use support::Harness;

/// The example binary, built by `cargo test` next to the test binaries.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("examples").join("drain");
    assert!(
        path.exists(),
        "{} is missing: cargo test builds examples",
        path.display()
    );
    path
}

async fn run(h: &Harness, args: &[&str]) -> (bool, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = tokio::process::Command::new(example())
        .args(args)
        .arg("--kubeconfig")
        .arg(h.scratch.kubeconfig())
        .args(["--timeout", "20s"])
        .output()
        .await
        .unwrap();
    (
        status.success(),
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(stderr).unwrap(),
    )
}

#[tokio::test]
async fn prints_what_kubectl_drain_prints() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    let ds = h.owner("DaemonSet", "proxy").await;
    h.pod("n1", "web-1", rs).await;
    h.pod("n1", "proxy-n1", ds).await;
    h.pod("n1", "bare", json!({})).await;
    let (n1, ns) = (h.n("n1"), h.ns().to_owned());
    let nodes: Api<Node> = Api::all(h.admin.clone());

    let (ok, out, err) = run(&h, &[&n1, "--dry-run", "--ignore-daemonsets", "--force"]).await;
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            format!("node/{n1} cordoned (dry run)"),
            format!("evicting pod {ns}/bare (dry run)"),
            format!("evicting pod {ns}/web-1 (dry run)"),
            format!("node/{n1} drained (dry run)"),
        ],
        "{err}"
    );
    assert_ne!(
        nodes.get(&n1).await.unwrap().spec.unwrap().unschedulable,
        Some(true)
    );

    let (ok, out, err) = run(&h, &[&n1, "--ignore-daemonsets"]).await;
    assert!(!ok);
    assert_eq!(out.trim(), format!("node/{n1} cordoned"));
    assert!(
        err.contains(&format!(
            "error: unable to drain node \"{n1}\" due to error: [cannot delete Pods that declare no controller (use --force to override): {ns}/bare], continuing command..."
        )),
        "{err}"
    );

    let (ok, out, err) = run(&h, &[&n1, "--ignore-daemonsets", "--force"]).await;
    assert!(ok, "{out}\n{err}");
    let mut lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(format!("node/{n1} already cordoned").as_str())
    );
    assert_eq!(
        lines.last().copied(),
        Some(format!("node/{n1} drained").as_str())
    );
    lines.sort_unstable();
    let mut expected = vec![
        format!("evicting pod {ns}/bare"),
        format!("evicting pod {ns}/web-1"),
        format!("node/{n1} already cordoned"),
        format!("node/{n1} drained"),
        "pod/bare evicted".to_owned(),
        "pod/web-1 evicted".to_owned(),
    ];
    expected.sort_unstable();
    assert_eq!(lines, expected);
    assert!(
        err.contains(&format!(
            "Warning: deleting Pods that declare no controller: {ns}/bare"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "Warning: ignoring DaemonSet-managed Pods: {ns}/proxy-n1"
        )),
        "{err}"
    );

    let (ok, out, _) = run(&h, &[&n1, "--uncordon"]).await;
    assert!(ok);
    assert_eq!(out.trim(), format!("node/{n1} uncordoned"));
    assert_ne!(
        nodes.get(&n1).await.unwrap().spec.unwrap().unschedulable,
        Some(true)
    );
    h.shutdown().await;
}
