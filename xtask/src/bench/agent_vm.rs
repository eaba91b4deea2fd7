//! The real agent's start to Ready for a cache hit on a real kernel, next to the floor (`rmmod` +
//! `insmod` of the same `.ko` files) measured in the same VM boot: scenario `agent-timing`
//! (`tests/vm/scenarios/agent-timing.sh`) booted through the `cargo xtask vm-test` machinery, with
//! the `ttdp-agent` binary built static in the benchmark profile, as the agent image ships it
//! optimised (the VM tests run a debug build, several times slower at hashing a `.ko`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::vm::static_build::{TARGET, static_cargo};
use crate::vm::{Scenario, Vm};

/// The scenario's script under `tests/vm/scenarios/`.
const SCRIPT: &str = "agent-timing.sh";
/// Where the agent goes in the guest (on `PATH`, as for the VM tests).
const GUEST_AGENT: &str = "/opt/ttdp/bin/ttdp-agent";

/// Boots the scenario and returns its result line; one with `"error"` set when the build or the
/// VM failed or it printed none. `profile` is the Cargo profile the agent is built with.
pub fn start_to_ready_on_a_real_kernel(root: &Path, target: &Path, profile: &str) -> Value {
    println!(
        "bench: agent start to Ready on a real kernel in a VM (scenario agent-timing, agent built with profile {profile})"
    );
    let failed = |why: String| serde_json::json!({ "suite": "agent-vm", "error": why });
    let agent = match build_agent(root, target, profile) {
        Ok(agent) => agent,
        Err(e) => return failed(format!("the static agent did not build: {e:#}")),
    };
    let scenario = scenario(&agent);
    let boot = match Vm::prepare().and_then(|vm| vm.boot(scenario, &[], None)) {
        Ok(boot) => boot,
        Err(e) => return failed(format!("the VM did not run: {e:#}")),
    };
    match (boot.exit_code, super::result_line(&boot.output)) {
        (Some(0), Some(Ok(mut result))) => {
            result["profile"] = Value::from(profile);
            result
        }
        _ => failed(format!(
            "the agent-timing VM exited with {:?}{} and printed no result; its output: {}",
            boot.exit_code,
            if boot.timed_out { " (timed out)" } else { "" },
            boot.run_dir.join("output.log").display()
        )),
    }
}

/// The scenario, with the agent built on the host as its one file. Leaked: the VM machinery
/// takes scenarios as `'static` data, and this one is made once per benchmark run.
fn scenario(agent: &Path) -> &'static Scenario {
    let files: &'static [(&'static str, &'static str)] = Box::leak(Box::new([(
        &*Box::leak(agent.display().to_string().into_boxed_str()),
        GUEST_AGENT,
    )]));
    Box::leak(Box::new(Scenario {
        name: "agent-timing",
        description: "times the real ttdp-agent's start to Ready for a cache hit replacing a \
                      loaded version, and rmmod + insmod of the same modules",
        tests: &[],
        bins: &[],
        // stamps the agent's start right before its execve
        examples: &[("ttdp-kmod", "exec_stamped")],
        files,
        host_usr: false,
        agent_image: false,
        prebuilt_tree: false,
        script: SCRIPT,
        // five runs of each take about a minute under TCG
        timeout: Duration::from_secs(300),
    }))
}

/// Builds `ttdp-agent` static with `profile` and returns the executable.
fn build_agent(root: &Path, target: &Path, profile: &str) -> Result<PathBuf> {
    let args = [
        "build",
        "--profile",
        profile,
        "-p",
        "ttdp-agent",
        "--bin",
        "ttdp-agent",
    ];
    println!("bench: cargo {} --target {TARGET} (static)", args.join(" "));
    let status = static_cargo(root, &args)
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("`cargo {}` for the VM failed ({status})", args.join(" "));
    }
    let dir = if profile == "dev" { "debug" } else { profile };
    let agent = target.join(TARGET).join(dir).join("ttdp-agent");
    let bytes = std::fs::read(&agent).with_context(|| format!("reading {}", agent.display()))?;
    if !crate::vm::is_static_elf(&bytes) {
        bail!(
            "{} is dynamically linked; the VM has no libc",
            agent.display()
        );
    }
    Ok(agent)
}

/// Agent start to Ready for a cache hit that replaces a loaded version, ms.
const START_TO_READY_LIMIT_MS: f64 = 250.0;

/// The missed target of an `agent-vm` result, if any (a failed run is named by the caller).
pub fn missed(result: &Value) -> Option<String> {
    if result.get("error").is_some() {
        return None;
    }
    let ready = result["start_to_ready_ms"].as_f64().unwrap_or(f64::NAN);
    (ready.is_nan() || ready > START_TO_READY_LIMIT_MS).then(|| {
        format!(
            "agent start to Ready (cache hit, real kernel, {} build): {ready:.0} ms, floor {} ms (target ≤ {START_TO_READY_LIMIT_MS} ms)",
            result["profile"].as_str().unwrap_or("?"),
            result["floor_ms"]
        )
    })
}

/// The steps of one row of the table: (column, key in the result).
const STEPS: [(&str, &str); 9] = [
    ("exec to first log", "exec_to_started_ms"),
    ("to first observation", "started_to_observed_ms"),
    ("target .ko verified", "observed_to_ensured_ms"),
    ("rollback .ko verified", "ensured_to_rollback_ms"),
    ("swap (wall)", "rollback_to_swapped_ms"),
    ("of it: cache checks", "swap_cache_checks_ms"),
    ("of it: unload + load", "swap_unload_ms"),
    ("to Ready", "swapped_to_ready_ms"),
    ("start to Ready", "start_to_ready_ms"),
];

/// The result as Markdown: the floor and each step's median.
pub fn render(out: &mut String, result: &Value, commit: &str) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "\n### Agent start to Ready on a real kernel ({} under QEMU without KVM, agent built with profile {}), median of {} (commit {commit})\n",
        result["release"].as_str().unwrap_or("?"),
        result["profile"].as_str().unwrap_or("?"),
        result["runs"],
    );
    let _ = writeln!(
        out,
        "Cache hit replacing {} with {}; floor (rmmod + insmod of the same modules, same boot): {} ms; \
         starting the binary alone (`ttdp-agent --version`): {} ms; those two include about {} ms \
         of taking their two timestamps in the shell. The agent's start is stamped right before \
         its execve (`exec_stamped`).\n",
        result["from"].as_str().unwrap_or("?"),
        result["to"].as_str().unwrap_or("?"),
        result["floor_ms"],
        result["exec_version_ms"],
        result["timestamp_cost_ms"],
    );
    let _ = writeln!(out, "| step | ms |\n|---|---|");
    for (name, key) in STEPS {
        let value = result[key].as_f64().unwrap_or(f64::NAN);
        let value = if key == "swap_unload_ms" {
            value + result["swap_load_ms"].as_f64().unwrap_or(f64::NAN)
        } else {
            value
        };
        let _ = writeln!(out, "| {name} | {value:.0} |");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_start_is_a_missed_target_and_a_fast_one_is_not() {
        let result = |ms: f64| {
            serde_json::json!({ "suite": "agent-vm", "profile": "benchmark", "floor_ms": 67,
                "start_to_ready_ms": ms })
        };
        let slow = missed(&result(1310.0)).unwrap();
        assert!(
            slow.contains("1310 ms") && slow.contains("floor 67 ms"),
            "{slow}"
        );
        assert_eq!(missed(&result(240.0)), None);
        assert!(missed(&serde_json::json!({ "suite": "agent-vm" })).is_some());
        let failed = serde_json::json!({ "suite": "agent-vm", "error": "no VM" });
        assert_eq!(missed(&failed), None, "a failed run is named by check()");
    }

    #[test]
    fn the_table_sums_unload_and_load() {
        let mut out = String::new();
        let result = serde_json::json!({ "release": "6.1", "profile": "benchmark", "runs": 5,
            "from": "1.0.0", "to": "2.0.0", "floor_ms": 67, "swap_unload_ms": 50,
            "swap_load_ms": 20, "start_to_ready_ms": 240.4 });
        render(&mut out, &result, "abc");
        assert!(out.contains("| of it: unload + load | 70 |"), "{out}");
        assert!(out.contains("| start to Ready | 240 |"), "{out}");
        assert!(out.contains("floor (rmmod + insmod of the same modules, same boot): 67 ms"));
    }
}
