//! The targets of the drain suite checked against its figures, every suite's failure named, and
//! the figures as Markdown tables (the format of docs/benchmarks.md). The fleet's own targets
//! and table are in [`super::fleet_targets`].

use std::fmt::Write as _;

use serde_json::Value;

use super::machine::Machine;

/// ttdp-drain's wall time over `kubectl drain`'s, by pods on the drained node (issue 22).
const DRAIN_RATIO_LIMITS: [(u64, f64); 2] = [(100, 0.15), (500, 0.05)];
/// How `ttdp-bench fleet` names the real control plane in its results.
pub const REAL_SERVER: &str = "real control plane";

/// Whether a fleet result ran on the real control plane.
fn on_real_server(result: &Value) -> bool {
    result["server"] == REAL_SERVER
}

pub(super) fn suites<'a>(
    results: &'a [Value],
    name: &'a str,
) -> impl Iterator<Item = &'a Value> + 'a {
    results.iter().filter(move |r| r["suite"] == name)
}

/// `value < limit`; false for a missing figure (NaN).
pub(super) fn below(value: f64, limit: f64) -> bool {
    value < limit
}

pub(super) fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Every suite that did not finish and every missed drain target, named (empty when all are
/// met).
pub fn check(results: &[Value]) -> Vec<String> {
    let mut missed: Vec<String> = results
        .iter()
        .filter_map(|r| {
            let on = r["server"]
                .as_str()
                .map(|s| format!(" on the {s}"))
                .unwrap_or_default();
            Some(format!(
                "{} suite{on} did not finish: {}",
                r["suite"].as_str().unwrap_or("a"),
                r["error"].as_str()?
            ))
        })
        .collect();
    for d in suites(results, "drain") {
        missed.extend(missed_drain_targets(d));
    }
    missed
}

/// A drain's missed targets: at every size both tools removed the same pods and the budget was
/// never violated; at 100 and 500 pods ttdp-drain is within its ratio of kubectl's time.
fn missed_drain_targets(d: &Value) -> Vec<String> {
    let mut missed = Vec::new();
    for s in d["sizes"].as_array().into_iter().flatten() {
        let pods = s["pods"].as_u64().unwrap_or(0);
        if s["same_removed_set"] != true {
            missed.push(format!("drain {pods}: the tools removed different pods"));
        }
        for tool in ["kubectl", "ttdp"] {
            if s[tool]["budget_violated"] != false {
                missed.push(format!(
                    "drain {pods}: the budget was violated during the {tool} drain"
                ));
            }
        }
        let ratio = num(&s["wall_ratio_ttdp_over_kubectl"]);
        let limit = DRAIN_RATIO_LIMITS.iter().find(|(p, _)| *p == pods);
        if let Some((_, limit)) = limit
            && !below(ratio, limit + f64::EPSILON)
        {
            missed.push(format!(
                "drain {pods}: ttdp-drain took {ratio:.3} × kubectl's time (target ≤ {limit})"
            ));
        }
    }
    missed
}

/// The figures as Markdown tables, each headed by the commit and machine.
pub fn render(results: &[Value], machine: &Machine) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n## Results\n\n{}\n", machine.header());
    if suites(results, "fleet").next().is_some() {
        out.push_str(&super::fleet_targets::render_runs(results, machine));
        render_plugin(&mut out, results, machine);
    }
    for w in suites(results, "status_write").filter(|w| w.get("error").is_none()) {
        render_status_write(&mut out, w, machine);
    }
    for d in suites(results, "drain") {
        render_drain(&mut out, d, machine);
    }
    for s in suites(results, "swap") {
        render_swap(&mut out, s, machine);
    }
    for vm in suites(results, "swap-vm").filter(|v| v.get("error").is_none()) {
        render_swap_vm(&mut out, vm, suites(results, "swap").next(), machine);
    }
    out
}

/// Completed fleet runs, by size, the real control plane's before any other.
pub(super) fn completed_fleets(results: &[Value]) -> Vec<&Value> {
    let mut fleets: Vec<&Value> = suites(results, "fleet")
        .filter(|f| f["completed"] == true)
        .collect();
    fleets.sort_by_key(|f| (f["nodes"].as_u64().unwrap_or(0), !on_real_server(f)));
    fleets
}

/// The server column.
pub(super) fn server_cell(f: &Value) -> &str {
    f["server"].as_str().unwrap_or("imitation")
}

/// The `kubectl tt driver` table of the fleets that timed the plugin.
fn render_plugin(out: &mut String, results: &[Value], machine: &Machine) {
    let fleets = completed_fleets(results);
    let plugins: Vec<&&Value> = fleets.iter().filter(|f| f["plugin"].is_object()).collect();
    if !plugins.is_empty() {
        let _ = writeln!(
            out,
            "\n### `kubectl tt driver` wall time, median (commit {})\n",
            machine.commit
        );
        let _ = writeln!(
            out,
            "| TT nodes (+plain) | server | status | nodes POLICY | describe POLICY |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        for f in plugins {
            let p = &f["plugin"];
            let _ = writeln!(
                out,
                "| {} (+{}) | {} | {:.0} ms | {:.0} ms | {:.0} ms |",
                f["nodes"],
                f["plain_nodes"],
                server_cell(f),
                num(&p["status"]["median_ms"]),
                num(&p["nodes"]["median_ms"]),
                num(&p["describe"]["median_ms"])
            );
        }
    }
}

/// One status write alone, by the number of node entries listed.
fn render_status_write(out: &mut String, w: &Value, machine: &Machine) {
    let _ = writeln!(
        out,
        "\n### One status write alone, idle {}, {} writes each (commit {})\n",
        w["server"].as_str().unwrap_or("server"),
        w["writes"],
        machine.commit
    );
    let _ = writeln!(out, "| node entries | status | write p50 / p95 / max |");
    let _ = writeln!(out, "|---|---|---|");
    for size in w["sizes"].as_array().into_iter().flatten() {
        let took = &size["write_ms"];
        let _ = writeln!(
            out,
            "| {} | {:.1} KiB | {:.0} / {:.0} / {:.0} ms |",
            size["entries"],
            num(&size["status_bytes"]) / 1024.0,
            num(&took["p50"]),
            num(&took["p95"]),
            num(&took["max"])
        );
    }
}

/// One drain suite: ttdp-drain against kubectl drain.
fn render_drain(out: &mut String, d: &Value, machine: &Machine) {
    let _ = writeln!(
        out,
        "\n### Drain: ttdp-drain vs kubectl drain v1.35 (commit {})\n",
        machine.commit
    );
    let _ = writeln!(
        out,
        "| pods on the node | kubectl wall | ttdp wall | wall ratio ttdp/kubectl | kubectl requests (r/w) | ttdp requests (r/w) | request ratio |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for s in d["sizes"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "| {} | {:.0} ms | {:.0} ms | {:.2} | {} ({}/{}) | {} ({}/{}) | {:.2} |",
            s["pods"],
            num(&s["kubectl"]["wall_ms"]),
            num(&s["ttdp"]["wall_ms"]),
            num(&s["wall_ratio_ttdp_over_kubectl"]),
            s["kubectl"]["reads"].as_u64().unwrap_or(0)
                + s["kubectl"]["writes"].as_u64().unwrap_or(0),
            s["kubectl"]["reads"],
            s["kubectl"]["writes"],
            s["ttdp"]["reads"].as_u64().unwrap_or(0) + s["ttdp"]["writes"].as_u64().unwrap_or(0),
            s["ttdp"]["reads"],
            s["ttdp"]["writes"],
            num(&s["requests_ratio_ttdp_over_kubectl"]),
        );
    }
    let b = &d["pdb_blocked"];
    let _ = writeln!(
        out,
        "\nBlocked by a PodDisruptionBudget for {} s: kubectl {:.2} evictions/s ({:.2} requests/s), ttdp-drain {:.2} evictions/s ({:.2} requests/s).",
        b["seconds"],
        num(&b["kubectl"]["evictions_per_s"]),
        num(&b["kubectl"]["requests_per_s"]),
        num(&b["ttdp"]["evictions_per_s"]),
        num(&b["ttdp"]["requests_per_s"]),
    );
}

/// The host swap suite, on a simulated kernel.
fn render_swap(out: &mut String, s: &Value, machine: &Machine) {
    let _ = writeln!(
        out,
        "\n### Node swap on the host, simulated kernel, median of {} (commit {})\n",
        s["runs"], machine.commit
    );
    let _ = writeln!(
        out,
        "| case | probe | build | unload | load | label | start to ready |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    out.push_str(&case_rows(
        s,
        &SWAP_CASES,
        &[
            ("probe_ms", 0),
            ("build_ms", 0),
            ("unload_ms", 0),
            ("load_ms", 0),
            ("label_ms", 1),
            ("start_to_ready_ms", 0),
        ],
    ));
}

/// The real-kernel swap, and start to ready from it and the `host` swap suite.
fn render_swap_vm(out: &mut String, vm: &Value, host: Option<&Value>, machine: &Machine) {
    let _ = writeln!(
        out,
        "\n### Node swap on a real kernel ({} under QEMU without KVM), median of {} (commit {})\n",
        vm["release"].as_str().unwrap_or("?"),
        vm["runs"],
        machine.commit
    );
    let _ = writeln!(
        out,
        "| case | probe | cache lookup | unload | load | swap |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    out.push_str(&case_rows(
        vm,
        &SWAP_CASES[..2],
        &[
            ("probe_ms", 0),
            ("build_ms", 0),
            ("unload_ms", 0),
            ("load_ms", 0),
            ("total_ms", 1),
        ],
    ));
    if let Some(host) = host {
        out.push_str(&start_to_ready(host, vm));
    }
}

/// The agent's steps: probe, cache lookup, unload and load from the real kernel; the build of a
/// cache miss and the label from the host. A cache miss then loads as a cache hit with nothing
/// loaded does.
fn start_to_ready(host: &Value, vm: &Value) -> String {
    let mut out = String::from(
        "\nStart to ready: probe, cache lookup, unload and load on the real kernel; the build and \
         the label on the host:\n\n\
         | case | probe | build | unload | load | label | sum |\n|---|---|---|---|---|---|---|\n",
    );
    for (name, key) in SWAP_CASES {
        let miss = key == "cache_miss_build";
        let vm_key = if miss {
            "cache_hit_nothing_loaded"
        } else {
            key
        };
        let (h, v) = (&host[key], &vm[vm_key]);
        let build = if miss { &h["build_ms"] } else { &v["build_ms"] };
        let steps = [
            num(&v["probe_ms"]),
            num(build),
            num(&v["unload_ms"]),
            num(&v["load_ms"]),
            num(&h["label_ms"]),
        ];
        let sum = steps.iter().sum::<f64>();
        let [probe, build, unload, load, label] = steps;
        out.push_str(&ms_row(
            name,
            &[
                (probe, 0),
                (build, 0),
                (unload, 0),
                (load, 0),
                (label, 1),
                (sum, 0),
            ],
        ));
    }
    out
}

/// The swap cases: the name in the tables, the key in a suite's result.
const SWAP_CASES: [(&str, &str); 3] = [
    ("cache hit, nothing loaded", "cache_hit_nothing_loaded"),
    ("cache hit, swap", "cache_hit_swap"),
    ("cache miss (build)", "cache_miss_build"),
];

/// One row per case of `result`, one cell per (field in milliseconds, decimals).
fn case_rows(result: &Value, cases: &[(&str, &str)], fields: &[(&str, usize)]) -> String {
    cases
        .iter()
        .map(|(name, key)| {
            let cells: Vec<(f64, usize)> = fields
                .iter()
                .map(|(field, decimals)| (num(&result[*key][*field]), *decimals))
                .collect();
            ms_row(name, &cells)
        })
        .collect()
}

/// One table row: the case, then each value in milliseconds with its number of decimals.
fn ms_row(name: &str, cells: &[(f64, usize)]) -> String {
    let mut row = format!("| {name} |");
    for (value, decimals) in cells {
        let _ = write!(row, " {value:.decimals$} ms |");
    }
    row.push('\n');
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_suite_that_did_not_finish_is_named() {
        let failed =
            json!({ "suite": "fleet", "server": REAL_SERVER, "error": "ttdp-bench fleet failed" });
        assert_eq!(
            check(&[failed]),
            vec![
                "fleet suite on the real control plane did not finish: ttdp-bench fleet failed"
                    .to_string()
            ]
        );
    }

    fn drain_size(pods: u64, ratio: f64, same: bool, violated: bool) -> Value {
        json!({ "pods": pods, "wall_ratio_ttdp_over_kubectl": ratio, "same_removed_set": same,
            "kubectl": { "budget_violated": false }, "ttdp": { "budget_violated": violated } })
    }

    #[test]
    fn drain_targets_are_the_ratio_at_100_and_500_pods_the_same_pods_and_the_budget() {
        let met = json!({ "suite": "drain", "sizes": [
            drain_size(10, 0.9, true, false), drain_size(100, 0.15, true, false),
            drain_size(500, 0.049, true, false)] });
        assert!(check(&[met]).is_empty());
        let missed = json!({ "suite": "drain", "sizes": [
            drain_size(100, 0.2, true, false), drain_size(500, 0.04, false, true)] });
        assert_eq!(
            check(&[missed]),
            [
                "drain 100: ttdp-drain took 0.200 × kubectl's time (target ≤ 0.15)",
                "drain 500: the tools removed different pods",
                "drain 500: the budget was violated during the ttdp drain",
            ]
        );
    }

    #[test]
    fn a_swap_vm_that_did_not_run_is_named_as_missed() {
        let failed = json!({ "suite": "swap-vm", "error": "the VM did not run: qemu-system-x86_64 not found" });
        assert_eq!(
            check(&[failed]),
            vec![
                "swap-vm suite did not finish: the VM did not run: qemu-system-x86_64 not found"
                    .to_string()
            ]
        );
    }

    #[test]
    fn start_to_ready_takes_the_kernel_steps_from_the_vm_and_the_build_from_the_host() {
        let step = |probe: f64, build: f64, unload: f64, load: f64| json!({ "probe_ms": probe, "build_ms": build, "unload_ms": unload, "load_ms": load, "label_ms": 0.4 });
        let host = json!({ "suite": "swap", "cache_hit_nothing_loaded": step(0.0, 0.0, 0.0, 0.0),
            "cache_hit_swap": step(0.0, 0.0, 0.0, 0.0), "cache_miss_build": step(0.0, 120.0, 0.0, 0.0) });
        let vm = json!({ "suite": "swap-vm", "cache_hit_nothing_loaded": step(4.0, 1.0, 0.0, 7.0),
            "cache_hit_swap": step(4.0, 1.0, 45.0, 10.0) });
        let table = start_to_ready(&host, &vm);
        assert!(
            table.contains(
                "| cache hit, nothing loaded | 4 ms | 1 ms | 0 ms | 7 ms | 0.4 ms | 12 ms |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| cache hit, swap | 4 ms | 1 ms | 45 ms | 10 ms | 0.4 ms | 60 ms |"),
            "{table}"
        );
        assert!(
            table
                .contains("| cache miss (build) | 4 ms | 120 ms | 0 ms | 7 ms | 0.4 ms | 131 ms |"),
            "{table}"
        );
    }

    #[test]
    fn a_status_write_row_per_size_and_a_failed_run_is_a_missed_target() {
        let write =
            |p50: f64| json!({ "p50": p50, "p95": 2.0 * p50, "max": 3.0 * p50, "count": 60 });
        let w = json!({ "suite": "status_write", "server": REAL_SERVER, "writes": 60, "sizes": [
            { "entries": 100, "status_bytes": 14445, "write_ms": write(24.0) },
            { "entries": 1000, "status_bytes": 144045, "write_ms": write(116.0) } ] });
        let machine = Machine {
            commit: "abc1234".to_owned(),
            dirty: false,
            cpus: 2,
            cpu_model: "test".to_owned(),
            memory_gib: 1.0,
            load_average: "0.00".to_owned(),
        };
        let table = render(std::slice::from_ref(&w), &machine);
        assert!(
            table.contains("| 100 | 14.1 KiB | 24 / 48 / 72 ms |"),
            "{table}"
        );
        assert!(
            table.contains("| 1000 | 140.7 KiB | 116 / 232 / 348 ms |"),
            "{table}"
        );
        let failed = json!({ "suite": "status_write", "error": "ttdp-bench status-write failed" });
        assert_eq!(check(&[failed]).len(), 1);
    }
}
