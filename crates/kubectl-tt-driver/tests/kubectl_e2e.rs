//! End-to-end: the real `kubectl` runs the plugin (`kubectl tt driver ...`, found on PATH)
//! against a real control plane (`ttdp_testkit::launcher::test_kubeconfig`) holding a populated
//! fleet, for every command.
//!
//! Every test has its own prefixed policies and nodes ([`harness::Harness`]); the plugin shows
//! every policy of the cluster, so assertions look at the test's own rows, summaries and JSON
//! entries. kubectl comes from `.ci/kube-tools` (`~/.local/ttdp-tools/bin/kubectl`) or
//! `TTDP_KUBECTL`; without it these tests fail with instructions rather than skip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;
mod harness;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use ttdp_api::names::annotations;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};
use ttdp_testkit::faults::Fault;

use harness::Harness;

/// The API group of policies.
const GROUP: &str = "driver.tenstorrent.com";
/// The resource of policies.
const POLICIES: &str = "tenstorrentdriverpolicies";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_is_the_default_command() {
    let h = Harness::populated_with_agents().await;
    let run = h.kubectl(&["tt", "driver"]).await.ok();
    assert_eq!(run.stderr, "", "no warnings when everything is readable");
    let out = &run.stdout;
    assert!(out.starts_with("POLICY "), "{out}");
    let fleet_rows: String = out
        .lines()
        .filter(|l| l.starts_with(&format!("{} ", h.n("fleet"))))
        .collect::<Vec<_>>()
        .join("\n");
    for cell in [
        "Pending 2.7.0",
        "Cordoning 2.7.0",
        "Draining 2.7.0",
        "Upgrading",
        "Uncordoning 2.7.0",
        "Done 2.8.0",
        "Failed 2.7.0",
        "HostManaged 2.6.0",
        "Conflict 2.7.0",
    ] {
        assert!(fleet_rows.contains(cell), "missing {cell:?} in\n{out}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("{} ", h.n("canary"))) && l.contains("Done 2.8.1")),
        "{out}"
    );
    assert!(
        !out.contains('\x1b'),
        "colour when stdout is a pipe:\n{out}"
    );
    let summaries = h.own_summaries(out);
    assert!(
        summaries.contains(&format!(
            "{}: version 2.8.0, matched 9, up-to-date 1, in-progress 4, failed 1",
            h.n("fleet")
        )),
        "{summaries}"
    );
    // The real DaemonSet controller's counters: node-6's agent is Ready, node-7's crash-loops.
    assert!(
        summaries.contains(&format!(
            "daemonset {}/ttdrv-{}: 1/2 ready",
            h.ns(),
            h.n("fleet")
        )),
        "{summaries}"
    );
    assert!(summaries.contains("Degraded=True (NodesFailed)"));

    let explicit = h.kubectl(&["tt", "driver", "status"]).await.ok();
    assert_eq!(h.own_summaries(&explicit.stdout), summaries);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_wraps_to_columns_and_o_wide_is_per_node() {
    let h = Harness::populated().await;
    let mut cmd = h.command(&["tt", "driver"]);
    cmd.env("COLUMNS", "60");
    let narrow = h.run(cmd).await.ok();
    let blocks = narrow
        .stdout
        .lines()
        .filter(|l| l.starts_with("POLICY"))
        .count();
    assert!(
        blocks >= 3,
        "expected blocks at 60 columns:\n{}",
        narrow.stdout
    );
    let wide = h.kubectl(&["tt", "driver", "-o", "wide"]).await.ok();
    assert!(wide.stdout.starts_with("NODE "), "{}", wide.stdout);
    let header = wide.stdout.lines().next().unwrap();
    assert!(header.contains(&h.n("canary")) && header.contains(&h.n("fleet")));
    assert_eq!(
        wide.stdout
            .lines()
            .filter(|l| l.starts_with(&h.n("node-")))
            .count(),
        11,
        "{}",
        wide.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_and_yaml() {
    let h = Harness::populated_with_agents().await;
    let json = h
        .kubectl(&["tt", "driver", "status", "-o", "json"])
        .await
        .ok();
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(doc["kind"], "Status");
    let policies = h.own(&doc["policies"]);
    assert_eq!(policies.len(), 2, "{policies:#?}");
    assert_eq!(policies[0]["name"], h.n("canary"));
    assert_eq!(policies[1]["name"], h.n("fleet"));
    assert_eq!(policies[1]["failed"], 1);
    assert_eq!(policies[1]["daemonSet"]["namespace"], h.ns());
    assert_eq!(policies[1]["daemonSet"]["desired"], 2);
    assert_eq!(policies[1]["daemonSet"]["ready"], 1);
    let states: Vec<&str> = policies[1]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["state"].as_str().unwrap())
        .collect();
    assert_eq!(states.len(), 9);
    assert!(states.contains(&"HostManaged"));

    let yaml = h.kubectl(&["tt", "driver", "-o", "yaml"]).await.ok();
    let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml.stdout).unwrap();
    assert_eq!(from_yaml["kind"], doc["kind"]);
    assert_eq!(
        h.own(&from_yaml["policies"]),
        policies,
        "yaml and json carry the same document"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_explains_each_node() {
    let h = Harness::populated().await;
    let run = h
        .kubectl(&["tt", "driver", "nodes", &h.n("fleet")])
        .await
        .ok();
    let out = &run.stdout;
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header[..2], ["POLICY", "NODE"], "{out}");
    assert_eq!(out.lines().count(), 10, "header + 9 nodes:\n{out}");
    let failed = out.lines().find(|l| l.contains(&h.n("node-7"))).unwrap();
    assert!(failed.contains("Failed"), "{failed}");
    assert!(failed.contains("2.7.0 → 2.8.0"), "{failed}");
    assert!(
        failed.contains(&format!("ttdp/{}", h.n("fleet"))),
        "cordoned-by from the node annotation: {failed}"
    );
    assert!(
        failed.contains("DrainTimeout: pods ml/trainer-0"),
        "{failed}"
    );
    assert!(!out.contains(&h.n("canary")));

    let all = h
        .kubectl(&["tt", "driver", "nodes", "-o", "json"])
        .await
        .ok();
    let doc: serde_json::Value = serde_json::from_str(&all.stdout).unwrap();
    assert_eq!(doc["kind"], "NodeList");
    let nodes = h.own(&doc["nodes"]);
    assert_eq!(nodes.len(), 11, "{nodes:#?}");
    let n3 = nodes.iter().find(|n| n["name"] == h.n("node-3")).unwrap();
    assert_eq!(n3["cordonedBy"], format!("ttdp/{}", h.n("fleet")));
    assert_eq!(n3["unschedulable"], true);
    assert_eq!(n3["source"], "status");
    let yaml = h
        .kubectl(&["tt", "driver", "nodes", "-o", "yaml"])
        .await
        .ok();
    let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml.stdout).unwrap();
    assert_eq!(from_yaml["kind"], doc["kind"]);
    assert_eq!(h.own(&from_yaml["nodes"]), nodes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_lists_the_nodes_a_large_status_omits() {
    let h = Harness::start().await;
    let mut p = fixture::policy(
        "large",
        "2.8.0",
        vec![fixture::node(
            "big-3",
            NodeState::Upgrading,
            Some("2.7.0"),
            "2.8.0",
        )],
        vec![],
        3,
    );
    let status = p.status.as_mut().unwrap();
    status.observed_generation = Some(1);
    if let Some(s) = status.summary.as_mut() {
        s.up_to_date -= 1;
        s.pending += 1;
    }
    // Named by the harness, the policy selects only this test's nodes (its scenario label), so
    // other tests' Tenstorrent nodes on the cluster are not counted as omitted ones.
    h.create_policy(&p).await;
    for name in ["big-1", "big-2"] {
        h.create_node(&fixture::k8s_node(name, Some("2.8.0"), None))
            .await;
    }
    for name in ["big-3", "big-4"] {
        h.create_node(&fixture::k8s_node(name, Some("2.7.0"), None))
            .await;
    }
    let status = h.kubectl(&["tt", "driver"]).await.ok();
    let summaries = h.own_summaries(&status.stdout);
    assert!(
        summaries.contains("3 Done and waiting nodes are omitted from status.nodes"),
        "{}",
        status.stdout
    );
    assert!(summaries.contains(&format!("kubectl tt driver nodes {}", h.n("large"))));
    let nodes = h
        .kubectl(&["tt", "driver", "nodes", &h.n("large")])
        .await
        .ok();
    let row = |n: &str| {
        let n = h.n(n);
        nodes
            .stdout
            .lines()
            .find(|l| l.contains(&format!("{n} ")))
            .unwrap_or_else(|| panic!("{n} missing:\n{}", nodes.stdout))
            .to_owned()
    };
    assert_eq!(nodes.stdout.lines().count(), 5, "{}", nodes.stdout);
    for n in ["big-1", "big-2"] {
        assert!(row(n).contains(" Done "), "{}", nodes.stdout);
    }
    assert!(row("big-3").contains(" Upgrading "), "{}", nodes.stdout);
    assert!(row("big-4").contains(" Pending "), "{}", nodes.stdout);
    assert!(row("big-4").contains("WaitingForSlot"), "{}", nodes.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_shows_spec_conditions_nodes_and_events() {
    let h = Harness::populated_with_agents().await;
    let fleet = h.n("fleet");
    let run = h.kubectl(&["tt", "driver", "describe", &fleet]).await.ok();
    assert_eq!(run.stderr, "", "no warnings when everything is readable");
    let out = &run.stdout;
    for part in [
        format!("Name:                {fleet}"),
        "Version:           2.8.0".to_owned(),
        format!(
            "DaemonSet:           {}/ttdrv-{fleet} (desired 2, ready 1, up-to-date 2)",
            h.ns()
        ),
        "Conditions:".to_owned(),
        "Degraded      True".to_owned(),
        "Nodes:".to_owned(),
        format!("{}   Failed", h.n("node-7")),
        "Agent pods:".to_owned(),
        "Events:".to_owned(),
        "Warning   DrainTimeout".to_owned(),
        "ttdp-controller".to_owned(),
    ] {
        assert!(out.contains(&part), "missing {part:?} in\n{out}");
    }
    // The agent pods as the kubelets and the DaemonSet controller left them.
    let pods: Vec<&str> = out
        .lines()
        .skip_while(|l| *l != "Agent pods:")
        .skip(2)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert_eq!(pods.len(), 2, "{out}");
    let cells = |row: &str| {
        row.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let healthy = cells(pods[0]);
    assert_eq!(healthy[0], h.n("node-6"), "{out}");
    assert!(healthy[1].starts_with(&format!("ttdrv-{fleet}-")), "{out}");
    assert_eq!(healthy[2..5], ["1/1", "Running", "0"], "{out}");
    let crashing = cells(pods[1]);
    assert_eq!(crashing[0], h.n("node-7"), "{out}");
    assert_eq!(crashing[2..4], ["0/1", "CrashLoopBackOff"], "{out}");

    // A server without events.k8s.io/v1 (kube-apiserver answers its paths with a plain
    // `404 page not found`): the Events come from core/v1.
    h.proxy
        .faults()
        .inject(Fault::not_served("events.k8s.io", "events"));
    let fallback = h
        .kubectl_via_proxy(&["tt", "driver", "describe", &fleet])
        .await
        .ok();
    assert_eq!(fallback.stderr, "");
    for part in ["Events:", "Warning   DrainTimeout", "ttdp-controller"] {
        assert!(
            fallback.stdout.contains(part),
            "missing {part:?} in\n{}",
            fallback.stdout
        );
    }
    let lists: Vec<(String, u16)> = h
        .proxy
        .recorder()
        .requests()
        .into_iter()
        .filter(|r| r.resource == "events")
        .map(|r| (r.group, r.status))
        .collect();
    assert_eq!(
        lists,
        [("events.k8s.io".to_owned(), 404), (String::new(), 200)],
        "tried events.k8s.io/v1, then core/v1"
    );

    let nope = h.n("nope");
    let missing = h
        .kubectl(&["tt", "driver", "describe", &nope])
        .await
        .failed();
    assert!(
        missing.stderr.contains(&format!(
            "error: tenstorrentdriverpolicies.driver.tenstorrent.com \"{nope}\" not found"
        )),
        "{}",
        missing.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_patch_spec_paused() {
    let h = Harness::populated().await;
    let (fleet, canary) = (h.n("fleet"), h.n("canary"));
    let api: Api<TenstorrentDriverPolicy> = Api::all(h.client.clone());
    let run = h.kubectl(&["tt", "driver", "pause", &fleet]).await.ok();
    assert_eq!(
        run.stdout,
        format!("tenstorrentdriverpolicy.driver.tenstorrent.com/{fleet} paused\n")
    );
    assert!(api.get(&fleet).await.unwrap().spec.paused);
    let again = h.kubectl(&["tt", "driver", "pause", &fleet]).await.ok();
    assert!(again.stdout.contains("already paused"), "{}", again.stdout);
    let status = h.kubectl(&["tt", "driver"]).await.ok();
    assert!(
        h.own_summaries(&status.stdout).contains("failed 1, paused"),
        "{}",
        status.stdout
    );

    h.kubectl(&["tt", "driver", "resume", &fleet]).await.ok();
    assert!(!api.get(&fleet).await.unwrap().spec.paused);
    assert!(
        !api.get(&canary).await.unwrap().spec.paused,
        "other policies untouched"
    );
    let nope = h.n("nope");
    let missing = h.kubectl(&["tt", "driver", "pause", &nope]).await.failed();
    assert!(
        missing.stderr.contains(&format!("\"{nope}\" not found")),
        "{}",
        missing.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_annotates_the_failed_node() {
    let h = Harness::populated().await;
    let (fleet, node7) = (h.n("fleet"), h.n("node-7"));
    let nodes: Api<Node> = Api::all(h.client.clone());
    let run = h
        .kubectl(&["tt", "driver", "retry", &fleet, &node7])
        .await
        .ok();
    assert!(
        run.stdout.starts_with(&format!(
            "node/{node7} annotated driver.tenstorrent.com/retry="
        )),
        "{}",
        run.stdout
    );
    let node = nodes.get(&node7).await.unwrap();
    let stamp = node
        .metadata
        .annotations
        .unwrap()
        .get(annotations::RETRY)
        .cloned()
        .expect("retry annotation set");
    let when: jiff::Timestamp = stamp.parse().expect("RFC 3339 timestamp");
    let age = jiff::Timestamp::now().duration_since(when);
    assert!(age.as_secs() < 120, "stamped now, got {stamp}");
    let shown = h.kubectl(&["tt", "driver", "nodes", &fleet]).await.ok();
    let row = shown
        .stdout
        .lines()
        .find(|l| l.contains(&node7))
        .unwrap_or_default();
    assert!(row.contains("(retry requested)"), "{}", shown.stdout);

    let node1 = h.n("node-1");
    let not_failed = h
        .kubectl(&["tt", "driver", "retry", &fleet, &node1])
        .await
        .failed();
    assert!(
        not_failed.stderr.contains(&format!(
            "error: node {node1} is Pending in policy {fleet}, not Failed"
        )),
        "{}",
        not_failed.stderr
    );
    let n1 = nodes.get(&node1).await.unwrap();
    assert!(
        !n1.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(annotations::RETRY),
        "no annotation on a node that was refused"
    );
    let node99 = h.n("node-99");
    let unknown = h
        .kubectl(&["tt", "driver", "retry", &fleet, &node99])
        .await
        .failed();
    assert!(
        unknown
            .stderr
            .contains(&format!("node {node99} is not listed")),
        "{}",
        unknown.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_labels_the_node_and_undo_removes_the_label() {
    let h = Harness::populated().await;
    let node3 = h.n("node-3");
    let nodes: Api<Node> = Api::all(h.client.clone());
    let skip_label = |n: &Node| {
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ttdp_api::names::labels::SKIP))
            .cloned()
    };
    let run = h.kubectl(&["tt", "driver", "skip", &node3]).await.ok();
    assert!(
        run.stdout.starts_with(&format!(
            "node/{node3} labelled driver.tenstorrent.com/skip=true: no policy manages it now"
        )),
        "{}",
        run.stdout
    );
    assert_eq!(
        skip_label(&nodes.get(&node3).await.unwrap()).as_deref(),
        Some("true")
    );
    let undo = h
        .kubectl(&["tt", "driver", "skip", &node3, "--undo"])
        .await
        .ok();
    assert!(undo.stdout.contains("unlabelled"), "{}", undo.stdout);
    assert_eq!(skip_label(&nodes.get(&node3).await.unwrap()), None);
    let node99 = h.n("node-99");
    let unknown = h.kubectl(&["tt", "driver", "skip", &node99]).await.failed();
    assert!(
        unknown.stderr.contains(&node99) && unknown.stderr.contains("not found"),
        "{}",
        unknown.stderr
    );
}

/// Reads lines from a child's stdout until one contains every one of `needles` (bounded).
async fn read_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    needles: &[&str],
    seen: &mut String,
) {
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push_str(&line);
            seen.push('\n');
            if needles.iter().all(|n| line.contains(n)) {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(found, Ok(true)),
        "watch output never showed a line with {needles:?}; got:\n{seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_redraws_when_the_status_changes() {
    let h = Harness::populated().await;
    let fleet = h.n("fleet");
    for args in [
        vec!["tt", "driver", "watch"],
        vec!["tt", "driver", "nodes", &fleet, "--watch"],
    ] {
        let mut child = h.command(&args).spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = String::new();
        read_until(&mut lines, &[&fleet, "Draining"], &mut seen).await;
        assert!(!seen.contains("2.9.9"), "{seen}");
        h.set_node_state("fleet", "node-3", NodeState::Failed, "2.9.9")
            .await;
        read_until(&mut lines, &[&fleet, "2.9.9"], &mut seen).await;
        h.set_node_state("fleet", "node-3", NodeState::Draining, "2.7.0")
            .await;
        child.kill().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_read_like_kubectl() {
    let h = Harness::start().await;
    // No CRD. The shared cluster has it (other suites need it), so the proxy answers the
    // policies' paths the way kube-apiserver answers them without the CRD: `404 page not
    // found`.
    h.proxy.faults().inject(Fault::not_served(GROUP, POLICIES));
    let run = h.kubectl_via_proxy(&["tt", "driver"]).await.failed();
    assert_eq!(
        run.stderr,
        "error: the TenstorrentDriverPolicy CRD is not installed; install the chart\n"
    );
    let run = h
        .kubectl_via_proxy(&["tt", "driver", "describe", "x"])
        .await
        .failed();
    assert!(
        run.stderr.contains("CRD is not installed"),
        "{}",
        run.stderr
    );
    h.proxy.faults().clear();

    // CRD, no policies: kubectl's "No resources found", on stderr, success. Other tests'
    // policies may exist on the shared cluster, so the proxy empties the server's list.
    h.proxy.faults().inject(Fault::empty_list(GROUP, POLICIES));
    let run = h.kubectl_via_proxy(&["tt", "driver"]).await.ok();
    assert_eq!(run.stdout, "");
    assert!(
        run.stderr
            .starts_with("No TenstorrentDriverPolicy resources found."),
        "{}",
        run.stderr
    );
    let run = h
        .kubectl_via_proxy(&["tt", "driver", "-o", "json"])
        .await
        .ok();
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["policies"], json!([]));
    h.proxy.faults().clear();

    // RBAC forbidden: a ServiceAccount nobody granted anything.
    let nobody = h.identity("nobody", json!([])).await;
    let run = h.kubectl_as(&nobody, &["tt", "driver"]).await.failed();
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "ask your cluster administrator for permission to list tenstorrentdriverpolicies.driver.tenstorrent.com"
        ),
        "{}",
        run.stderr
    );

    // No cluster behind the kubeconfig.
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let config = dir.path().join("kubeconfig");
    std::fs::write(
        &config,
        plain_kubeconfig(&format!("http://127.0.0.1:{port}")),
    )
    .unwrap();
    let run = h
        .kubectl_as(&config, &["tt", "driver", "--request-timeout", "10s"])
        .await
        .failed();
    assert!(
        run.stderr.starts_with(&format!(
            "error: the connection to the server http://127.0.0.1:{port}/ failed"
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("did you specify the right host or port?")
    );

    // A context that does not exist.
    let run = h
        .kubectl(&["tt", "driver", "--context", "no-such-context"])
        .await
        .failed();
    assert!(
        run.stderr.starts_with("error: cannot load the kubeconfig"),
        "{}",
        run.stderr
    );
}

fn plain_kubeconfig(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {{}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_and_context_flags_select_the_cluster() {
    let h = Harness::populated().await;
    let path = h.kubeconfig().to_str().unwrap().to_owned();
    let context = kube::config::Kubeconfig::read_from(h.kubeconfig())
        .unwrap()
        .current_context
        .expect("the test kubeconfig names its context");
    let mut cmd = h.command(&[
        "tt",
        "driver",
        "--kubeconfig",
        &path,
        "--context",
        &context,
        "nodes",
    ]);
    cmd.env("KUBECONFIG", "/nonexistent/kubeconfig");
    let run = h.run(cmd).await.ok();
    assert!(run.stdout.contains(&h.n("node-7")), "{}", run.stdout);

    let mut cmd = h.command(&["tt", "driver", "--kubeconfig", "/nonexistent/kubeconfig"]);
    cmd.env_remove("KUBECONFIG");
    let run = h.run(cmd).await.failed();
    assert!(
        run.stderr
            .starts_with("error: cannot load kubeconfig /nonexistent/kubeconfig"),
        "{}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_and_completion() {
    let h = Harness::start().await;
    let run = h.kubectl(&["tt", "driver", "--help"]).await.ok();
    assert!(
        run.stdout.contains("Usage: kubectl tt driver"),
        "{}",
        run.stdout
    );
    for sub in [
        "status",
        "nodes",
        "describe",
        "watch",
        "pause",
        "resume",
        "retry",
        "completion",
    ] {
        assert!(run.stdout.contains(sub), "{sub} not in --help");
        let sub_help = h.kubectl(&["tt", "driver", sub, "--help"]).await.ok();
        assert!(
            sub_help
                .stdout
                .contains(&format!("kubectl tt driver {sub}")),
            "{}",
            sub_help.stdout
        );
    }
    let retry = h.kubectl(&["tt", "driver", "retry", "--help"]).await.ok();
    assert!(
        retry.stdout.contains("driver.tenstorrent.com/retry"),
        "retry --help documents the annotation:\n{}",
        retry.stdout
    );
    for shell in ["bash", "zsh", "fish"] {
        let run = h.kubectl(&["tt", "driver", "completion", shell]).await.ok();
        assert!(run.stdout.contains("kubectl-tt-driver"), "{shell}");
        assert!(
            run.stdout.contains("retry"),
            "{shell} completes subcommands"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_starts_empty_and_shows_a_new_policy() {
    let h = Harness::start().await;
    // Other tests' policies may exist on the shared cluster: the proxy empties the server's
    // lists of policies (keeping its resourceVersion), so the watch starts from "none" and
    // then sees what the server sends.
    h.proxy.faults().inject(Fault::empty_list(GROUP, POLICIES));
    let mut child = h
        .command_with(h.proxy.kubeconfig(), &["tt", "driver", "watch"])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    read_until(
        &mut lines,
        &["No TenstorrentDriverPolicy resources found"],
        &mut seen,
    )
    .await;
    for view in fixture::narrow().policies {
        h.create_policy(&view.policy).await;
    }
    read_until(&mut lines, &[&h.n("default"), "Draining 2.7.0"], &mut seen).await;
    child.kill().await.unwrap();
}

/// Runs `kubectl <args>` on a pseudo-terminal (util-linux `script`), so the plugin's stdout is
/// a TTY; `extra_env` is added.
async fn on_a_terminal(h: &Harness, args: &str, extra_env: &[(&str, &str)]) -> harness::Run {
    let line = format!("{} {args}", harness::kubectl().display());
    let mut script = tokio::process::Command::new("script");
    script
        .args(["-qec", &line, "/dev/null"])
        .env("PATH", h.path_env())
        .env("KUBECONFIG", h.kubeconfig())
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in extra_env {
        script.env(k, v);
    }
    let run = h.run(script).await;
    assert_ne!(
        run.code,
        Some(127),
        "util-linux `script` is needed to give kubectl a terminal: apt-get install bsdutils"
    );
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colour_only_on_a_terminal_without_no_color() {
    let h = Harness::populated().await;
    let fleet = h.n("fleet");
    let tty = on_a_terminal(&h, "tt driver", &[]).await.ok();
    let own_rows: String = tty.stdout.lines().filter(|l| l.contains(&fleet)).collect();
    for code in ["\x1b[32m", "\x1b[36m", "\x1b[33m", "\x1b[31m", "\x1b[90m"] {
        assert!(
            own_rows.contains(code),
            "no {code:?} on a terminal:\n{}",
            tty.stdout
        );
    }
    let no_color_env = on_a_terminal(&h, "tt driver", &[("NO_COLOR", "1")])
        .await
        .ok();
    assert!(
        !no_color_env.stdout.contains("\x1b["),
        "{}",
        no_color_env.stdout
    );
    assert!(no_color_env.stdout.contains("Done 2.8.0"));
    let no_color_flag = on_a_terminal(&h, &format!("tt driver nodes {fleet} --no-color"), &[])
        .await
        .ok();
    assert!(
        !no_color_flag.stdout.contains("\x1b["),
        "{}",
        no_color_flag.stdout
    );
    assert!(no_color_flag.stdout.contains("Failed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_extras_become_warnings_and_server_errors_are_named() {
    let h = Harness::populated().await;
    let fleet = h.n("fleet");
    // A user who may read policies, DaemonSets, pods and Events, but not Nodes.
    let no_nodes = h
        .identity(
            "no-nodes",
            json!([
                {"apiGroups": [GROUP], "resources": [POLICIES], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["list"]},
                {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["list"]},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["list"]},
            ]),
        )
        .await;
    let run = h
        .kubectl_as(&no_nodes, &["tt", "driver", "nodes", &fleet])
        .await
        .ok();
    assert!(
        run.stderr.starts_with("warning: cannot read nodes"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains(&h.n("node-7")),
        "still lists the status: {}",
        run.stdout
    );

    // A token the server never issued: a real 401.
    let run = h
        .kubectl_as(&h.stranger(), &["tt", "driver", "describe", &fleet])
        .await
        .failed();
    assert_eq!(
        run.stderr,
        "error: you must be logged in to the server (Unauthorized); check the credentials of your kubeconfig context\n"
    );

    // A 500 no real server gives on demand: injected by the proxy.
    h.proxy
        .faults()
        .inject(Fault::error(500).verb("list").resource(POLICIES));
    let run = h.kubectl_via_proxy(&["tt", "driver"]).await.failed();
    assert!(
        run.stderr.starts_with(
            "error: the server could not list tenstorrentdriverpolicies.driver.tenstorrent.com"
        ),
        "{}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_state_filters_rows_and_names_the_valid_states() {
    let h = Harness::populated().await;
    let fleet = h.n("fleet");
    let all = h
        .kubectl(&["tt", "driver", "nodes", &fleet, "-o", "json"])
        .await
        .ok();
    let all: serde_json::Value = serde_json::from_str(&all.stdout).unwrap();
    let wanted = ["Failed", "Draining", "HostManaged"];
    let expected: Vec<serde_json::Value> = h
        .own(&all["nodes"])
        .into_iter()
        .filter(|n| wanted.contains(&n["state"].as_str().unwrap()))
        .collect();
    assert_eq!(expected.len(), 3, "{all:#}");
    let args = [
        "tt",
        "driver",
        "nodes",
        &fleet,
        "--state",
        "failed,DRAINING",
        "--state",
        "hostmanaged",
    ];
    let mut json_args = args.to_vec();
    json_args.extend(["-o", "json"]);
    let filtered = h.kubectl(&json_args).await.ok();
    let filtered: serde_json::Value = serde_json::from_str(&filtered.stdout).unwrap();
    assert_eq!(h.own(&filtered["nodes"]), expected);
    let table = h.kubectl(&args).await.ok();
    let rows: Vec<&str> = table.stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{}", table.stdout);
    for (row, node) in rows.iter().zip(["node-3", "node-7", "node-8"]) {
        assert!(row.contains(&format!("{} ", h.n(node))), "{}", table.stdout);
    }

    let unknown = h
        .kubectl(&["tt", "driver", "nodes", &fleet, "--state", "Broken"])
        .await;
    assert_eq!(unknown.code, Some(2), "a usage error: {unknown:#?}");
    assert!(
        unknown.stderr.contains("unknown node state \"Broken\"; valid states: Pending, Cordoning, Draining, Upgrading, Uncordoning, Done, Failed, HostManaged, Conflict"),
        "{}",
        unknown.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_json_and_yaml_carry_the_pages_facts() {
    let h = Harness::populated_with_agents().await;
    let fleet = h.n("fleet");
    // The node's own record is newer than the status (Draining there): describe shows it.
    let record = ttdp_api::node_record::NodeRecord {
        policy: fleet.clone(),
        state: NodeState::Upgrading,
        target: "2.8.0".to_owned(),
        since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        started: None,
        attempts: None,
        reason: None,
        message: None,
    };
    h.set_record("node-3", &record).await;
    let run = h
        .kubectl(&["tt", "driver", "describe", &fleet, "-o", "json"])
        .await
        .ok();
    assert_eq!(run.stderr, "");
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["apiVersion"], "tt-driver.kubectl.tenstorrent.com/v1");
    assert_eq!(doc["kind"], "PolicyDescription");
    assert_eq!(doc["name"], fleet);
    assert_eq!(doc["spec"]["version"], "2.8.0");
    assert_eq!(doc["observedGeneration"], 1);
    assert_eq!(doc["summary"]["failed"], 1);
    assert_eq!(doc["daemonSet"]["name"], format!("ttdrv-{fleet}"));
    assert_eq!(doc["daemonSet"]["ready"], 1);
    let degraded = doc["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .expect("Degraded condition");
    assert_eq!(degraded["status"], "True");
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 9, "{nodes:#?}");
    let node = |short: &str| {
        nodes
            .iter()
            .find(|n| n["name"] == h.n(short))
            .unwrap_or_else(|| panic!("{short} missing"))
    };
    assert_eq!(node("node-3")["state"], "Upgrading");
    assert_eq!(node("node-3")["source"], "nodeRecord");
    assert_eq!(node("node-7")["state"], "Failed");
    assert_eq!(node("node-7")["cordonedBy"], format!("ttdp/{fleet}"));
    assert_eq!(node("node-7")["reason"], "DrainTimeout");
    let pods = doc["agentPods"].as_array().unwrap();
    assert_eq!(pods.len(), 2, "{pods:#?}");
    assert_eq!(pods[0]["node"], h.n("node-6"));
    assert_eq!(
        (&pods[0]["readyContainers"], &pods[0]["containers"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(pods[1]["node"], h.n("node-7"));
    let warning = doc["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["reason"] == "DrainTimeout")
        .expect("the DrainTimeout Event");
    assert_eq!(warning["type"], "Warning");
    assert_eq!(warning["from"], "ttdp-controller");

    let yaml = h
        .kubectl(&["tt", "driver", "describe", &fleet, "-o", "yaml"])
        .await
        .ok();
    let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml.stdout).unwrap();
    for field in [
        "kind",
        "name",
        "spec",
        "summary",
        "conditions",
        "nodes",
        "events",
    ] {
        assert_eq!(
            from_yaml[field], doc[field],
            "yaml and json differ in {field}"
        );
    }
    let page = h.kubectl(&["tt", "driver", "describe", &fleet]).await.ok();
    assert!(
        page.stdout
            .starts_with(&format!("Name:                {fleet}\n")),
        "the page is unchanged without -o:\n{}",
        page.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_finds_the_agent_pod_of_the_node_and_explains_a_missing_one() {
    let h = Harness::populated_with_agents().await;
    let (fleet, node1, node6) = (h.n("fleet"), h.n("node-1"), h.n("node-6"));
    let pods = h.agent_pods("fleet").await;
    let (_, pod6) = pods
        .iter()
        .find(|(n, _)| *n == node6)
        .expect("node-6 runs an agent");

    // node-6 runs the agent pod; the control plane has no kubelet to serve its log (the
    // server cannot even resolve the node's name), so the request ends in the server's error,
    // naming the pod it asked for.
    let run = h
        .kubectl(&[
            "tt",
            "driver",
            "logs",
            &node6,
            "--tail",
            "5",
            "--request-timeout",
            "5s",
        ])
        .await
        .failed();
    assert!(
        run.stderr.starts_with(&format!(
            "error: cannot read the log of agent pod {}/{pod6}: ",
            h.ns()
        )),
        "{}",
        run.stderr
    );
    // The server's own error names the kubelet request it made for the plugin.
    assert!(
        run.stderr.contains(&format!(
            "/containerLogs/{}/{pod6}/agent?tailLines=5",
            h.ns()
        )),
        "{}",
        run.stderr
    );

    let missing = h
        .kubectl(&["tt", "driver", "logs", &node1, "--policy", &fleet])
        .await
        .failed();
    assert!(
        missing.stderr.starts_with(&format!(
            "error: no agent pod of policy {fleet} on node {node1}: the DaemonSet ttdrv-{fleet} runs none there;"
        )),
        "{}",
        missing.stderr
    );
    let any = h.kubectl(&["tt", "driver", "logs", &node1]).await.failed();
    assert!(
        any.stderr
            .starts_with(&format!("error: no agent pod on node {node1}: ")),
        "{}",
        any.stderr
    );
    let node99 = h.n("node-99");
    let unknown = h.kubectl(&["tt", "driver", "logs", &node99]).await.failed();
    assert_eq!(
        unknown.stderr,
        format!("error: nodes \"{node99}\" not found; list nodes with: kubectl get nodes\n")
    );
    let nope = h.n("nope");
    let no_policy = h
        .kubectl(&["tt", "driver", "logs", &node6, "--policy", &nope])
        .await
        .failed();
    assert!(
        no_policy.stderr.contains(&format!("\"{nope}\" not found")),
        "{}",
        no_policy.stderr
    );
}

/// The candidates of a `kubectl __complete ...` answer and its directive line.
fn completions(run: &harness::Run) -> (Vec<String>, String) {
    let mut lines: Vec<String> = run.stdout.lines().map(str::to_owned).collect();
    let directive = lines.pop().unwrap_or_default();
    (lines, directive)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_completes_policy_and_node_names_from_the_cluster() {
    let h = Harness::populated().await;
    let (fleet, canary) = (h.n("fleet"), h.n("canary"));
    let prefix = format!("{}-", h.prefix());
    let run = h
        .kubectl(&["__complete", "tt", "driver", "describe", &prefix])
        .await
        .ok();
    let (names, directive) = completions(&run);
    assert_eq!(names, [canary.clone(), fleet.clone()], "{run:#?}");
    assert_eq!(directive, ":4", "no file names: {run:#?}");

    let node1 = h.n("node-1");
    let run = h
        .kubectl(&["__complete", "tt", "driver", "retry", &fleet, &node1])
        .await
        .ok();
    let (names, _) = completions(&run);
    assert_eq!(names, [h.n("node-1"), h.n("node-10"), h.n("node-11")]);
    let run = h
        .kubectl(&[
            "__complete",
            "tt",
            "driver",
            "logs",
            "--policy",
            &fleet,
            &node1,
        ])
        .await
        .ok();
    assert_eq!(completions(&run).0.len(), 3, "{run:#?}");

    let run = h
        .kubectl(&[
            "__complete",
            "tt",
            "driver",
            "nodes",
            &fleet,
            "--state",
            "fa",
        ])
        .await
        .ok();
    assert_eq!(completions(&run).0, ["Failed"]);
    let run = h.kubectl(&["__complete", "tt", "driver", "lo"]).await.ok();
    assert_eq!(completions(&run).0, ["logs"]);

    // krew's names: `kubectl tt-driver`, completed by kubectl_complete-tt_driver.
    h.link_as_krew();
    let run = h
        .kubectl(&["__complete", "tt-driver", "pause", &prefix])
        .await
        .ok();
    assert_eq!(completions(&run).0, [canary, fleet], "{run:#?}");

    // The static scripts still work.
    let script = h
        .kubectl(&["tt", "driver", "completion", "bash"])
        .await
        .ok();
    assert!(
        script.stdout.contains("logs"),
        "bash completes the new subcommand"
    );
}
