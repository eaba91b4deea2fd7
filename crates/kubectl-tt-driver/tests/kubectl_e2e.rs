//! End-to-end: the real `kubectl` runs the plugin (`kubectl tt driver ...`, found on PATH)
//! against the ttdp-testkit API server holding a populated fleet, for every command.
//!
//! kubectl comes from `.ci/kube-tools` (`~/.local/ttdp-tools/bin/kubectl`) or `TTDP_KUBECTL`;
//! without it these tests fail with instructions rather than skip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;
mod harness;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::io::{AsyncBufReadExt, BufReader};
use ttdp_api::names::annotations;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};
use ttdp_testkit::apiserver::Fault;

use harness::Harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_is_the_default_command() {
    let h = Harness::populated().await;
    let run = h.kubectl(&["tt", "driver"]).await.ok();
    assert_eq!(run.stderr, "", "no warnings when everything is readable");
    let out = &run.stdout;
    assert!(out.starts_with("POLICY "), "{out}");
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
        "Done 2.8.1",
    ] {
        assert!(out.contains(cell), "missing {cell:?} in\n{out}");
    }
    assert!(
        !out.contains('\x1b'),
        "colour when stdout is a pipe:\n{out}"
    );
    assert!(out.contains("fleet: version 2.8.0, matched 9, up-to-date 1, in-progress 4, failed 1"));
    assert!(out.contains("daemonset tt-k8s-driver-manager-system/ttdrv-fleet: 8/9 ready"));
    assert!(out.contains("Degraded=True (NodesFailed)"));

    let explicit = h.kubectl(&["tt", "driver", "status"]).await.ok();
    assert_eq!(explicit.stdout, run.stdout);
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
    assert_eq!(
        wide.stdout
            .lines()
            .filter(|l| l.starts_with("node-"))
            .count(),
        11
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_and_yaml() {
    let h = Harness::populated().await;
    let json = h
        .kubectl(&["tt", "driver", "status", "-o", "json"])
        .await
        .ok();
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(doc["kind"], "Status");
    assert_eq!(doc["policies"][0]["name"], "canary");
    assert_eq!(doc["policies"][1]["name"], "fleet");
    assert_eq!(doc["policies"][1]["failed"], 1);
    assert_eq!(doc["policies"][1]["daemonSet"]["ready"], 8);
    let states: Vec<&str> = doc["policies"][1]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["state"].as_str().unwrap())
        .collect();
    assert_eq!(states.len(), 9);
    assert!(states.contains(&"HostManaged"));

    let yaml = h.kubectl(&["tt", "driver", "-o", "yaml"]).await.ok();
    let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml.stdout).unwrap();
    assert_eq!(from_yaml, doc, "yaml and json carry the same document");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_explains_each_node() {
    let h = Harness::populated().await;
    let run = h.kubectl(&["tt", "driver", "nodes", "fleet"]).await.ok();
    let out = &run.stdout;
    assert!(out.starts_with("POLICY   NODE"), "{out}");
    assert_eq!(out.lines().count(), 10, "header + 9 nodes:\n{out}");
    let failed = out.lines().find(|l| l.contains("node-7")).unwrap();
    assert!(failed.contains("Failed"), "{failed}");
    assert!(failed.contains("2.7.0 → 2.8.0"), "{failed}");
    assert!(
        failed.contains("ttdp/fleet"),
        "cordoned-by from the node annotation: {failed}"
    );
    assert!(
        failed.contains("DrainTimeout: pods ml/trainer-0"),
        "{failed}"
    );
    assert!(!out.contains("canary"));

    let all = h
        .kubectl(&["tt", "driver", "nodes", "-o", "json"])
        .await
        .ok();
    let doc: serde_json::Value = serde_json::from_str(&all.stdout).unwrap();
    assert_eq!(doc["kind"], "NodeList");
    assert_eq!(doc["nodes"].as_array().unwrap().len(), 11);
    let n3 = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "node-3")
        .unwrap();
    assert_eq!(n3["cordonedBy"], "ttdp/fleet");
    assert_eq!(n3["unschedulable"], true);
    assert_eq!(n3["source"], "status");
    let yaml = h
        .kubectl(&["tt", "driver", "nodes", "-o", "yaml"])
        .await
        .ok();
    let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml.stdout).unwrap();
    assert_eq!(from_yaml, doc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_lists_the_nodes_a_large_status_omits() {
    let h = Harness::with_crd().await;
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
    assert!(
        status
            .stdout
            .contains("3 Done and waiting nodes are omitted from status.nodes"),
        "{}",
        status.stdout
    );
    assert!(status.stdout.contains("kubectl tt driver nodes large"));
    let nodes = h.kubectl(&["tt", "driver", "nodes", "large"]).await.ok();
    let row = |n: &str| {
        nodes
            .stdout
            .lines()
            .find(|l| l.contains(n))
            .unwrap_or_else(|| panic!("{n} missing:\n{}", nodes.stdout))
            .to_owned()
    };
    for n in ["big-1", "big-2"] {
        assert!(row(n).contains(" Done "), "{}", nodes.stdout);
    }
    assert!(row("big-3").contains(" Upgrading "), "{}", nodes.stdout);
    assert!(row("big-4").contains(" Pending "), "{}", nodes.stdout);
    assert!(row("big-4").contains("WaitingForSlot"), "{}", nodes.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_shows_spec_conditions_nodes_and_events() {
    let h = Harness::populated().await;
    let run = h.kubectl(&["tt", "driver", "describe", "fleet"]).await.ok();
    assert_eq!(run.stderr, "", "no warnings when everything is readable");
    let out = &run.stdout;
    for part in [
        "Name:                fleet",
        "Version:           2.8.0",
        "DaemonSet:           tt-k8s-driver-manager-system/ttdrv-fleet (desired 9, ready 8",
        "Conditions:",
        "Degraded      True",
        "Nodes:",
        "node-7   Failed",
        "Agent pods:",
        "ttdrv-fleet-node-7",
        "Events:",
        "Warning   DrainTimeout",
        "ttdp-controller",
    ] {
        assert!(out.contains(part), "missing {part:?} in\n{out}");
    }
    // A server without events.k8s.io/v1 (or its field selectors): the Events come from core/v1.
    h.server
        .faults()
        .inject(Fault::error(404).verb("list").resource("events").times(1));
    let fallback = h.kubectl(&["tt", "driver", "describe", "fleet"]).await.ok();
    assert_eq!(fallback.stderr, "");
    for part in ["Events:", "Warning   DrainTimeout", "ttdp-controller"] {
        assert!(
            fallback.stdout.contains(part),
            "missing {part:?} in\n{}",
            fallback.stdout
        );
    }
    let missing = h
        .kubectl(&["tt", "driver", "describe", "nope"])
        .await
        .failed();
    assert!(
        missing
            .stderr
            .contains("error: tenstorrentdriverpolicies.driver.tenstorrent.com \"nope\" not found"),
        "{}",
        missing.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_patch_spec_paused() {
    let h = Harness::populated().await;
    let api: Api<TenstorrentDriverPolicy> = Api::all(h.client.clone());
    let run = h.kubectl(&["tt", "driver", "pause", "fleet"]).await.ok();
    assert_eq!(
        run.stdout,
        "tenstorrentdriverpolicy.driver.tenstorrent.com/fleet paused\n"
    );
    assert!(api.get("fleet").await.unwrap().spec.paused);
    let again = h.kubectl(&["tt", "driver", "pause", "fleet"]).await.ok();
    assert!(again.stdout.contains("already paused"), "{}", again.stdout);
    let status = h.kubectl(&["tt", "driver"]).await.ok();
    assert!(
        status.stdout.contains("failed 1, paused"),
        "{}",
        status.stdout
    );

    h.kubectl(&["tt", "driver", "resume", "fleet"]).await.ok();
    assert!(!api.get("fleet").await.unwrap().spec.paused);
    assert!(
        !api.get("canary").await.unwrap().spec.paused,
        "other policies untouched"
    );
    let missing = h.kubectl(&["tt", "driver", "pause", "nope"]).await.failed();
    assert!(
        missing.stderr.contains("\"nope\" not found"),
        "{}",
        missing.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_annotates_the_failed_node() {
    let h = Harness::populated().await;
    let nodes: Api<Node> = Api::all(h.client.clone());
    let run = h
        .kubectl(&["tt", "driver", "retry", "fleet", "node-7"])
        .await
        .ok();
    assert!(
        run.stdout
            .starts_with("node/node-7 annotated driver.tenstorrent.com/retry=")
    );
    let node = nodes.get("node-7").await.unwrap();
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
    let shown = h.kubectl(&["tt", "driver", "nodes", "fleet"]).await.ok();
    assert!(
        shown.stdout.contains("(retry requested)"),
        "{}",
        shown.stdout
    );

    let not_failed = h
        .kubectl(&["tt", "driver", "retry", "fleet", "node-1"])
        .await
        .failed();
    assert!(
        not_failed
            .stderr
            .contains("error: node node-1 is Pending in policy fleet, not Failed"),
        "{}",
        not_failed.stderr
    );
    let n1 = nodes.get("node-1").await.unwrap();
    assert!(
        !n1.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(annotations::RETRY),
        "no annotation on a node that was refused"
    );
    let unknown = h
        .kubectl(&["tt", "driver", "retry", "fleet", "node-99"])
        .await
        .failed();
    assert!(
        unknown.stderr.contains("node node-99 is not listed"),
        "{}",
        unknown.stderr
    );
}

/// Reads lines from a child's stdout until one contains `needle` (bounded).
async fn read_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    needle: &str,
    seen: &mut String,
) {
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(needle) {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(found, Ok(true)),
        "watch output never showed {needle:?}; got:\n{seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_redraws_when_the_status_changes() {
    let h = Harness::populated().await;
    for args in [
        vec!["tt", "driver", "watch"],
        vec!["tt", "driver", "nodes", "fleet", "--watch"],
    ] {
        let mut child = h.command(&args).spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = String::new();
        read_until(&mut lines, "Draining", &mut seen).await;
        assert!(!seen.contains("Failed 2.9.9") && !seen.contains("2.9.9"));
        h.set_node_state("fleet", "node-3", NodeState::Failed, "2.9.9")
            .await;
        read_until(&mut lines, "2.9.9", &mut seen).await;
        h.set_node_state("fleet", "node-3", NodeState::Draining, "2.7.0")
            .await;
        child.kill().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_read_like_kubectl() {
    // No CRD.
    let bare = Harness::bare().await;
    let run = bare.kubectl(&["tt", "driver"]).await.failed();
    assert_eq!(
        run.stderr,
        "error: the TenstorrentDriverPolicy CRD is not installed; install the chart\n"
    );
    let run = bare
        .kubectl(&["tt", "driver", "describe", "x"])
        .await
        .failed();
    assert!(
        run.stderr.contains("CRD is not installed"),
        "{}",
        run.stderr
    );

    // CRD, no policies: kubectl's "No resources found", on stderr, success.
    let empty = Harness::with_crd().await;
    let run = empty.kubectl(&["tt", "driver"]).await.ok();
    assert_eq!(run.stdout, "");
    assert!(
        run.stderr
            .starts_with("No TenstorrentDriverPolicy resources found."),
        "{}",
        run.stderr
    );
    let run = empty.kubectl(&["tt", "driver", "-o", "json"]).await.ok();
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["policies"], serde_json::json!([]));

    // RBAC forbidden.
    empty.server.faults().inject(
        Fault::error(403)
            .verb("list")
            .resource("tenstorrentdriverpolicies"),
    );
    let run = empty.kubectl(&["tt", "driver"]).await.failed();
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
        ttdp_testkit_kubeconfig(&format!("http://127.0.0.1:{port}")),
    )
    .unwrap();
    let mut cmd = empty.command(&["tt", "driver", "--request-timeout", "10s"]);
    cmd.env("KUBECONFIG", &config);
    let run = empty.run(cmd).await.failed();
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
    let run = empty
        .kubectl(&["tt", "driver", "--context", "no-such-context"])
        .await
        .failed();
    assert!(
        run.stderr.starts_with("error: cannot load the kubeconfig"),
        "{}",
        run.stderr
    );
}

fn ttdp_testkit_kubeconfig(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {{}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_and_context_flags_select_the_cluster() {
    let h = Harness::populated().await;
    let path = h.server.kubeconfig_path().to_str().unwrap().to_owned();
    let mut cmd = h.command(&[
        "tt",
        "driver",
        "--kubeconfig",
        &path,
        "--context",
        ttdp_testkit::apiserver::KUBECONFIG_CONTEXT,
        "nodes",
    ]);
    cmd.env("KUBECONFIG", "/nonexistent/kubeconfig");
    let run = h.run(cmd).await.ok();
    assert!(run.stdout.contains("node-7"), "{}", run.stdout);

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
    let h = Harness::bare().await;
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
    let h = Harness::with_crd().await;
    let mut child = h.command(&["tt", "driver", "watch"]).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    read_until(
        &mut lines,
        "No TenstorrentDriverPolicy resources found",
        &mut seen,
    )
    .await;
    for view in fixture::narrow().policies {
        h.create_policy(&view.policy).await;
    }
    read_until(&mut lines, "Draining 2.7.0", &mut seen).await;
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
        .env("KUBECONFIG", h.server.kubeconfig_path())
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
    let tty = on_a_terminal(&h, "tt driver", &[]).await.ok();
    for code in ["\x1b[32m", "\x1b[36m", "\x1b[33m", "\x1b[31m", "\x1b[90m"] {
        assert!(
            tty.stdout.contains(code),
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
    let no_color_flag = on_a_terminal(&h, "tt driver nodes --no-color", &[])
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
    h.server
        .faults()
        .inject(Fault::error(403).verb("list").resource("nodes"));
    let run = h.kubectl(&["tt", "driver", "nodes", "fleet"]).await.ok();
    assert!(
        run.stderr.starts_with("warning: cannot read nodes"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains("node-7"),
        "still lists the status: {}",
        run.stdout
    );

    h.server.faults().inject(
        Fault::error(401)
            .verb("get")
            .resource("tenstorrentdriverpolicies")
            .times(1),
    );
    let run = h
        .kubectl(&["tt", "driver", "describe", "fleet"])
        .await
        .failed();
    assert_eq!(
        run.stderr,
        "error: you must be logged in to the server (Unauthorized); check the credentials of your kubeconfig context\n"
    );

    h.server.faults().inject(
        Fault::error(500)
            .verb("list")
            .resource("tenstorrentdriverpolicies"),
    );
    let run = h.kubectl(&["tt", "driver"]).await.failed();
    assert!(
        run.stderr.starts_with(
            "error: the server could not list tenstorrentdriverpolicies.driver.tenstorrent.com"
        ),
        "{}",
        run.stderr
    );
}
