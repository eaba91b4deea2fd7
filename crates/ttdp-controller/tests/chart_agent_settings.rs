//! The chart's `agent.cacheSizeLimit` and `agent.kernelScanPeriod`: rendered by `helm template`
//! into the controller's agent pod settings, which put `TTDP_CACHE_SIZE_LIMIT` and
//! `TTDP_KERNEL_SCAN_PERIOD` on the agent container only when they are set. A malformed value
//! fails the chart's render (its schema) naming the value, and one the schema lets through but
//! the agent would refuse (a zero scan period) fails the controller's start naming it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use harness::helm_binary;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use serde_json::Value;
use ttdp_api::names::env;
use ttdp_controller::settings::AgentPodSettings;

fn chart() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/tt-k8s-driver-manager")
}

fn helm_template(sets: &[&str]) -> Output {
    let mut cmd = Command::new(helm_binary());
    cmd.args(["template", "tt-k8s-driver-manager"])
        .arg(chart())
        .args(["-n", "tt-k8s-driver-manager-system"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd.output().unwrap()
}

/// `TTDP_AGENT_POD` of the controller Deployment the chart renders with `sets`.
fn agent_pod_setting(sets: &[&str]) -> String {
    let out = helm_template(sets);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the chart renders the controller Deployment");
    let vars = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    vars.iter()
        .find(|v| v["name"] == "TTDP_AGENT_POD")
        .and_then(|v| v["value"].as_str())
        .expect("the Deployment gives the controller TTDP_AGENT_POD")
        .to_owned()
}

/// The agent container's environment once the controller adds `settings` to it.
fn agent_env(settings: &str) -> BTreeMap<String, String> {
    let mut spec = PodSpec {
        containers: vec![Container {
            name: "agent".into(),
            ..Container::default()
        }],
        ..PodSpec::default()
    };
    AgentPodSettings::parse(settings).unwrap().apply(&mut spec);
    (spec.containers[0].env.iter().flatten())
        .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
        .collect()
}

/// The controller binary started with `--agent-pod=<settings>`: it must stop at its flags.
fn controller_start(settings: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ttdp-controller"))
        .arg(format!("--agent-pod={settings}"))
        .env_clear()
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap()
}

#[test]
fn the_charts_cache_limit_and_scan_period_reach_the_agent_only_when_set() {
    let set = agent_pod_setting(&["agent.cacheSizeLimit=8Gi", "agent.kernelScanPeriod=10m"]);
    let vars = agent_env(&set);
    assert_eq!(
        vars.get(env::CACHE_SIZE_LIMIT).map(String::as_str),
        Some("8Gi")
    );
    assert_eq!(
        vars.get(env::KERNEL_SCAN_PERIOD).map(String::as_str),
        Some("10m")
    );

    let defaults = agent_pod_setting(&[]);
    let vars = agent_env(&defaults);
    assert!(
        !vars.contains_key(env::CACHE_SIZE_LIMIT) && !vars.contains_key(env::KERNEL_SCAN_PERIOD),
        "unset, the agent keeps its own defaults: {defaults}"
    );
}

#[test]
fn a_malformed_value_fails_the_charts_render_naming_it() {
    for (bad, named) in [
        ("agent.cacheSizeLimit=2GB", "cacheSizeLimit"),
        ("agent.cacheSizeLimit=lots", "cacheSizeLimit"),
        ("agent.kernelScanPeriod=1 minute", "kernelScanPeriod"),
        ("agent.kernelScanPeriod=10 m", "kernelScanPeriod"),
    ] {
        let out = helm_template(&[bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} accepted");
        assert!(
            stderr.contains("values don't meet the specifications") && stderr.contains(named),
            "{bad}: {stderr}"
        );
    }
}

#[test]
fn a_value_the_agent_would_refuse_fails_the_controllers_start_naming_it() {
    let zero = agent_pod_setting(&["agent.kernelScanPeriod=0s"]);
    let out = controller_start(&zero);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--agent-pod") && stderr.contains(r#"agent kernelScanPeriod "0s""#),
        "{stderr}"
    );
    let out = controller_start(r#"{"cacheSizeLimit":"2GB"}"#);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(r#"agent cacheSizeLimit "2GB""#), "{stderr}");
}
