//! The fleet benchmark's figures by fleet size, its targets checked against them, and its
//! tables.
//!
//! Each size runs several times; a size's figure is the median of its runs' p95s (one slow run
//! on a shared machine does not decide it, nor does one fast one), its largest status and peak
//! memory the largest of its runs. The targets are benchmark figures, checked and printed as
//! met or missed; they are never timed tests.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::machine::Machine;
use super::targets::{REAL_SERVER, num, suites};

/// p95 of the hand-off (agent Ready to the next node cordoned), ms, at every size.
const HANDOFF_P95_LIMIT_MS: f64 = 100.0;
/// p95 of the controller's part of a hand-off, ms.
const OVERHEAD_P95_LIMIT_MS: f64 = 30.0;
/// p95 of a node's change to its state in the status, ms.
const FRESHNESS_P95_LIMIT_MS: f64 = 2_000.0;
/// The largest status, bytes, at 5,000 and at 50,000 nodes.
const STATUS_LIMIT_BYTES: f64 = 256.0 * 1024.0;
/// The rollout's total over whole waves of the per-node floor.
const RATIO_LIMIT: f64 = 1.2;
/// The controller's peak resident memory at 5,000 nodes, MiB.
const MEMORY_LIMIT_MIB: f64 = 64.0;

/// The median of `values` (NaN when empty); the lower middle for an even count is not used:
/// two values give their mean.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| !v.is_nan());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The largest of `values` (NaN when empty).
fn largest(values: impl Iterator<Item = f64>) -> f64 {
    values.filter(|v| !v.is_nan()).fold(f64::NAN, f64::max)
}

/// The completed runs of the real control plane with `nodes` nodes.
fn runs_of(results: &[Value], nodes: u64) -> Vec<&Value> {
    suites(results, "fleet")
        .filter(|f| f["completed"] == true && f["server"] == REAL_SERVER && f["nodes"] == nodes)
        .collect()
}

/// The figures by size (`sizes`, in the order planned) and the 50,000-node status, as
/// `--json` writes them.
pub fn summarize(results: &[Value], sizes: &[u64]) -> Value {
    let rows: Vec<Value> = sizes
        .iter()
        .map(|&n| {
            let runs = runs_of(results, n);
            let med = |key: &str| median(runs.iter().map(|r| num(&r[key])).collect());
            let max = |key: &str| largest(runs.iter().map(|r| num(&r[key])));
            json!({
                "nodes": n,
                "max_unavailable": runs.first().map(|r| r["max_unavailable"].clone()),
                "runs": runs.len(),
                "handoff_p95_ms": med("handoff_p95_ms"),
                "overhead_p95_ms": med("overhead_p95_ms"),
                "status_freshness_p95_ms": median(runs.iter().map(|r| num(&r["status_freshness_ms"]["p95"])).collect()),
                "status_max_bytes": max("status_max_bytes"),
                "status_max_bytes_rollout": max("status_max_bytes_rollout"),
                "status_bytes_per_s": med("status_bytes_per_s"),
                "ratio_to_floor": med("ratio_to_floor"),
                "rss_peak_mib": max("rss_peak_mib"),
            })
        })
        .collect();
    let size_50k = suites(results, "status_size").find(|s| s["nodes"] == 50_000);
    json!({ "sizes": rows, "status_50k_bytes": size_50k.map(|s| s["status_max_bytes"].clone()) })
}

/// One target: its name, the figure and whether it is met.
pub struct Verdict {
    pub what: String,
    pub met: bool,
}

fn verdict(met: bool, what: String) -> Verdict {
    Verdict { what, met }
}

/// Every fleet target against `summary`. A size without a completed run misses its targets.
pub fn verdicts(summary: &Value) -> Vec<Verdict> {
    let mut all = Vec::new();
    for s in summary["sizes"].as_array().into_iter().flatten() {
        let n = &s["nodes"];
        if s["runs"] == 0 {
            all.push(verdict(
                false,
                format!("fleet {n}: no complete run on the real control plane"),
            ));
            continue;
        }
        let (handoff, overhead) = (num(&s["handoff_p95_ms"]), num(&s["overhead_p95_ms"]));
        let (fresh, ratio) = (
            num(&s["status_freshness_p95_ms"]),
            num(&s["ratio_to_floor"]),
        );
        all.push(verdict(
            handoff < HANDOFF_P95_LIMIT_MS,
            format!("fleet {n}: hand-off p95 {handoff:.1} ms (target < {HANDOFF_P95_LIMIT_MS} ms)"),
        ));
        all.push(verdict(overhead <= OVERHEAD_P95_LIMIT_MS, format!("fleet {n}: controller overhead p95 {overhead:.1} ms (target ≤ {OVERHEAD_P95_LIMIT_MS} ms)")));
        all.push(verdict(fresh <= FRESHNESS_P95_LIMIT_MS, format!("fleet {n}: status freshness p95 {fresh:.0} ms (target ≤ {FRESHNESS_P95_LIMIT_MS} ms)")));
        all.push(verdict(
            ratio <= RATIO_LIMIT,
            format!("fleet {n}: rollout {ratio:.2} × its floor (target ≤ {RATIO_LIMIT})"),
        ));
        if s["nodes"] == 5_000 {
            let bytes = num(&s["status_max_bytes"]);
            all.push(verdict(
                bytes <= STATUS_LIMIT_BYTES,
                format!(
                    "fleet 5000: largest status {:.1} KiB (target ≤ 256 KiB)",
                    bytes / 1024.0
                ),
            ));
            let rss = num(&s["rss_peak_mib"]);
            all.push(verdict(rss <= MEMORY_LIMIT_MIB, format!("fleet 5000: controller peak resident memory {rss:.1} MiB (target ≤ {MEMORY_LIMIT_MIB} MiB)")));
        }
    }
    if !summary["status_50k_bytes"].is_null() {
        let bytes = num(&summary["status_50k_bytes"]);
        all.push(verdict(
            bytes <= STATUS_LIMIT_BYTES,
            format!(
                "50,000 nodes (status builder): largest status {:.1} KiB (target ≤ 256 KiB)",
                bytes / 1024.0
            ),
        ));
    }
    all
}

/// The summary by size, with the targets met and missed.
pub fn render_summary(summary: &Value, machine: &Machine) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### Fleet hand-off by size, median of the runs' p95 (commit {})\n",
        machine.commit
    );
    let _ = writeln!(
        out,
        "| TT nodes (+plain) | maxUnavailable | runs | hand-off p95 | overhead p95 | status freshness p95 | largest status | status written | ratio to floor | peak RSS |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    for s in summary["sizes"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "| {n} (+{n}) | {} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.1} KiB | {:.1} KiB/s | {:.2} | {:.1} MiB |",
            s["max_unavailable"],
            s["runs"],
            num(&s["handoff_p95_ms"]),
            num(&s["overhead_p95_ms"]),
            num(&s["status_freshness_p95_ms"]),
            num(&s["status_max_bytes"]) / 1024.0,
            num(&s["status_bytes_per_s"]) / 1024.0,
            num(&s["ratio_to_floor"]),
            num(&s["rss_peak_mib"]),
            n = s["nodes"],
        );
    }
    if !summary["status_50k_bytes"].is_null() {
        let _ = writeln!(
            out,
            "\n50,000 nodes, the controller's status builder alone: largest status {:.1} KiB",
            num(&summary["status_50k_bytes"]) / 1024.0
        );
    }
    let _ = writeln!(out, "\nTargets:");
    for v in verdicts(summary) {
        let _ = writeln!(
            out,
            "- {}: {}",
            if v.met { "met" } else { "MISSED" },
            v.what
        );
    }
    out
}

/// Where each run's hand-offs spent their time, cut at the server's timestamps of the two
/// node patches (p50 / p95 of each part).
fn render_handoff_paths(results: &[Value]) -> String {
    let mut out = String::from(
        "\nWhere the hand-off's time goes (p50 / p95; the server's timestamps from its audit log):\n\n\
         | TT nodes | Ready → release sent | (of which: Ready → seen by a pod watch) | release at the server | release answered → cordon sent | cordon at the server | cordon answered → seen by a watch |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for f in suites(results, "fleet").filter(|f| f["completed"] == true) {
        let path = &f["handoff_path_ms"];
        let part = |name: &str| {
            format!(
                "{:.0} / {:.0} ms",
                num(&path[name]["p50"]),
                num(&path[name]["p95"])
            )
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            f["nodes"],
            part("ready_to_release_sent"),
            part("ready_seen_by_a_watch"),
            part("release_at_server"),
            part("release_to_cordon_sent"),
            part("cordon_at_server"),
            part("cordon_to_seen"),
        );
    }
    out
}

/// What the API server handled per node upgraded in each run, every client's requests: the
/// kinds that took the most of its time, with their count and time per node.
fn render_server_mix(results: &[Value]) -> String {
    let mut out = String::from(
        "\nWhat the API server handled per node upgraded (every client; requests, server time):\n\n\
         | TT nodes | the eight kinds with the most server time |\n|---|---|\n",
    );
    for f in suites(results, "fleet").filter(|f| f["completed"] == true) {
        let Some(mix) = f["server_requests_per_node"].as_object() else {
            continue;
        };
        let mut kinds: Vec<(&String, f64, f64)> = mix
            .iter()
            .map(|(k, v)| (k, num(&v["per_node"]), num(&v["server_ms_per_node"])))
            .collect();
        kinds.sort_by(|a, b| b.2.total_cmp(&a.2));
        let cells: Vec<String> = (kinds.iter().take(8))
            .map(|(k, n, ms)| format!("{k} {n:.1} ({ms:.0} ms)"))
            .collect();
        let _ = writeln!(out, "| {} | {} |", f["nodes"], cells.join(", "));
    }
    out
}

/// One row per run, with the spreads behind the summary.
pub fn render_runs(results: &[Value], machine: &Machine) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Fleet runs on the real control plane (commit {})\n",
        machine.commit
    );
    let _ = writeln!(
        out,
        "| TT nodes | maxUnavailable | hand-off p50/p95/max | node PATCH at the server p50/p95 | freshness p50/p95 | grant→Ready p50 (floor) | total | ratio | status writes | largest status | RSS peak |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    let ms3 = |v: &Value| {
        format!(
            "{:.0} / {:.0} / {:.0} ms",
            num(&v["p50"]),
            num(&v["p95"]),
            num(&v["max"])
        )
    };
    let ms2 = |v: &Value| format!("{:.1} / {:.1} ms", num(&v["p50"]), num(&v["p95"]));
    for f in suites(results, "fleet").filter(|f| f["completed"] == true) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.0} ms | {:.1} s | {:.2} | {} | {:.1} KiB | {:.1} MiB |",
            f["nodes"],
            f["max_unavailable"],
            ms3(&f["handoff_ms"]),
            ms2(&f["node_patch_server_ms"]),
            ms2(&f["status_freshness_ms"]),
            num(&f["floor_ms"]),
            num(&f["total_seconds"]),
            num(&f["ratio_to_floor"]),
            f["status_writes_seen"],
            num(&f["status_max_bytes"]) / 1024.0,
            num(&f["rss_peak_mib"]),
        );
    }
    out.push_str(&render_handoff_paths(results));
    out.push_str(&render_server_mix(results));
    for f in suites(results, "fleet").filter(|f| f["completed"] != true) {
        let _ = writeln!(
            out,
            "\n**Fleet of {} did not finish** ({}): stopped in {} after {:.0} s with {} nodes up to date; controller peak {:.1} MiB.",
            f["nodes"],
            f["error"].as_str().unwrap_or("unknown error"),
            f["stopped_in"].as_str().unwrap_or("?"),
            num(&f["seconds_in_phase"]),
            f["up_to_date"],
            num(&f["rss_peak_mib"]),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        nodes: u64,
        handoff: f64,
        overhead: f64,
        fresh: f64,
        ratio: f64,
        bytes: f64,
        rss: f64,
    ) -> Value {
        json!({ "suite": "fleet", "server": REAL_SERVER, "completed": true, "nodes": nodes,
            "max_unavailable": 50, "handoff_p95_ms": handoff, "overhead_p95_ms": overhead,
            "status_freshness_ms": { "p95": fresh }, "ratio_to_floor": ratio,
            "status_max_bytes": bytes, "status_bytes_per_s": 1000.0, "rss_peak_mib": rss })
    }

    #[test]
    fn the_median_takes_the_middle_run() {
        assert_eq!(median(vec![300.0, 10.0, 20.0]), 20.0);
        assert_eq!(median(vec![10.0, 20.0]), 15.0);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn a_size_reports_the_median_p95_and_the_largest_status_and_memory() {
        let results = [
            run(100, 90.0, 20.0, 500.0, 1.1, 1_000.0, 30.0),
            run(100, 400.0, 300.0, 900.0, 1.5, 3_000.0, 31.0),
            run(100, 95.0, 25.0, 800.0, 1.15, 2_000.0, 29.0),
        ];
        let summary = summarize(&results, &[100]);
        let s = &summary["sizes"][0];
        assert_eq!(
            (s["runs"].clone(), s["handoff_p95_ms"].clone()),
            (json!(3), json!(95.0))
        );
        assert_eq!(
            (s["overhead_p95_ms"].clone(), s["ratio_to_floor"].clone()),
            (json!(25.0), json!(1.15))
        );
        assert_eq!(
            (s["status_max_bytes"].clone(), s["rss_peak_mib"].clone()),
            (json!(3_000.0), json!(31.0))
        );
        assert!(verdicts(&summary).iter().all(|v| v.met));
    }

    #[test]
    fn each_missed_target_is_named_and_a_missing_size_misses() {
        let results = [
            run(5_000, 150.0, 31.0, 2_500.0, 1.3, 300_000.0, 70.0),
            json!({ "suite": "status_size", "nodes": 50_000, "status_max_bytes": 1_000_000 }),
        ];
        let summary = summarize(&results, &[1_000, 5_000]);
        let missed: Vec<String> = verdicts(&summary)
            .into_iter()
            .filter(|v| !v.met)
            .map(|v| v.what)
            .collect();
        assert_eq!(missed.len(), 8, "{missed:?}");
        assert_eq!(
            missed[0],
            "fleet 1000: no complete run on the real control plane"
        );
        assert!(missed[1].contains("hand-off p95 150.0 ms"), "{missed:?}");
        assert!(missed[2].contains("overhead p95 31.0 ms"), "{missed:?}");
        assert!(missed[3].contains("freshness p95 2500 ms"), "{missed:?}");
        assert!(missed[4].contains("1.30 × its floor"), "{missed:?}");
        assert!(missed[5].contains("largest status 293.0 KiB"), "{missed:?}");
        assert!(missed[6].contains("memory 70.0 MiB"), "{missed:?}");
        assert!(missed[7].starts_with("50,000 nodes"), "{missed:?}");
    }
}
