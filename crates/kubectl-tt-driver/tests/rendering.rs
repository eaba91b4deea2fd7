//! Golden-output tests of every view: status (narrow and wide fleets, `-o wide`), nodes,
//! describe, with and without colour, and the JSON/YAML documents.
//!
//! The expected output lives in `tests/golden/*.txt`. After an intended change, re-bless with
//! `TTDP_BLESS_GOLDEN=1 cargo test -p kubectl-tt-driver --test rendering` and review the diff.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::path::PathBuf;

use kubectl_tt_driver::cli::Output;
use kubectl_tt_driver::fleet::Fleet;
use kubectl_tt_driver::palette::Palette;
use kubectl_tt_driver::render::{RenderOptions, describe};
use kubectl_tt_driver::report;
use kubectl_tt_driver::view::{self, Request, View};
use ttdp_api::NodeState;

/// The environment variable that rewrites the golden files instead of comparing.
const BLESS: &str = "TTDP_BLESS_GOLDEN";

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.txt"));
    if std::env::var_os(BLESS).is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read golden file {}: {e}; create it with {BLESS}=1",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{name} differs from {}; if the change is intended, re-bless with {BLESS}=1\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}

fn opts(colour: bool, width: usize) -> RenderOptions {
    RenderOptions {
        palette: if colour {
            Palette::COLOUR
        } else {
            Palette::PLAIN
        },
        width,
        now: fixture::now(),
    }
}

fn text(fleet: &Fleet, view: View, output: Output, o: &RenderOptions) -> String {
    view::render(fleet, view, output, o).unwrap()
}

#[test]
fn status_narrow_fleet() {
    let fleet = fixture::narrow();
    golden(
        "status_narrow_plain",
        &text(&fleet, View::Status, Output::Table, &opts(false, 80)),
    );
    golden(
        "status_narrow_colour",
        &text(&fleet, View::Status, Output::Table, &opts(true, 80)),
    );
}

#[test]
fn status_every_state_wraps_into_blocks() {
    let fleet = fixture::every_state();
    let plain = text(&fleet, View::Status, Output::Table, &opts(false, 80));
    golden("status_every_state_plain", &plain);
    golden(
        "status_every_state_colour",
        &text(&fleet, View::Status, Output::Table, &opts(true, 80)),
    );
    for state in NodeState::ALL {
        assert!(plain.contains(state.as_str()), "{state} missing:\n{plain}");
    }
    // The table (everything before the summary lines) fits the terminal; free-text notes may not.
    for line in plain.lines().take_while(|l| !l.starts_with("canary:")) {
        assert!(line.chars().count() <= 80, "line wider than 80: {line:?}");
    }
    let blocks = plain.lines().filter(|l| l.starts_with("POLICY")).count();
    assert!(
        blocks > 1,
        "11 nodes do not fit 80 columns in one block:\n{plain}"
    );
}

#[test]
fn status_wide_terminal_uses_one_block() {
    let fleet = fixture::every_state();
    let plain = text(&fleet, View::Status, Output::Table, &opts(false, 400));
    golden("status_every_state_width400", &plain);
    assert_eq!(plain.lines().filter(|l| l.starts_with("POLICY")).count(), 1);
}

#[test]
fn status_per_node_table() {
    let fleet = fixture::every_state();
    golden(
        "status_every_state_o_wide_plain",
        &text(&fleet, View::Status, Output::Wide, &opts(false, 80)),
    );
    golden(
        "status_every_state_o_wide_colour",
        &text(&fleet, View::Status, Output::Wide, &opts(true, 80)),
    );
}

#[test]
fn status_explains_what_needs_attention() {
    let fleet = fixture::attention();
    let plain = text(&fleet, View::Status, Output::Table, &opts(false, 80));
    golden("status_attention_plain", &plain);
    golden(
        "status_attention_colour",
        &text(&fleet, View::Status, Output::Table, &opts(true, 80)),
    );
    assert!(plain.contains("3 Done and waiting nodes are omitted"));
    assert!(plain.contains("kubectl tt driver nodes large"));
    assert!(plain.contains("no status yet"));
    assert!(plain.contains("InvalidSpec=True"));
    assert!(plain.contains("generation 1, the spec is at generation 3"));
}

#[test]
fn nodes_every_state() {
    let fleet = fixture::every_state();
    let plain = text(&fleet, View::Nodes, Output::Table, &opts(false, 80));
    golden("nodes_every_state_plain", &plain);
    golden(
        "nodes_every_state_colour",
        &text(&fleet, View::Nodes, Output::Table, &opts(true, 80)),
    );
    assert!(plain.contains("2.7.0 → 2.8.0"));
    assert!(plain.contains("ttdp/fleet"));
    assert!(plain.contains("(retry requested)"));
}

#[test]
fn nodes_lists_omitted_nodes_from_labels() {
    let fleet = fixture::attention();
    let plain = text(&fleet, View::Nodes, Output::Table, &opts(false, 80));
    golden("nodes_attention_plain", &plain);
    let row = |n: &str| {
        plain
            .lines()
            .find(|l| l.contains(n))
            .unwrap_or_else(|| panic!("{n} missing:\n{plain}"))
    };
    for n in ["big-001", "big-002"] {
        assert!(row(n).contains(" Done "), "{}", row(n));
    }
    assert!(row("big-003").contains(" Upgrading "), "{}", row("big-003"));
    // Omitted but not at spec.version: waiting for a slot.
    assert!(row("big-004").contains(" Pending "), "{}", row("big-004"));
    assert!(
        row("big-004").contains("WaitingForSlot"),
        "{}",
        row("big-004")
    );
    golden(
        "nodes_attention_json",
        &text(&fleet, View::Nodes, Output::Json, &opts(false, 80)),
    );
}

#[test]
fn describe_policy() {
    let fleet = fixture::every_state();
    let view = fleet.policy("fleet").unwrap();
    let rows: Vec<_> = fleet
        .node_rows()
        .into_iter()
        .filter(|r| r.policy == "fleet")
        .collect();
    let events = fixture::events();
    let pods = fixture::pods();
    let plain = describe::render(view, &rows, &pods, &events, &opts(false, 80));
    golden("describe_plain", &plain);
    golden(
        "describe_colour",
        &describe::render(view, &rows, &pods, &events, &opts(true, 80)),
    );
    assert!(plain.contains("node-7   ttdrv-fleet-b7d2m   0/1     CrashLoopBackOff   4"));
    let empty = describe::render(
        fixture::attention().policy("fresh").unwrap(),
        &[],
        &[],
        &[],
        &opts(false, 80),
    );
    golden("describe_no_status_plain", &empty);
}

#[test]
fn machine_output_has_stable_fields() {
    let fleet = fixture::every_state();
    golden(
        "status_every_state_json",
        &text(&fleet, View::Status, Output::Json, &opts(true, 80)),
    );
    golden(
        "status_narrow_yaml",
        &text(
            &fixture::narrow(),
            View::Status,
            Output::Yaml,
            &opts(true, 80),
        ),
    );
    golden(
        "nodes_every_state_yaml",
        &text(&fleet, View::Nodes, Output::Yaml, &opts(true, 80)),
    );
    let json = text(&fleet, View::Status, Output::Json, &opts(true, 80));
    assert!(!json.contains('\x1b'), "colour codes leaked into json");
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["policies"][1]["name"], "fleet");
    assert_eq!(doc["policies"][1]["nodes"][6]["state"], "Failed");
    assert_eq!(doc["policies"][1]["failed"], 1);
}

#[test]
fn plain_output_has_no_escape_codes_and_colour_output_has_them() {
    let fleet = fixture::every_state();
    for view in [View::Status, View::Nodes] {
        let plain = text(&fleet, view, Output::Table, &opts(false, 80));
        assert!(!plain.contains('\x1b'));
        let colour = text(&fleet, view, Output::Table, &opts(true, 80));
        for code in ["\x1b[32m", "\x1b[36m", "\x1b[33m", "\x1b[31m", "\x1b[90m"] {
            assert!(colour.contains(code), "{view:?} lacks {code:?}");
        }
    }
}

/// Correctness at fleet scale; speed is measured by the benchmarks, not here.
#[test]
fn status_of_a_thousand_nodes() {
    let fleet = fixture::thousand(1000);
    let width = 120;
    let plain = text(&fleet, View::Status, Output::Table, &opts(false, width));
    let mut headers = 0;
    let mut names = Vec::new();
    for line in plain.lines().take_while(|l| !l.starts_with("fleet:")) {
        assert!(
            line.chars().count() <= width,
            "line wider than {width}: {line:?}"
        );
        if let Some(rest) = line.strip_prefix("POLICY") {
            headers += 1;
            names.extend(rest.split_whitespace().map(str::to_owned));
        }
    }
    let expected: Vec<String> = (0..1000).map(|i| format!("tt-{i:04}")).collect();
    assert_eq!(names, expected, "every node once, in sorted order");
    assert!(headers > 1);
    let cells: usize = plain
        .lines()
        .filter(|l| l.starts_with("fleet "))
        .map(|l| l.split("   ").skip(1).count())
        .sum();
    assert_eq!(cells, 1000, "one cell per node");
    assert!(plain.contains("fleet: version 2.8.0, matched 1000, up-to-date 911"));

    let wide = text(&fleet, View::Status, Output::Wide, &opts(false, width));
    assert_eq!(wide.lines().filter(|l| l.starts_with("tt-")).count(), 1000);
    let nodes = text(&fleet, View::Nodes, Output::Table, &opts(false, width));
    assert_eq!(
        nodes.lines().filter(|l| l.starts_with("fleet ")).count(),
        1000
    );
}

/// What a downloaded module must pass shows as the policy sets it: pins, the server's checksum,
/// plain http, redirects and the CA.
#[test]
fn describe_shows_how_prebuilt_modules_are_trusted() {
    use ttdp_api::driver::v1alpha1::{CaBundleSource, PinnedChecksum, PrebuiltSettings};
    let fleet = fixture::every_state();
    let mut view = fleet.policy("fleet").unwrap().clone();
    let pin = |release: &str| PinnedChecksum {
        version: "2.8.0".into(),
        kernel_release: release.into(),
        sha256: "0".repeat(64),
    };
    view.policy.spec.source = Some(ttdp_api::driver::v1alpha1::SourceSettings {
        repository: None,
        commit: None,
        prebuilt: Some(PrebuiltSettings {
            url: "http://mirror.lan/{version}/{kernelRelease}/tenstorrent.ko".into(),
            fallback: "Build".into(),
            ca_bundle: Some(CaBundleSource {
                config_map_name: Some("mirror-ca".into()),
                secret_name: None,
                key: "ca.crt".into(),
            }),
            checksums: vec![pin("6.8.0-111-generic"), pin("5.15.0-140-generic")],
            trust_server_checksum: false,
            allow_insecure_http: true,
            allow_cross_host_redirects: true,
        }),
    });
    let text = describe::render(&view, &[], &[], &[], &opts(false, 200));
    let trust = text
        .lines()
        .find(|l| l.trim_start().starts_with("Prebuilt trust:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        trust.ends_with(
            "2 pinned checksums, unpinned modules refused; plain http allowed, redirects to other hosts followed; CA from ConfigMap mirror-ca key ca.crt"
        ),
        "{trust}"
    );
}

/// The policy's source and module parameters, and each node's loaded parameters and the commit
/// its module was built from, appear only when set (the goldens above have none).
#[test]
fn describe_shows_parameters_and_commits_when_set() {
    let fleet = fixture::every_state();
    let mut view = fleet.policy("fleet").unwrap().clone();
    view.policy.spec.module = Some(ttdp_api::driver::v1alpha1::ModuleSettings {
        parameters: vec!["reset_limit=5".into()],
        signing: None,
    });
    view.policy.spec.source = Some(ttdp_api::driver::v1alpha1::SourceSettings {
        repository: Some("https://git.example.com/mirrors/tt-kmd.git".into()),
        commit: Some("0123456789abcdef0123456789abcdef01234567".into()),
        prebuilt: Some(ttdp_api::driver::v1alpha1::PrebuiltSettings {
            url: "https://ko.example.com/{version}/{kernelRelease}/tenstorrent.ko".into(),
            fallback: "Fail".into(),
            ca_bundle: None,
            checksums: Vec::new(),
            trust_server_checksum: true,
            allow_insecure_http: false,
            allow_cross_host_redirects: false,
        }),
    });
    let mut rows: Vec<_> = fleet
        .node_rows()
        .into_iter()
        .filter(|r| r.policy == "fleet")
        .collect();
    rows[0].loaded_parameters = Some("auto_reset=Y reset_limit=5".into());
    rows[0].source_commit = Some("0123456789abcdef0123456789abcdef01234567".into());
    let text = describe::render(&view, &rows, &[], &[], &opts(false, 200));
    assert!(text.contains("Module parameters:"), "{text}");
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("Prebuilt:")
            && l.ends_with(
                "https://ko.example.com/{version}/{kernelRelease}/tenstorrent.ko (fail if missing)"
            )),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("Prebuilt trust:")
            && l.ends_with(
                "no pinned checksum, the server's .sha256 trusted for the rest; https only, no redirect to another host"
            )),
        "{text}"
    );
    assert!(text.contains("reset_limit=5"), "{text}");
    assert!(
        text.contains(
            "https://git.example.com/mirrors/tt-kmd.git (0123456789abcdef0123456789abcdef01234567)"
        ),
        "{text}"
    );
    let header = text
        .lines()
        .find(|l| l.contains("NODE") && l.contains("STATE"))
        .unwrap();
    assert!(
        header.contains("PARAMETERS") && header.contains("COMMIT"),
        "{header}"
    );
    let first = text
        .lines()
        .find(|l| l.contains(&rows[0].node) && l.contains("auto_reset=Y reset_limit=5"));
    let first = first.unwrap_or_else(|| panic!("no row with the parameters: {text}"));
    assert!(
        first.contains(" 0123456789ab "),
        "abbreviated commit: {first}"
    );
}

/// Whose udev rule each node has shows in a UDEV-RULE column, only when a node reports one.
#[test]
fn describe_shows_whose_udev_rule_a_node_has() {
    let fleet = fixture::every_state();
    let view = fleet.policy("fleet").unwrap().clone();
    let mut rows: Vec<_> = fleet
        .node_rows()
        .into_iter()
        .filter(|r| r.policy == "fleet")
        .collect();
    let plain = describe::render(&view, &rows, &[], &[], &opts(false, 200));
    assert!(!plain.contains("UDEV-RULE"), "{plain}");
    rows[0].udev_rule = Some("/etc/udev/rules.d/50-tenstorrent.rules (tt-kmd 2.8.0)".into());
    rows[1].udev_rule =
        Some("/etc/udev/rules.d/50-tenstorrent.rules (not ttdp's, left as is)".into());
    let text = describe::render(&view, &rows, &[], &[], &opts(false, 200));
    let header = text
        .lines()
        .find(|l| l.contains("NODE") && l.contains("STATE"))
        .unwrap();
    assert!(header.contains("UDEV-RULE"), "{header}");
    let row = |node: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(node))
            .unwrap_or_else(|| panic!("no row for {node}: {text}"))
            .to_owned()
    };
    assert!(row(&rows[0].node).contains("tt-kmd 2.8.0"), "{text}");
    assert!(
        row(&rows[1].node).contains("not ttdp's, left as is"),
        "{text}"
    );
}

#[test]
fn describe_document_carries_the_pages_facts() {
    let fleet = fixture::every_state();
    let view = fleet.policy("fleet").unwrap();
    let rows: Vec<_> = fleet
        .node_rows()
        .into_iter()
        .filter(|r| r.policy == "fleet")
        .collect();
    let (pods, events) = (fixture::pods(), fixture::events());
    let doc = report::describe_report(view, &rows, &pods, &events);
    let json = view::json(&doc).unwrap();
    golden("describe_json", &json);
    let yaml = view::yaml(&doc).unwrap();
    golden("describe_yaml", &yaml);
    let from_json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(from_json, from_yaml, "one document, two encodings");
    assert_eq!(from_json["kind"], "PolicyDescription");
    assert_eq!(from_json["nodes"].as_array().unwrap().len(), rows.len());
    assert_eq!(
        from_json["nodes"],
        serde_json::to_value(report::nodes_report(&rows)).unwrap()["nodes"],
        "the nodes as `nodes -o json` lists them"
    );
    assert_eq!(from_json["agentPods"].as_array().unwrap().len(), pods.len());
    let page = describe::render(view, &rows, &pods, &events, &opts(false, 400));
    for e in from_json["events"].as_array().unwrap() {
        assert!(
            page.contains(e["message"].as_str().unwrap()),
            "an Event the page does not show: {e}"
        );
    }
    let fresh = fixture::attention();
    let empty = report::describe_report(fresh.policy("fresh").unwrap(), &[], &[], &[]);
    let empty = serde_json::to_value(empty).unwrap();
    assert_eq!(empty["summary"], serde_json::Value::Null);
    assert_eq!(empty["conditions"], serde_json::json!([]));
}

#[test]
fn nodes_state_filter_keeps_only_those_states() {
    let fleet = fixture::every_state();
    let states = [NodeState::Failed, NodeState::Conflict];
    let request = |output| Request {
        view: View::Nodes,
        only: None,
        output,
        states: &states,
    };
    let plain = view::render_request(&fleet, &request(Output::Table), &opts(false, 80)).unwrap();
    golden("nodes_state_failed_conflict_plain", &plain);
    let json = view::render_request(&fleet, &request(Output::Json), &opts(false, 80)).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let shown: Vec<&str> = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["state"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = fleet
        .node_rows()
        .iter()
        .filter(|r| states.contains(&r.state))
        .map(|r| r.state.as_str())
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(shown, expected);
    let every = view::render_request(
        &fleet,
        &Request {
            states: &[],
            ..request(Output::Table)
        },
        &opts(false, 80),
    )
    .unwrap();
    assert_eq!(
        every,
        text(&fleet, View::Nodes, Output::Table, &opts(false, 80)),
        "no filter: every node"
    );
}

/// The kernels a node would boot into without a ready module and its module's signer show in
/// describe (NEXT-KERNELS and SIGNER columns, and why each kernel is not ready) and in nodes (a
/// NEXT-KERNELS column), and the status summary shows `KernelsReady=False`; a fleet whose nodes
/// report none of it reads as before.
#[test]
fn kernels_without_a_module_and_signers_show_in_every_view() {
    use ttdp_api::driver::v1alpha1::{KernelNotReady, NextKernelState, NextKernels, condition};
    let mut fleet = fixture::every_state();
    let before = text(&fleet, View::Nodes, Output::Table, &opts(false, 200));
    assert!(!before.contains("NEXT-KERNELS"), "{before}");
    let summary_before = text(&fleet, View::Status, Output::Table, &opts(false, 200));
    assert!(!summary_before.contains("KernelsReady"), "{summary_before}");
    let fleet_view = fleet
        .policies
        .iter_mut()
        .find(|p| p.policy.metadata.name.as_deref() == Some("fleet"))
        .unwrap();
    let status = fleet_view.policy.status.as_mut().unwrap();
    let failed = NextKernels {
        ready: 1,
        not_ready: vec![KernelNotReady {
            release: "6.1.0-58-amd64".into(),
            state: NextKernelState::Failed,
            reason: Some("BuildFailed".into()),
            message: Some("make modules failed: missing linux-headers-6.1.0-58-amd64".into()),
        }],
        not_ready_omitted: 0,
    };
    status.nodes[0].next_kernels = Some(failed);
    status.nodes[0].module_signer = Some("ttdp module signing".into());
    status.nodes[1].next_kernels = Some(NextKernels {
        ready: 2,
        ..NextKernels::default()
    });
    status.conditions.push(fixture::cond(
        condition::KERNELS_READY,
        false,
        "NextKernelWithoutDriver",
        "1 node would boot without tt-kmd 2.8.0: kernel 6.1.0-58-amd64 on node-1 (make modules failed)",
    ));
    let (first, second) = (status.nodes[0].name.clone(), status.nodes[1].name.clone());

    let summary = text(&fleet, View::Status, Output::Table, &opts(false, 200));
    assert!(
        summary.contains(
            "  KernelsReady=False (NextKernelWithoutDriver): 1 node would boot without tt-kmd 2.8.0: kernel 6.1.0-58-amd64 on node-1"
        ),
        "{summary}"
    );
    // A table row: the node's name in its first or second column (after the policy).
    let row_of = |text: &str, node: &str| {
        text.lines()
            .find(|l| l.split_whitespace().take(2).any(|w| w == node))
            .unwrap_or_else(|| panic!("no row for {node}: {text}"))
            .to_owned()
    };
    let nodes = text(&fleet, View::Nodes, Output::Table, &opts(false, 200));
    let header: Vec<&str> = nodes.lines().next().unwrap().split_whitespace().collect();
    assert!(
        header
            .windows(3)
            .any(|w| w == ["MODE", "NEXT-KERNELS", "CORDONED-BY"]),
        "{nodes}"
    );
    assert!(
        row_of(&nodes, &first).contains("6.1.0-58-amd64 BuildFailed; 1 ready"),
        "{nodes}"
    );
    assert!(row_of(&nodes, &second).contains("2 ready"), "{nodes}");

    let view = fleet.policy("fleet").unwrap().clone();
    let rows: Vec<_> = fleet
        .node_rows()
        .into_iter()
        .filter(|r| r.policy == "fleet")
        .collect();
    let page = describe::render(&view, &rows, &[], &[], &opts(false, 250));
    let header = page
        .lines()
        .find(|l| l.contains("NODE") && l.contains("STATE"))
        .unwrap();
    assert!(
        header.contains("NEXT-KERNELS") && header.contains("SIGNER"),
        "{header}"
    );
    assert!(
        row_of(&page, &first).contains("ttdp module signing"),
        "{page}"
    );
    assert!(
        page.contains(
            "Kernels without a ready module (the node would boot into them without the driver):\n  node-1: kernel 6.1.0-58-amd64 Failed (BuildFailed): make modules failed: missing linux-headers-6.1.0-58-amd64\n"
        ),
        "{page}"
    );
    assert!(page.contains("KernelsReady"), "{page}");
}
