//! The real kubectl v1.35 against a real API server: get, apply (client- and server-side),
//! patch, label, cordon, drain with a PodDisruptionBudget, delete, get --watch, CRDs.
//! Needs kubectl from `.ci/kube-tools` (or `TTDP_KUBECTL`); fails, not skips, without it.
//!
//! Kubernetes behaviour only: every test runs against the real control plane of
//! `ttdp_testkit::launcher::test_kubeconfig` (`TTDP_TEST_KUBECONFIG`, else one started for the
//! test process; kubectl then works in the test's own namespace, on
//! uniquely named nodes). Where a pod must finish terminating (drain, delete), a simulated
//! kubelet from `ttdp_testkit::sim` serves its node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apiserver_support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use apiserver_support::target::RUN_LABEL;
use apiserver_support::{Target, eventually, kubectl, widget_crd};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    namespace: String,
    cache: tempfile::TempDir,
}

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    fn new(t: &Target) -> Self {
        Self {
            bin: kubectl(),
            kubeconfig: t.kubeconfig().to_path_buf(),
            namespace: t.namespace().to_owned(),
            cache: tempfile::tempdir().unwrap(),
        }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .arg("--namespace")
            .arg(&self.namespace)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    async fn run_with_stdin(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = self.command(args).spawn().expect("kubectl starts");
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.as_bytes()).await.unwrap();
        drop(input);
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish within 60s"))
            .unwrap();
        Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn run(&self, args: &[&str]) -> Output {
        self.run_with_stdin(args, "").await
    }

    /// Run and require success, returning stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert_eq!(
            out.code, 0,
            "kubectl {args:?} failed: {}{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    async fn apply(&self, extra: &[&str], yaml: &str) -> Output {
        let mut args = vec!["apply", "-f", "-"];
        args.extend_from_slice(extra);
        self.run_with_stdin(&args, yaml).await
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&all).await).unwrap()
    }
}

/// The Ready node `t.name(short)` with label `pool: a` and the test's run label.
fn node_yaml(t: &Target, short: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {}\n  labels:\n    pool: a\n    {RUN_LABEL}: {}\nstatus:\n  conditions:\n  - type: Ready\n    status: \"True\"\n",
        t.name(short),
        t.namespace()
    )
}

/// A pod `name` bound to the node `t.name("n1")`.
fn pod_yaml(t: &Target, name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    app: w\nspec:\n  nodeName: {}\n  containers:\n  - name: c\n    image: busybox:1.36\n",
        t.name("n1")
    )
}

/// Waits until the node has no taints: a real API server taints a new node
/// `node.kubernetes.io/not-ready` until the node lifecycle controller sees it Ready, and
/// kubectl's taint edits send the whole list.
async fn untainted(t: &Target, name: &str) {
    let nodes: Api<Node> = Api::all(t.client());
    eventually(30, || async {
        let node = nodes.get(name).await.unwrap();
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        taints.is_empty().then_some(())
    })
    .await;
}

/// Waits until the pods are Running and Ready (their simulated kubelet reports them).
async fn ready(pods: &Api<Pod>, names: &[&str]) {
    for name in names {
        eventually(30, || async {
            let pod = pods.get(name).await.unwrap();
            let status = pod.status?;
            let ready = status
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (status.phase.as_deref() == Some("Running") && ready).then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn kubectl_get_prints_tables_and_reports_not_found() {
    let t = Target::start().await;
    let k = Kubectl::new(&t);
    let n1 = t.name("n1");
    assert_eq!(k.apply(&[], &node_yaml(&t, "n1")).await.code, 0);
    let table = k.ok(&["get", "nodes", "-l", &t.run_selector()]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("STATUS") && lines[0].contains("ROLES"),
        "{table}"
    );
    assert!(
        lines[1].starts_with(&n1) && lines[1].contains("Ready"),
        "{table}"
    );
    assert_eq!(
        k.ok(&["get", "nodes", "-l", &t.own("pool=a"), "-o", "name"])
            .await
            .trim(),
        format!("node/{n1}")
    );
    assert_eq!(
        k.ok(&["get", "nodes", "-l", &t.own("pool=b"), "-o", "name"])
            .await
            .trim(),
        ""
    );
    let ns = k.ok(&["get", "ns"]).await;
    assert!(ns.contains("kube-system") && ns.contains("Active"), "{ns}");

    let ghost = t.name("ghost");
    let missing = k.run(&["get", "node", &ghost]).await;
    assert_eq!(missing.code, 1);
    assert_eq!(
        missing.stderr.trim(),
        format!("Error from server (NotFound): nodes \"{ghost}\" not found")
    );
}

#[tokio::test]
async fn kubectl_apply_creates_configures_and_prunes_with_last_applied() {
    let t = Target::start().await;
    let k = Kubectl::new(&t);
    let first = k.apply(&[], &pod_yaml(&t, "p1")).await;
    assert_eq!(first.stdout.trim(), "pod/p1 created", "{}", first.stderr);
    assert_eq!(
        k.apply(&[], &pod_yaml(&t, "p1")).await.stdout.trim(),
        "pod/p1 unchanged"
    );
    let changed = pod_yaml(&t, "p1").replace("    app: w\n", "    app: w\n    extra: x\n");
    assert_eq!(
        k.apply(&[], &changed).await.stdout.trim(),
        "pod/p1 configured"
    );
    assert_eq!(
        k.json(&["get", "pod", "p1"]).await["metadata"]["labels"]["extra"],
        "x"
    );
    // Dropping the label from the file removes it (three-way merge via last-applied).
    assert_eq!(
        k.apply(&[], &pod_yaml(&t, "p1")).await.stdout.trim(),
        "pod/p1 configured"
    );
    assert!(
        k.json(&["get", "pod", "p1"]).await["metadata"]["labels"]
            .get("extra")
            .is_none()
    );
}

#[tokio::test]
async fn kubectl_server_side_apply_detects_conflicts_and_forces() {
    let t = Target::start().await;
    let k = Kubectl::new(&t);
    let n1 = t.name("n1");
    let node = node_yaml(&t, "n1");
    let out = k.apply(&["--server-side"], &node).await;
    assert_eq!(
        out.stdout.trim(),
        format!("node/{n1} serverside-applied"),
        "{}",
        out.stderr
    );
    let other = node.replace("pool: a", "pool: b");
    let conflict = k
        .apply(
            &["--server-side", "--field-manager", "someone-else"],
            &other,
        )
        .await;
    assert_ne!(conflict.code, 0);
    assert!(
        conflict.stderr.contains(
            "Apply failed with 1 conflict: conflict with \"kubectl\": .metadata.labels.pool"
        ),
        "{}",
        conflict.stderr
    );
    let forced = k
        .apply(
            &[
                "--server-side",
                "--field-manager",
                "someone-else",
                "--force-conflicts",
            ],
            &other,
        )
        .await;
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    let node = k.json(&["get", "node", &n1, "--show-managed-fields"]).await;
    assert_eq!(node["metadata"]["labels"]["pool"], "b");
    let managers: Vec<&str> = node["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert!(managers.contains(&"someone-else"), "{managers:?}");
}

#[tokio::test]
async fn kubectl_patch_label_annotate_cordon_and_uncordon() {
    let t = Target::start().await;
    let k = Kubectl::new(&t);
    let n1 = t.name("n1");
    let n1 = n1.as_str();
    k.apply(&[], &node_yaml(&t, "n1")).await;
    k.apply(&[], &pod_yaml(&t, "p1")).await;
    k.ok(&[
        "patch",
        "node",
        n1,
        "-p",
        r#"{"metadata":{"labels":{"merge":"yes"}}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "node",
        n1,
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"m2":"yes"}}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "node",
        n1,
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/j","value":"yes"}]"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "pod",
        "p1",
        "-p",
        r#"{"spec":{"containers":[{"name":"c","image":"busybox:1.37"}]}}"#,
    ])
    .await;
    k.ok(&["label", "node", n1, "l=1"]).await;
    k.ok(&["annotate", "node", n1, "a=1"]).await;
    k.ok(&["label", "node", n1, "pool-"]).await;
    let node = k.json(&["get", "node", n1]).await;
    let labels = &node["metadata"]["labels"];
    for key in ["merge", "m2", "j", "l"] {
        assert!(labels.get(key).is_some(), "label {key} missing: {labels}");
    }
    assert!(labels.get("pool").is_none());
    assert_eq!(node["metadata"]["annotations"]["a"], "1");
    let pod = k.json(&["get", "pod", "p1"]).await;
    assert_eq!(
        pod["spec"]["containers"].as_array().unwrap().len(),
        1,
        "strategic merge by name, not append"
    );
    assert_eq!(pod["spec"]["containers"][0]["image"], "busybox:1.37");

    assert_eq!(
        k.ok(&["cordon", n1]).await.trim(),
        format!("node/{n1} cordoned")
    );
    assert_eq!(
        k.json(&["get", "node", n1]).await["spec"]["unschedulable"],
        true
    );
    assert!(
        k.ok(&["get", "node", n1])
            .await
            .contains("Ready,SchedulingDisabled")
    );
    assert_eq!(
        k.ok(&["uncordon", n1]).await.trim(),
        format!("node/{n1} uncordoned")
    );
    assert!(
        k.json(&["get", "node", n1]).await["spec"]
            .get("unschedulable")
            .is_none()
    );
}

#[tokio::test]
async fn kubectl_drain_is_blocked_by_a_disruption_budget_and_succeeds_once_it_allows() {
    let t = Target::start().await;
    let client = t.client();
    let k = Kubectl::new(&t);
    let n1 = t.name("n1");
    // The node's simulated kubelet runs the pods (Running, Ready) and completes their graceful
    // deletion, which drain waits for.
    let kubelet = t.kubelet("n1", &[("pool", "a")]).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for name in ["p1", "p2"] {
        assert_eq!(k.apply(&[], &pod_yaml(&t, name)).await.code, 0);
    }
    ready(&pods, &["p1", "p2"]).await;
    let pdb = "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: keep-two\nspec:\n  minAvailable: 2\n  selector:\n    matchLabels:\n      app: w\n";
    assert_eq!(k.apply(&[], pdb).await.code, 0);
    // Until the disruption controller has written the budget's status, a real server refuses
    // evictions as "still being processed": wait, so the budget itself is what blocks.
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client.clone());
    eventually(30, || async {
        let status = pdbs.get("keep-two").await.unwrap().status?;
        (status.observed_generation == Some(1) && status.current_healthy == 2).then_some(())
    })
    .await;

    // Bare pods need --force, as with a real cluster; --ignore-daemonsets because on a real
    // cluster DaemonSets (kube-proxy, CNI) also place pods on the simulated node.
    let blocked = k
        .run(&[
            "drain",
            &n1,
            "--force",
            "--ignore-daemonsets",
            "--timeout=3s",
        ])
        .await;
    assert_ne!(
        blocked.code, 0,
        "drain must not succeed: {}",
        blocked.stdout
    );
    assert!(
        blocked
            .stderr
            .contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{}",
        blocked.stderr
    );
    assert_eq!(
        pods.list(&Default::default()).await.unwrap().items.len(),
        2,
        "nothing was evicted"
    );
    let nodes: Api<Node> = Api::all(client);
    assert_eq!(
        nodes.get(&n1).await.unwrap().spec.unwrap().unschedulable,
        Some(true),
        "drain cordons first"
    );

    k.ok(&[
        "patch",
        "pdb",
        "keep-two",
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":0}}"#,
    ])
    .await;
    let drained = k
        .run(&[
            "drain",
            &n1,
            "--force",
            "--ignore-daemonsets",
            "--timeout=30s",
        ])
        .await;
    assert_eq!(drained.code, 0, "{}{}", drained.stdout, drained.stderr);
    assert!(
        drained.stdout.contains(&format!("node/{n1} drained")),
        "{}",
        drained.stdout
    );
    assert!(
        drained.stdout.contains("pod/p1 evicted") && drained.stdout.contains("pod/p2 evicted"),
        "{}",
        drained.stdout
    );
    assert!(
        pods.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    kubelet.shutdown_and_unregister().await.unwrap();
}

#[tokio::test]
async fn kubectl_create_namespace_configmap_and_serviceaccount_through_protobuf() {
    // kubectl's typed clients send these bodies as protobuf.
    let t = Target::start().await;
    let k = Kubectl::new(&t);
    let demo = t.name("demo");
    let demo = demo.as_str();
    assert_eq!(
        k.ok(&["create", "namespace", demo]).await.trim(),
        format!("namespace/{demo} created")
    );
    k.ok(&[
        "create",
        "configmap",
        "c1",
        "-n",
        demo,
        "--from-literal=a=b",
    ])
    .await;
    k.ok(&["create", "serviceaccount", "s1", "-n", demo]).await;
    assert_eq!(
        k.json(&["get", "configmap", "c1", "-n", demo]).await["data"],
        json!({"a": "b"})
    );
    assert!(
        k.ok(&["get", "sa", "-n", demo, "-o", "name"])
            .await
            .contains("serviceaccount/s1")
    );
    let events = format!(
        "apiVersion: v1\nkind: Event\nmetadata:\n  name: e1\n  namespace: {demo}\ninvolvedObject:\n  kind: ConfigMap\n  name: c1\n  namespace: {demo}\nreason: Tested\nmessage: hello\ntype: Normal\n"
    );
    // The object names its namespace; kubectl refuses a different --namespace. The involved
    // object lives in the event's namespace (a real server refuses an Event whose
    // involvedObject.namespace differs from its own, except cluster-scoped objects in `default`).
    let applied = k.apply(&["-n", demo], &events).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    let table = k.ok(&["get", "events", "-n", demo]).await;
    assert!(
        table.contains("Tested") && table.contains("configmap/c1") && table.contains("hello"),
        "{table}"
    );
}

#[tokio::test]
async fn kubectl_delete_waits_for_graceful_deletion() {
    let t = Target::start().await;
    let k = Kubectl::new(&t);
    let n1 = t.name("n1");
    // The node's simulated kubelet completes the graceful deletion kubectl waits for.
    let kubelet = t.kubelet("n1", &[("pool", "a")]).await;
    assert_eq!(k.apply(&[], &pod_yaml(&t, "p1")).await.code, 0);
    assert_eq!(
        k.ok(&["delete", "pod", "p1", "--timeout=20s"]).await.trim(),
        format!("pod \"p1\" deleted from {} namespace", t.namespace())
    );
    assert_eq!(k.run(&["get", "pod", "p1"]).await.code, 1);
    kubelet.shutdown().await;
    assert_eq!(
        k.ok(&["delete", "node", &n1]).await.trim(),
        format!("node \"{n1}\" deleted")
    );
}

#[tokio::test]
async fn kubectl_get_watch_streams_new_objects() {
    let t = Target::start().await;
    let k = Kubectl::new(&t);
    let (n1, n2) = (t.name("n1"), t.name("n2"));
    k.apply(&[], &node_yaml(&t, "n1")).await;
    let mut child = k
        .command(&["get", "nodes", "--watch", "-l", &t.run_selector()])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push(line.clone());
            if line.starts_with(&n1) && seen.len() == 2 {
                assert_eq!(k.apply(&[], &node_yaml(&t, "n2")).await.code, 0);
            }
            if line.starts_with(&n2) {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("watch shows n2 within 30s");
    assert!(seen[0].starts_with("NAME"), "{seen:?}");
    child.kill().await.unwrap();
}

#[tokio::test]
async fn kubectl_applies_a_crd_and_its_custom_resources_with_validation_errors_shown() {
    // Resources are named with their group (`widgets.<group>`): on a shared cluster other
    // tests' groups have widgets too.
    let t = Target::start().await;
    let k = Kubectl::new(&t);
    let group = t.group();
    let crd = serde_json::to_string(&widget_crd(&t)).unwrap();
    let out = k.apply(&[], &crd).await;
    assert_eq!(
        out.stdout.trim(),
        format!("customresourcedefinition.apiextensions.k8s.io/widgets.{group} created"),
        "{}",
        out.stderr
    );
    let w = format!(
        "apiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  version: 1.2.3\n"
    );
    let w = w.as_str();
    // kubectl may race discovery right after the CRD appears; retry like a user would.
    let created = eventually(30, || async {
        let out = k.apply(&[], w).await;
        (out.code == 0).then_some(out.stdout)
    })
    .await;
    assert_eq!(created.trim(), format!("widget.{group}/w1 created"));
    let table = k.ok(&["get", &format!("widgets.{group}")]).await;
    assert!(
        table.lines().next().unwrap().contains("VERSION"),
        "printer columns: {table}"
    );
    assert!(table.contains("1.2.3"), "{table}");
    let bad = k.apply(&[], &w.replace("1.2.3", "one")).await;
    assert_ne!(bad.code, 0);
    assert!(
        bad.stderr.contains("spec.version in body should match"),
        "{}",
        bad.stderr
    );
    // kubectl's default fieldValidation=Strict rejects unknown fields; Warn drops them with a
    // Warning header, which kubectl prints.
    let bogus = w
        .replace("w1", "w3")
        .replace("  version: 1.2.3\n", "  version: 1.2.3\n  bogus: 1\n");
    let strict = k.apply(&[], &bogus).await;
    assert_ne!(strict.code, 0);
    assert!(
        strict
            .stderr
            .contains("strict decoding error: unknown field \"spec.bogus\""),
        "{}",
        strict.stderr
    );
    let warn = k.apply(&["--validate=warn"], &bogus).await;
    assert_eq!(warn.code, 0, "{}", warn.stderr);
    assert!(
        warn.stderr
            .contains("Warning: unknown field \"spec.bogus\""),
        "{}",
        warn.stderr
    );
    let ssa = k.apply(&["--server-side"], &w.replace("w1", "w2")).await;
    assert_eq!(
        ssa.stdout.trim(),
        format!("widget.{group}/w2 serverside-applied"),
        "{}",
        ssa.stderr
    );
    assert!(
        k.ok(&["get", &t.short_name("wd"), "-o", "name"])
            .await
            .contains(&format!("widget.{group}/w2")),
        "short names work"
    );
}

#[tokio::test]
async fn kubectl_taint_adds_and_removes_taints() {
    let t = Target::start().await;
    let k = Kubectl::new(&t);
    let n1 = t.name("n1");
    let n1 = n1.as_str();
    k.apply(&[], &node_yaml(&t, "n1")).await;
    untainted(&t, n1).await;
    k.ok(&["taint", "nodes", n1, "a=1:NoSchedule"]).await;
    k.ok(&["taint", "nodes", n1, "b=2:NoExecute"]).await;
    // Taints are an atomic list: kubectl sends the whole remaining list.
    k.ok(&["taint", "nodes", n1, "a:NoSchedule-"]).await;
    let taints = k.json(&["get", "node", n1]).await["spec"]["taints"].clone();
    assert_eq!(
        taints,
        json!([{"effect": "NoExecute", "key": "b", "value": "2"}])
    );
    k.ok(&["taint", "nodes", n1, "b:NoExecute-"]).await;
    assert!(
        k.json(&["get", "node", n1]).await["spec"]
            .get("taints")
            .is_none()
    );
}
