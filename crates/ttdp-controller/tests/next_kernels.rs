//! What the agents report about the kernels their nodes could boot into, their start loads and
//! their modules' signers, shown by the controller, on the real control plane: the nodes'
//! status entries (`nextKernels`, `startLoad`, `moduleSigner`), the policy's `KernelsReady`
//! condition, the metrics endpoint (`ttdp_nodes_kernel_not_ready`,
//! `ttdp_agent_start_ready_seconds`) and the plugin's `describe` and `status` output.
//!
//! The simulated agents run the real agent, whose hosts have one kernel; each node's report of
//! its other kernels is written onto its agent pod's report annotation as the agent would write
//! it (the agent publishes its report only when its own view changes, and the writes here are
//! repeated until the controller has taken them up).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use harness::{Harness, STEP, agent_pods, condition, http_get_body, node_entry, tt_node};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::agent_report::{AgentReport, KernelModuleState, KernelReadiness, StartLoad};
use ttdp_api::driver::v1alpha1::{NextKernelState, NodeStartLoad};
use ttdp_api::names::annotations;
use ttdp_controller::server::{self, Readiness};

const BUILD_FAILED: &str = "make modules failed against linux-headers-6.1.0-58-amd64: implicit declaration of function 'pci_enable_msi'";
const SIGNER: &str = "ttdp test signing key";

fn kernel(release: &str, state: KernelModuleState) -> KernelReadiness {
    let failed = state == KernelModuleState::Failed;
    KernelReadiness {
        release: release.into(),
        state,
        reason: failed.then(|| "BuildFailed".into()),
        message: failed.then(|| BUILD_FAILED.into()),
    }
}

/// What a node's agent reports besides its own flow's facts.
#[derive(Clone)]
struct KernelReport {
    installed: Vec<KernelReadiness>,
    start_load: Option<StartLoad>,
    signer: Option<String>,
}

impl KernelReport {
    fn kernels(installed: Vec<KernelReadiness>) -> Self {
        Self {
            installed,
            start_load: None,
            signer: None,
        }
    }

    fn apply(&self, r: &mut AgentReport) {
        r.installed_kernels = self.installed.clone();
        r.start_load = self.start_load;
        r.module_signer = self.signer.clone();
    }
}

/// Writes `report` into the report on `node`'s agent pod, unless it says so already.
async fn report_as_agent(h: &Harness, policy: &str, node: &str, report: &KernelReport) {
    let pod = agent_pods(h, policy)
        .await
        .remove(node)
        .unwrap_or_else(|| panic!("no agent pod on {node}"));
    let text = pod
        .annotations()
        .get(annotations::AGENT_REPORT)
        .cloned()
        .unwrap_or_else(|| panic!("the agent on {node} has not reported yet"));
    let mut current: AgentReport = serde_json::from_str(&text).unwrap();
    let before = current.clone();
    report.apply(&mut current);
    if current == before {
        return;
    }
    let patch = json!({"metadata": {"annotations": {
        annotations::AGENT_REPORT: serde_json::to_string(&current).unwrap(),
    }}});
    Api::<Pod>::namespaced(h.client.clone(), &h.namespace)
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

/// Keeps each node's report at what `reports` say until the policy satisfies `check`.
async fn report_until(
    h: &Harness,
    policy: &str,
    reports: &[(&str, KernelReport)],
    what: &str,
    check: impl Fn(&TenstorrentDriverPolicy) -> bool,
) -> TenstorrentDriverPolicy {
    let start = Instant::now();
    loop {
        for (node, report) in reports {
            report_as_agent(h, policy, node, report).await;
        }
        let p = h.policies().get(policy).await.unwrap();
        if check(&p) {
            return p;
        }
        assert!(
            start.elapsed() < STEP,
            "timed out waiting for {what}; last status: {}",
            serde_json::to_string_pretty(&p.status).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn kernels_condition(p: &TenstorrentDriverPolicy) -> (String, String, String) {
    condition(p, "KernelsReady").unwrap_or_default()
}

/// The controller's `/metrics` text.
fn scrape(address: SocketAddr) -> String {
    http_get_body(address, "/metrics").expect("the metrics endpoint answers")
}

/// Waits until the metrics text has every line of `lines`.
async fn wait_metrics(address: SocketAddr, lines: &[String]) -> String {
    let start = Instant::now();
    loop {
        let text = scrape(address);
        if lines.iter().all(|l| text.lines().any(|t| t == l)) {
            return text;
        }
        assert!(
            start.elapsed() < STEP,
            "metrics never showed {lines:#?}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The plugin binary cargo built beside this test (built once if missing).
fn plugin_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let path = bin_dir.join("kubectl-tt-driver");
    if !path.is_file() {
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "build",
                "-p",
                "kubectl-tt-driver",
                "--bin",
                "kubectl-tt-driver",
            ])
            .env("CARGO_TARGET_DIR", bin_dir.parent().unwrap())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(status.success(), "building kubectl-tt-driver failed");
    }
    path
}

/// The plugin's output for `args` against the scenario's cluster.
fn plugin(h: &Harness, args: &[&str]) -> String {
    let out = Command::new(plugin_binary())
        .args(args)
        .arg("--kubeconfig")
        .arg(h.cluster.kubeconfig_path())
        .env("COLUMNS", "300")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl-tt-driver {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn line_with<'a>(text: &'a str, words: &[&str]) -> &'a str {
    text.lines()
        .find(|l| words.iter().all(|w| l.contains(w)))
        .unwrap_or_else(|| panic!("no line with {words:?} in\n{text}"))
}

/// Three nodes report their other kernels Ready, Failed and Pending: the status, the condition
/// (naming the failed and the pending kernel), the metrics and the plugin say so; the condition
/// turns True when the last failing node reports its kernel Ready, and each agent start load is
/// observed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernels_the_agents_prepare_show_in_status_condition_metrics_and_plugin() {
    let h = Harness::start(|p| (0..3).map(|_| tt_node(p).loaded("2.8.0")).collect()).await;
    let stop_serving = CancellationToken::new();
    let (metrics, _serving) = server::serve(
        "127.0.0.1:0".parse().unwrap(),
        h.metrics.clone(),
        Readiness::default(),
        stop_serving.clone(),
    )
    .await
    .unwrap();
    let policy = h.create_policy("fleet", "2.8.0", json!({})).await;
    let nodes = h.nodes();
    let (ready, failing, pending) = (&nodes[0], &nodes[1], &nodes[2]);
    let p = h.wait_ready(&policy, STEP).await;
    assert_eq!(
        kernels_condition(&p),
        (
            "True".into(),
            "NextKernelsReady".into(),
            "no node reports a kernel installed besides the running one".into()
        )
    );

    let hit = StartLoad {
        cache_hit: true,
        ready_after_ms: 2300,
    };
    let miss = StartLoad {
        cache_hit: false,
        ready_after_ms: 95_000,
    };
    let mut reports = vec![
        (
            ready.as_str(),
            KernelReport {
                installed: vec![kernel("6.1.0-60-amd64", KernelModuleState::Ready)],
                start_load: Some(hit),
                signer: Some(SIGNER.into()),
            },
        ),
        (
            failing.as_str(),
            KernelReport {
                start_load: Some(miss),
                ..KernelReport::kernels(vec![kernel("6.1.0-58-amd64", KernelModuleState::Failed)])
            },
        ),
        (
            pending.as_str(),
            KernelReport::kernels(vec![
                kernel("6.1.0-61-amd64", KernelModuleState::Pending),
                kernel("6.1.0-60-amd64", KernelModuleState::Ready),
            ]),
        ),
    ];
    let expected = format!(
        "2 nodes would boot without tt-kmd 2.8.0: kernel 6.1.0-58-amd64 on {failing} ({BUILD_FAILED}); kernel 6.1.0-61-amd64 on {pending} (being prepared)"
    );
    let p = report_until(&h, &policy, &reports, "KernelsReady=False", |p| {
        kernels_condition(p).2 == expected
    })
    .await;
    let (status, reason, _) = kernels_condition(&p);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NextKernelWithoutDriver")
    );

    // Each node's entry: the kernels without a module listed, the ready ones counted.
    let entry = node_entry(&p, ready).unwrap();
    let kernels = entry.next_kernels.as_ref().unwrap();
    assert_eq!(
        (kernels.ready, kernels.not_ready.len()),
        (1, 0),
        "{entry:?}"
    );
    assert_eq!(entry.module_signer.as_deref(), Some(SIGNER));
    assert_eq!(
        entry.start_load,
        Some(NodeStartLoad {
            cache_hit: true,
            ready_after_ms: 2300
        })
    );
    let entry = node_entry(&p, failing).unwrap();
    let kernels = entry.next_kernels.as_ref().unwrap();
    assert_eq!(kernels.ready, 0);
    let listed = &kernels.not_ready[0];
    assert_eq!(
        (
            listed.release.as_str(),
            listed.state,
            listed.reason.as_deref(),
            listed.message.as_deref()
        ),
        (
            "6.1.0-58-amd64",
            NextKernelState::Failed,
            Some("BuildFailed"),
            Some(BUILD_FAILED)
        )
    );
    assert_eq!(entry.module_signer, None);
    let entry = node_entry(&p, pending).unwrap();
    let kernels = entry.next_kernels.as_ref().unwrap();
    assert_eq!(kernels.ready, 1);
    assert_eq!(kernels.not_ready[0].state, NextKernelState::Pending);
    assert_eq!(entry.start_load, None);

    // The metrics endpoint: one node with a failed kernel, one with a pending one; each start
    // load observed once.
    let gauge = |state: &str, n: u32| {
        format!(r#"ttdp_nodes_kernel_not_ready{{policy="{policy}",state="{state}"}} {n}"#)
    };
    let starts = |cache: &str, n: u32| {
        format!(r#"ttdp_agent_start_ready_seconds_count{{cache="{cache}"}} {n}"#)
    };
    let text = wait_metrics(
        metrics,
        &[
            gauge("Failed", 1),
            gauge("Pending", 1),
            starts("hit", 1),
            starts("miss", 1),
        ],
    )
    .await;
    assert!(
        text.contains(r#"ttdp_agent_start_ready_seconds_sum{cache="hit"} 2.3"#),
        "{text}"
    );

    // The plugin: describe's node table and its list of kernels without a module, and the
    // status summary's condition line.
    let page = plugin(&h, &["describe", &policy]);
    let header = line_with(&page, &["NODE", "STATE"]);
    assert!(
        header.contains("NEXT-KERNELS") && header.contains("SIGNER"),
        "{page}"
    );
    assert!(
        line_with(&page, &[ready.as_str(), "1 ready"]).contains(SIGNER),
        "{page}"
    );
    line_with(
        &page,
        &[failing.as_str(), "6.1.0-58-amd64 BuildFailed; 0 ready"],
    );
    line_with(
        &page,
        &[pending.as_str(), "6.1.0-61-amd64 Pending; 1 ready"],
    );
    line_with(
        &page,
        &[
            format!("{failing}: kernel 6.1.0-58-amd64 Failed (BuildFailed): {BUILD_FAILED}")
                .as_str(),
        ],
    );
    let summary = plugin(&h, &["status"]);
    line_with(
        &summary,
        &[format!("KernelsReady=False (NextKernelWithoutDriver): {expected}").as_str()],
    );

    // The pending kernel gets its module; then the failed one does too.
    reports[2].1 = KernelReport::kernels(vec![
        kernel("6.1.0-61-amd64", KernelModuleState::Ready),
        kernel("6.1.0-60-amd64", KernelModuleState::Ready),
    ]);
    let only_failing = format!(
        "1 node would boot without tt-kmd 2.8.0: kernel 6.1.0-58-amd64 on {failing} ({BUILD_FAILED})"
    );
    report_until(&h, &policy, &reports, "only the failed kernel named", |p| {
        kernels_condition(p).2 == only_failing
    })
    .await;
    reports[1].1.installed = vec![kernel("6.1.0-58-amd64", KernelModuleState::Ready)];
    let p = report_until(&h, &policy, &reports, "KernelsReady=True", |p| {
        kernels_condition(p).0 == "True"
    })
    .await;
    assert_eq!(
        kernels_condition(&p),
        (
            "True".into(),
            "NextKernelsReady".into(),
            "every kernel installed on the 3 nodes with more than one kernel has tt-kmd 2.8.0 ready"
                .into()
        )
    );
    wait_metrics(
        metrics,
        &[
            gauge("Failed", 0),
            gauge("Pending", 0),
            starts("hit", 1),
            starts("miss", 1),
        ],
    )
    .await;
    let summary = plugin(&h, &["status"]);
    assert!(!summary.contains("KernelsReady"), "{summary}");
    stop_serving.cancel();
    h.shutdown().await;
}
