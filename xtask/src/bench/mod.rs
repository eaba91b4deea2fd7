//! `cargo xtask bench [--quick] [--only fleet|drain|swap|agent-vm] [--runs N] [--sizes N,N]
//! [--json FILE] [--agent-profile PROFILE]`: builds the binaries (profile `benchmark`), runs the
//! benchmark suites of `ttdp-bench` (crates/ttdp-programs/src/bin/ttdp-bench) one after the
//! other, prints every figure with the commit and the machine, writes them to
//! `<target>/bench/results.json` (and the fleet's figures by size to `--json FILE`), and fails
//! naming each target that was missed.
//!
//! Plan: fleets of 100, 1,000 and 5,000 Tenstorrent nodes (plus as many plain nodes), all with
//! maxUnavailable 50 so that only the fleet's size varies, `--runs` runs of each (3 by
//! default), 500 ms of simulated agent work per node, each run on a real control plane started
//! for it, each phase (adoption, rollout) time-boxed (a fleet that runs out of time reports what
//! it measured and misses its targets); `kubectl tt driver` timed on the first run of the 1,000
//! and 5,000 fleets; the status the controller's builder makes for 50,000 nodes; one status
//! write of 100, 500 and 1,000 node entries alone on an idle control plane; drains of 10, 100
//! and 500 pods with ttdp-drain and kubectl; the module swap steps on a simulated kernel and a
//! real one; the real agent's start to Ready for a cache hit on a real kernel next to the
//! `rmmod` + `insmod` floor of the same boot (suite `agent-vm`, also run by `--only swap`).
//! `--quick` runs one run each of 20- and 100-node fleets with maxUnavailable 5 and 10/50-pod
//! drains (a smoke run, not for the documentation).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;

mod agent_vm;
mod fleet_targets;
mod machine;
mod targets;

use crate::vm::{SWAP_TIMING, Vm};
use machine::Machine;
use targets::{check, render};

const RESULT_PREFIX: &str = "BENCH-RESULT ";

/// One fleet size: Tenstorrent nodes, whether the plugin is timed on it, and how long the
/// adoption and the rollout may each take (the real DaemonSet controller and scheduler have
/// thousands of pods to create and bind).
struct FleetPlan {
    nodes: usize,
    plugin: bool,
    timeout_seconds: u64,
}

const FULL_FLEETS: [FleetPlan; 3] = [
    FleetPlan {
        nodes: 100,
        plugin: false,
        timeout_seconds: 600,
    },
    FleetPlan {
        nodes: 1_000,
        plugin: true,
        timeout_seconds: 900,
    },
    FleetPlan {
        nodes: 5_000,
        plugin: true,
        timeout_seconds: 3_600,
    },
];
const QUICK_FLEETS: [FleetPlan; 2] = [
    FleetPlan {
        nodes: 20,
        plugin: false,
        timeout_seconds: 360,
    },
    FleetPlan {
        nodes: 100,
        plugin: true,
        timeout_seconds: 360,
    },
];
/// maxUnavailable of every fleet, the same at every size: with 100 nodes it still makes two
/// waves, at 5,000 a hundred.
const MAX_UNAVAILABLE: usize = 50;
const QUICK_MAX_UNAVAILABLE: usize = 5;
/// Runs of each fleet size without `--runs`.
const RUNS: usize = 3;
/// The fleet whose status the controller's builder makes without a cluster.
const STATUS_SIZE_NODES: usize = 50_000;
/// The Cargo profile the benchmarks are built with (see the workspace `Cargo.toml`): release
/// optimisation without its thin LTO, which would double the build of a clean clone.
const PROFILE: &str = "benchmark";
/// Simulated agent work per node.
const WORK_MS: &str = "500";

/// Entry point of `cargo xtask bench`.
pub fn run(args: &[String]) -> Result<()> {
    let bench = parse_args(args)?;
    let root = crate::tools::repo_root()?;
    let target = crate::tools::target_dir(&root)?;
    let machine = Machine::describe(&root);
    let started = Instant::now();
    let results = if bench.only == Some("agent-vm") {
        println!("{}", machine.header());
        vec![agent_vm::start_to_ready_on_a_real_kernel(
            &root,
            &target,
            bench.agent_profile,
        )]
    } else {
        build(&root)?;
        let kubectl = kubectl(&root)?;
        println!("{}", machine.header());
        let built = target.join(PROFILE);
        let mut results = run_suites(&built, &target, &kubectl, &bench)?;
        if bench.wants("swap") {
            results.push(agent_vm::start_to_ready_on_a_real_kernel(
                &root,
                &target,
                bench.agent_profile,
            ));
        }
        results
    };
    let elapsed = started.elapsed();
    print!("{}", render(&results, &machine));
    for result in results.iter().filter(|r| r["suite"] == "agent-vm") {
        let mut table = String::new();
        agent_vm::render(&mut table, result, &machine.commit);
        if result.get("error").is_none() {
            print!("{table}");
        }
    }
    let fleet = bench.wants("fleet").then(|| {
        let sizes: Vec<u64> = bench.fleets().iter().map(|p| p.nodes as u64).collect();
        fleet_targets::summarize(&results, &sizes)
    });
    if let Some(summary) = &fleet {
        print!("{}", fleet_targets::render_summary(summary, &machine));
    }
    println!(
        "benchmarks ran in {:.1} min{}",
        elapsed.as_secs_f64() / 60.0,
        if bench.quick { " (--quick)" } else { "" }
    );
    write_results(&bench, &target, &machine, &results, fleet.as_ref(), elapsed)?;
    let mut missed = check(&results);
    // Only the agent-vm suite's result has its start-to-Ready figure.
    let agent_vm = results.iter().filter(|r| r["suite"] == "agent-vm");
    missed.extend(agent_vm.filter_map(agent_vm::missed));
    let fleet_verdicts = fleet.as_ref().map(fleet_targets::verdicts);
    missed.extend(
        fleet_verdicts
            .into_iter()
            .flatten()
            .filter(|v| !v.met)
            .map(|v| v.what),
    );
    if !missed.is_empty() {
        bail!(
            "{} target(s) missed:\n  {}",
            missed.len(),
            missed.join("\n  ")
        );
    }
    println!("every target met");
    Ok(())
}

/// Writes every result to `<target>/bench/results.json`, and the fleet's figures by size to
/// the file of `--json`.
fn write_results(
    bench: &BenchArgs<'_>,
    target: &Path,
    machine: &Machine,
    results: &[Value],
    fleet: Option<&Value>,
    elapsed: std::time::Duration,
) -> Result<()> {
    let out = target.join("bench");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let document = serde_json::json!({ "machine": machine.json(), "quick": bench.quick, "seconds": elapsed.as_secs_f64(), "fleet": fleet, "results": results });
    let file = out.join("results.json");
    std::fs::write(&file, serde_json::to_string_pretty(&document)?)
        .with_context(|| format!("cannot write {}", file.display()))?;
    println!("figures written to {}", file.display());
    if let (Some(path), Some(fleet)) = (bench.json, fleet) {
        std::fs::write(path, serde_json::to_string_pretty(fleet)?)
            .with_context(|| format!("cannot write {path}"))?;
        println!("fleet figures written to {path}");
    }
    Ok(())
}

/// What `cargo xtask bench` was asked for.
struct BenchArgs<'a> {
    /// `--quick`.
    quick: bool,
    /// The suite of `--only`, if any.
    only: Option<&'a str>,
    /// The Cargo profile the agent of suite `agent-vm` is built with (`--agent-profile`;
    /// default the benchmark profile, `dev` for the debug build the VM tests run).
    agent_profile: &'a str,
    /// Runs of each fleet size (`--runs`; 3, or 1 with `--quick`).
    runs: usize,
    /// The fleet sizes of `--sizes`, if given (each one of the plan's).
    sizes: Option<Vec<usize>>,
    /// Where `--json` writes the fleet's figures by size.
    json: Option<&'a str>,
}

impl BenchArgs<'_> {
    /// Whether `suite` runs.
    fn wants(&self, suite: &str) -> bool {
        self.only.is_none_or(|o| o == suite)
    }

    /// The fleet sizes to run.
    fn fleets(&self) -> Vec<&'static FleetPlan> {
        let plan: &'static [FleetPlan] = if self.quick {
            &QUICK_FLEETS
        } else {
            &FULL_FLEETS
        };
        plan.iter()
            .filter(|p| self.sizes.as_ref().is_none_or(|s| s.contains(&p.nodes)))
            .collect()
    }

    fn max_unavailable(&self) -> usize {
        if self.quick {
            QUICK_MAX_UNAVAILABLE
        } else {
            MAX_UNAVAILABLE
        }
    }
}

const USAGE: &str = "usage: cargo xtask bench [--quick] [--only fleet|drain|swap|agent-vm] [--runs N] [--sizes N,N] [--json FILE] [--agent-profile PROFILE]";

fn parse_args(args: &[String]) -> Result<BenchArgs<'_>> {
    let value_of = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let quick = args.iter().any(|a| a == "--quick");
    let runs = match value_of("--runs") {
        Some(n) => n
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .with_context(|| format!("--runs {n}: not a positive number; {USAGE}"))?,
        None if quick => 1,
        None => RUNS,
    };
    let sizes = value_of("--sizes")
        .map(|list| {
            list.split(',')
                .map(str::parse)
                .collect::<Result<Vec<usize>, _>>()
        })
        .transpose()
        .with_context(|| format!("--sizes takes node counts separated by commas; {USAGE}"))?;
    let parsed = BenchArgs {
        quick,
        only: value_of("--only"),
        agent_profile: value_of("--agent-profile").unwrap_or(PROFILE),
        runs,
        sizes,
        json: value_of("--json"),
    };
    let mut rest = args.iter().map(String::as_str);
    while let Some(arg) = rest.next() {
        match arg {
            "--quick" => {}
            "--only" => match rest.next() {
                Some("fleet" | "drain" | "swap" | "agent-vm") => {}
                other => bail!("unknown suite {other:?} after --only; {USAGE}"),
            },
            "--agent-profile" | "--runs" | "--sizes" | "--json" if rest.next().is_some() => {}
            unknown => bail!("unknown bench argument {unknown:?}; {USAGE}"),
        }
    }
    if let Some(sizes) = &parsed.sizes
        && parsed.fleets().len() != sizes.len()
    {
        bail!("--sizes {sizes:?}: each size must be one of the plan's; {USAGE}");
    }
    Ok(parsed)
}

/// Runs the suites `bench` selects (all by default) one after the other, with the binaries in
/// `built`; returns their result lines.
fn run_suites(
    built: &Path,
    target: &Path,
    kubectl: &Path,
    bench: &BenchArgs<'_>,
) -> Result<Vec<Value>> {
    let program = built.join("ttdp-bench");
    let mut results: Vec<Value> = Vec::new();
    if bench.wants("fleet") {
        results.extend(run_fleets(&program, built, target, bench)?);
        let mut command = Command::new(&program);
        command
            .arg("status-size")
            .arg(format!("--nodes={STATUS_SIZE_NODES}"))
            .arg(format!("--max-unavailable={}", bench.max_unavailable()));
        results.push(suite(&mut command)?);
        // One status write of the sizes the fleets write, alone.
        let mut command = Command::new(&program);
        command.arg("status-write").arg("--entries=100,500,1000");
        results.push(suite(&mut command)?);
    }
    if bench.wants("drain") {
        let mut command = Command::new(&program);
        command
            .arg("drain")
            .arg(format!(
                "--ttdp-drain={}",
                built.join("examples").join("drain").display()
            ))
            .arg(format!("--kubectl={}", kubectl.display()));
        if bench.quick {
            command.arg("--pods=10,50");
        }
        results.push(suite(&mut command)?);
    }
    if bench.wants("swap") {
        results.push(suite(Command::new(&program).arg("swap"))?);
        results.push(swap_on_a_real_kernel());
    }
    Ok(results)
}

/// Every run of every fleet size, one after the other.
fn run_fleets(
    program: &Path,
    built: &Path,
    target: &Path,
    bench: &BenchArgs<'_>,
) -> Result<Vec<Value>> {
    let mut results = Vec::new();
    for plan in bench.fleets() {
        for run in 0..bench.runs {
            println!(
                "bench: fleet of {}, run {} of {}",
                plan.nodes,
                run + 1,
                bench.runs
            );
            // The plugin's timing needs one run only.
            let plugin = plan.plugin && run == 0;
            let mut command = fleet_command(
                program,
                built,
                target,
                plan,
                bench.max_unavailable(),
                plugin,
            );
            let mut result = suite(&mut command)?;
            // A run that failed before printing its line still says where it ran.
            if result.get("server").is_none() {
                result["server"] = Value::from(targets::REAL_SERVER);
                result["nodes"] = Value::from(plan.nodes);
            }
            results.push(result);
        }
    }
    Ok(results)
}

/// `ttdp-bench fleet` for one run of one fleet of the plan.
fn fleet_command(
    program: &Path,
    built: &Path,
    target: &Path,
    plan: &FleetPlan,
    max_unavailable: usize,
    plugin: bool,
) -> Command {
    let mut command = Command::new(program);
    command
        .arg("fleet")
        .arg(format!("--nodes={}", plan.nodes))
        .arg(format!("--max-unavailable={max_unavailable}"))
        .arg(format!("--work-ms={WORK_MS}"))
        .arg(format!("--timeout-seconds={}", plan.timeout_seconds))
        .arg(format!(
            "--controller={}",
            built.join("ttdp-controller").display()
        ))
        .arg(format!("--log-dir={}", target.join("bench").display()));
    if plugin {
        command.arg(format!(
            "--plugin={}",
            built.join("kubectl-tt-driver").display()
        ));
    }
    command
}

/// Runs one `ttdp-bench` suite, passing its progress through, and returns its result line. A
/// suite that fails still returns what it measured (with `"error"` set), so one slow suite does
/// not hide the others' figures.
fn suite(command: &mut Command) -> Result<Value> {
    println!("bench: {}", describe(command));
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", describe(command)))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut result: Value = match result_line(&stdout) {
        Some(line) => line
            .with_context(|| format!("{} printed an unreadable result line", describe(command)))?,
        None => {
            serde_json::json!({ "suite": command.get_args().next().map(|a| a.to_string_lossy().into_owned()) })
        }
    };
    if !output.status.success() {
        result["error"] = Value::from(format!("{} failed ({})", describe(command), output.status));
    }
    Ok(result)
}

/// Load and unload times on a real kernel: boots scenario `swap-timing` of `cargo xtask vm-test`
/// (QEMU without KVM) and returns its result line; one with `"error"` set when the VM could not
/// run or printed none.
fn swap_on_a_real_kernel() -> Value {
    println!(
        "bench: real-kernel swap in a VM (cargo xtask vm-test machinery, scenario swap-timing)"
    );
    let failed = |why: String| serde_json::json!({ "suite": "swap-vm", "error": why });
    let boot = match Vm::prepare().and_then(|vm| vm.boot(&SWAP_TIMING, &[], None)) {
        Ok(boot) => boot,
        Err(e) => return failed(format!("the VM did not run: {e:#}")),
    };
    match (boot.exit_code, result_line(&boot.output)) {
        (Some(0), Some(Ok(result))) => result,
        _ => failed(format!(
            "the swap-timing VM exited with {:?}{} and printed no result; its output: {}",
            boot.exit_code,
            if boot.timed_out { " (timed out)" } else { "" },
            boot.run_dir.join("output.log").display()
        )),
    }
}

/// The `BENCH-RESULT {json}` line of a suite's output, parsed.
fn result_line(output: &str) -> Option<serde_json::Result<Value>> {
    output
        .lines()
        .find_map(|l| l.trim().strip_prefix(RESULT_PREFIX))
        .map(serde_json::from_str)
}

fn describe(command: &Command) -> String {
    let args: Vec<String> = command
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    format!("ttdp-bench {}", args.join(" "))
}

fn build(root: &Path) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // One invocation: building the drain example on its own resolves the shared dependencies'
    // features differently, so two invocations rebuild kube and its TLS stack twice.
    let args = [
        "build",
        "--profile",
        PROFILE,
        "-p",
        "ttdp-controller",
        "-p",
        "kubectl-tt-driver",
        "-p",
        "ttdp-programs",
        "-p",
        "ttdp-drain",
        "--bin",
        "ttdp-controller",
        "--bin",
        "kubectl-tt-driver",
        "--bin",
        "ttdp-bench",
        "--example",
        "drain",
    ];
    println!("bench: cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root)
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// kubectl v1.35 from `.ci/kube-tools` (installed on first use).
fn kubectl(root: &Path) -> Result<PathBuf> {
    if let Ok(path) = crate::tools::kube_tool("kubectl") {
        return Ok(path);
    }
    println!("bench: installing kubectl with .ci/kube-tools");
    let status = Command::new("bash")
        .arg(root.join(".ci/kube-tools"))
        .status()
        .context("cannot run bash .ci/kube-tools")?;
    if !status.success() {
        bail!("bash .ci/kube-tools failed ({status}); the drain benchmark needs kubectl v1.35");
    }
    crate::tools::kube_tool("kubectl")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn the_agent_profile_and_the_suite_are_parsed_and_unknown_words_refused() {
        let given = args(&["--only", "agent-vm", "--agent-profile", "dev"]);
        let parsed = parse_args(&given).unwrap();
        assert_eq!(
            (parsed.quick, parsed.only, parsed.agent_profile),
            (false, Some("agent-vm"), "dev")
        );
        let given = args(&["--quick"]);
        let parsed = parse_args(&given).unwrap();
        assert_eq!(
            (parsed.only, parsed.agent_profile, parsed.runs),
            (None, PROFILE, 1)
        );
        let given = args(&["--runs", "2", "--sizes", "100,1000", "--json", "f.json"]);
        let parsed = parse_args(&given).unwrap();
        assert_eq!((parsed.runs, parsed.json), (2, Some("f.json")));
        let sizes: Vec<usize> = parsed.fleets().iter().map(|p| p.nodes).collect();
        assert_eq!(sizes, [100, 1_000]);
        for wrong in [
            &["--only", "nope"][..],
            &["dev"],
            &["--agent-profile"],
            &["--runs", "0"],
            &["--sizes", "100,7"],
            &["--sizes", "many"],
        ] {
            assert!(parse_args(&args(wrong)).is_err(), "{wrong:?}");
        }
    }
}
