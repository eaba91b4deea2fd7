//! The demo's command line. `cargo xtask demo` passes the three binary paths; everything else
//! has a default that shows a full rollout in about a minute.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Run simulated Tenstorrent nodes on a real control plane (or, without one, on the testkit's
/// imitation), install tt-kmd with the real ttdp controller and agents, upgrade it, and watch the
/// rollout node by node.
#[derive(Debug, Parser)]
#[command(name = "ttdp-demo", version, about)]
pub struct DemoArgs {
    /// The ttdp-controller binary.
    #[arg(long, env = "TTDP_DEMO_CONTROLLER", value_name = "PATH")]
    pub controller: PathBuf,

    /// The ttdp-agent binary (run by the simulated kubelets for the installer image).
    #[arg(long, env = "TTDP_DEMO_AGENT", value_name = "PATH")]
    pub agent: PathBuf,

    /// The kubectl-tt-driver plugin binary (draws the live view).
    #[arg(long, env = "TTDP_DEMO_PLUGIN", value_name = "PATH")]
    pub plugin: PathBuf,

    /// Tenstorrent nodes (the last one is host-managed when there are two or more).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=200))]
    pub nodes: u16,

    /// Nodes without Tenstorrent devices (the policy must leave them alone).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(0..=200))]
    pub plain_nodes: u16,

    /// The policy's upgradePolicy.maxUnavailable: a number (`2`) or a percentage (`25%`).
    #[arg(long, default_value = "1", value_parser = parse_max_unavailable)]
    pub max_unavailable: String,

    /// The tt-kmd version installed first.
    #[arg(long, default_value = "2.7.0", value_parser = parse_version)]
    pub from: String,

    /// The tt-kmd version the policy is then bumped to.
    #[arg(long, default_value = "2.8.0", value_parser = parse_version)]
    pub to: String,

    /// Time scale of simulated waits (probe periods, grace periods, retries): 1 is real time,
    /// 0.1 ten times faster.
    #[arg(long, default_value_t = 0.2, value_parser = parse_speed)]
    pub speed: f64,

    /// Exit 0 as soon as the upgrade is Ready and the checks pass (non-zero otherwise), instead
    /// of waiting for Ctrl-C. For CI and tests.
    #[arg(long)]
    pub exit_after_rollout: bool,

    /// Give up when the install and the upgrade together take longer than this (e.g. 300s, 10m).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Write the outcome (phases, timings, final node states) as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub report: Option<PathBuf>,

    /// Run on the existing cluster of this kubeconfig (kind, a lab cluster; cluster-admin
    /// needed) instead of a control plane of the demo's own: simulated nodes join it, and what
    /// the demo created is deleted when it ends.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Also copy the kubeconfig of the cluster the demo started to this path (not done for
    /// `--kubeconfig`).
    #[arg(long, value_name = "PATH")]
    pub write_kubeconfig: Option<PathBuf>,

    /// Where the demo's and the controller's logs go (default: a new temporary directory).
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,

    /// Never clear the screen: print node transitions line by line (the default when stdout is
    /// not a terminal).
    #[arg(long)]
    pub plain: bool,
}

/// `MAJOR.MINOR.PATCH`, as the policy's `spec.version` requires.
fn parse_version(text: &str) -> Result<String, String> {
    let version: ttdp_kmod::KmdVersion = text.parse().map_err(|e| format!("{e}"))?;
    Ok(version.into())
}

/// A positive integer or a percentage from 1% to 100%.
fn parse_max_unavailable(text: &str) -> Result<String, String> {
    let (number, most) = match text.strip_suffix('%') {
        Some(percent) => (percent, 100),
        None => (text, u32::MAX),
    };
    match number.parse::<u32>() {
        Ok(n) if (1..=most).contains(&n) => Ok(text.to_owned()),
        _ => Err(format!(
            "{text:?} is not a maxUnavailable; write a number like 2 or a percentage like 25%"
        )),
    }
}

/// A finite factor above zero.
fn parse_speed(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 10.0 => Ok(f),
        _ => Err(format!(
            "{text:?} is not a speed; write a factor like 0.2 (five times faster than real time)"
        )),
    }
}

pub use ttdp_api::duration::parse_duration;

/// A duration as the agent's and the controller's flags take it (milliseconds, at least 1).
pub fn duration_flag(duration: Duration) -> String {
    format!("{}ms", duration.as_millis().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_reject_what_the_policy_would_reject() {
        assert!(parse_version("2.8.0").is_ok());
        assert!(parse_version("v2.8.0").is_err());
        assert!(parse_version("2.8").is_err());
        assert!(parse_max_unavailable("2").is_ok());
        assert!(parse_max_unavailable("25%").is_ok());
        assert!(parse_max_unavailable("0").is_err());
        assert!(parse_max_unavailable("150%").is_err());
        assert!(parse_speed("0").is_err());
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration_flag(Duration::from_micros(10)), "1ms");
    }
}
