//! `spec.upgradePolicy.validation` in the generated CRD: its defaults, the documented example,
//! and each CEL rule rejecting a bad value with a message that says what to change (evaluated
//! locally by kube's `cel` support, as the API server evaluates them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kube::core::cel::Validator;
use serde_json::{Value, json};
use ttdp_api::TenstorrentDriverPolicy;

fn schema() -> Value {
    let crd = ttdp_api::crd();
    let version = &crd.spec.versions[0];
    let schema = version.schema.as_ref().unwrap();
    serde_json::to_value(schema.open_api_v3_schema.as_ref().unwrap()).unwrap()
}

fn policy_with_validation(validation: Value) -> Value {
    json!({
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": {"name": "fleet"},
        "spec": {"version": "2.8.0", "nodeAffinity": {}, "upgradePolicy": {"validation": validation}},
    })
}

fn check(object: &Value) -> Result<(), String> {
    Validator::new()
        .validate(&schema(), object, None)
        .map_err(|e| e.to_string())
}

#[test]
fn validation_is_on_by_default_without_a_command() {
    let s = schema();
    let validation =
        &s["properties"]["spec"]["properties"]["upgradePolicy"]["properties"]["validation"];
    assert_eq!(validation["properties"]["enable"]["default"], json!(true));
    assert_eq!(
        validation["properties"]["timeoutSeconds"]["default"],
        json!(60)
    );
    assert!(validation["properties"]["command"].get("default").is_none());

    let minimal: TenstorrentDriverPolicy = serde_json::from_value(json!({
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": {"name": "default"},
        "spec": {"version": "2.8.0", "nodeAffinity": {}},
    }))
    .unwrap();
    let validation = &minimal.spec.upgrade_policy.validation;
    assert!(validation.enable);
    assert_eq!(validation.command, None);
    assert_eq!(validation.timeout_seconds, 60);
}

#[test]
fn the_documented_example_is_accepted() {
    let example = policy_with_validation(json!({
        "command": ["tt-smi", "-s", "--snapshot_no_tty"],
        "timeoutSeconds": 120,
    }));
    check(&example).unwrap();
    check(&policy_with_validation(json!({"enable": false}))).unwrap();
    let parsed: TenstorrentDriverPolicy = serde_json::from_value(example).unwrap();
    let validation = &parsed.spec.upgrade_policy.validation;
    assert!(validation.enable, "enable defaults to true with a command");
    assert_eq!(validation.command.as_ref().unwrap()[0], "tt-smi");
}

#[test]
fn bad_validation_settings_are_rejected_with_their_message() {
    let cases = [
        (
            json!({"timeoutSeconds": 0}),
            "validation.timeoutSeconds must be from 1 to 300",
        ),
        (
            json!({"timeoutSeconds": 301}),
            "validation.timeoutSeconds must be from 1 to 300",
        ),
        (
            json!({"command": ["", "-s"]}),
            "validation.command must start with the program to run",
        ),
        (json!({"command": []}), "command"),
        (
            json!({"enable": false, "command": ["tt-smi", "-s"]}),
            "validation.command runs only with validation.enable: true",
        ),
    ];
    for (validation, expected) in cases {
        let err = check(&policy_with_validation(validation.clone()))
            .expect_err(&format!("{validation} must be rejected"));
        assert!(err.contains(expected), "{validation}: {err}");
    }
}

/// `forceUnload` with the drain off kills the holders of workloads nothing evicted: refused
/// unless acknowledged.
#[test]
fn force_unload_without_drain_needs_its_acknowledgement() {
    let policy = |upgrade: Value| {
        json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": {"name": "fleet"},
            "spec": {"version": "2.8.0", "nodeAffinity": {}, "upgradePolicy": upgrade},
        })
    };
    let err = check(&policy(
        json!({"forceUnload": true, "drain": {"enable": false}}),
    ))
    .expect_err("forceUnload without the drain must be refused");
    assert!(
        err.contains("set upgradePolicy.forceUnloadWithoutDrain: true to accept that"),
        "{err}"
    );
    check(&policy(
        json!({"forceUnload": true, "drain": {"enable": false},
                         "forceUnloadWithoutDrain": true}),
    ))
    .unwrap();
    check(&policy(
        json!({"forceUnload": true, "drain": {"enable": true}}),
    ))
    .unwrap();
    check(&policy(
        json!({"forceUnload": false, "drain": {"enable": false}}),
    ))
    .unwrap();
}
