//! The generated CRD: the spec's examples are accepted, every bad input is rejected with a
//! message that says what is wrong (CEL rules evaluated locally by kube's `cel` support, as the
//! API server evaluates them), and the committed YAML is what the types generate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kube::core::cel::Validator;
use serde_json::{Value, json};
use ttdp_api::TenstorrentDriverPolicy;

fn schema() -> Value {
    let crd = ttdp_api::crd();
    let version = &crd.spec.versions[0];
    serde_json::to_value(
        version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

fn check(object: &Value) -> Result<(), String> {
    Validator::new()
        .validate(&schema(), object, None)
        .map_err(|e| e.to_string())
}

fn policy(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": {"name": name},
        "spec": spec,
    })
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(text).unwrap()
}

/// Every CR example in spec/driver-management.md, verbatim.
const SPEC_EXAMPLES: &str = r#"
apiVersion: driver.tenstorrent.com/v1alpha1
kind: TenstorrentDriverPolicy
metadata:
  name: default
spec:
  version: "2.8.0"
  nodeAffinity: {}
---
apiVersion: driver.tenstorrent.com/v1alpha1
kind: TenstorrentDriverPolicy
metadata:
  name: fleet
spec:
  version: "2.8.0"
  nodeAffinity: {}
---
apiVersion: driver.tenstorrent.com/v1alpha1
kind: TenstorrentDriverPolicy
metadata: { name: prod }
spec:
  version: "2.7.0"
  nodeAffinity: { matchLabels: { tt.tenstorrent.com/pool: prod } }
---
apiVersion: driver.tenstorrent.com/v1alpha1
kind: TenstorrentDriverPolicy
metadata: { name: canary }
spec:
  version: "2.8.0"
  nodeAffinity: { matchLabels: { tt.tenstorrent.com/pool: canary } }
"#;

#[test]
fn spec_examples_are_accepted_and_defaulted() {
    for doc in yaml_docs(SPEC_EXAMPLES) {
        check(&doc).unwrap_or_else(|e| panic!("{doc}: {e}"));
        let p: TenstorrentDriverPolicy = serde_json::from_value(doc).unwrap();
        p.spec.validate().unwrap();
        let drain = &p.spec.upgrade_policy.drain;
        assert!(drain.enable && drain.full_node && drain.delete_empty_dir && !drain.force);
        assert_eq!(drain.timeout_seconds, 600);
        assert!(!p.spec.paused && !p.spec.upgrade_policy.force_unload);
        assert_eq!(p.spec.installer.image_pull_policy, "IfNotPresent");
        assert_eq!(p.spec.max_unavailable(10).unwrap(), 1);
    }
    // The canary snippet (`spec.installer`) and the pause patch, applied to the minimum CR.
    let canary = policy(
        "default",
        json!({"version": "2.8.0", "nodeAffinity": {}, "paused": true, "installer": {
            "image": "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:sha-abc1234",
            "imagePullPolicy": "Always"}}),
    );
    check(&canary).unwrap();
    // The deprecated alias alone is accepted.
    check(&policy(
        "old",
        json!({"version": "2.7.0", "nodeSelector": {"matchLabels": {"a": "b"}}}),
    ))
    .unwrap();
}

#[test]
fn schema_carries_the_defaults() {
    let s = schema();
    let spec = &s["properties"]["spec"]["properties"];
    let drain = &spec["upgradePolicy"]["properties"]["drain"]["properties"];
    assert_eq!(drain["enable"]["default"], json!(true));
    assert_eq!(drain["fullNode"]["default"], json!(true));
    assert_eq!(drain["podSelectorLabel"]["default"], json!(""));
    assert_eq!(drain["force"]["default"], json!(false));
    assert_eq!(drain["deleteEmptyDir"]["default"], json!(true));
    assert_eq!(drain["timeoutSeconds"]["default"], json!(600));
    assert_eq!(
        spec["upgradePolicy"]["properties"]["forceUnload"]["default"],
        json!(false)
    );
    assert_eq!(
        spec["upgradePolicy"]["properties"]["maxUnavailable"]["default"],
        json!(1)
    );
    assert_eq!(spec["paused"]["default"], json!(false));
    assert_eq!(
        spec["installer"]["properties"]["imagePullPolicy"]["default"],
        json!("IfNotPresent")
    );
}

#[test]
fn bad_inputs_are_rejected_with_their_message() {
    let ok = json!({"version": "2.8.0", "nodeAffinity": {}});
    let with = |path: &[&str], value: Value| {
        let mut spec = ok.clone();
        let mut cur = &mut spec;
        for p in &path[..path.len() - 1] {
            cur = cur.as_object_mut().unwrap().entry(*p).or_insert(json!({}));
        }
        cur[path[path.len() - 1]] = value;
        spec
    };
    let long_name = "n".repeat(58);
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "default",
            with(&["version"], json!("v2.8.0")),
            "spec.version must be a tt-kmd release like 2.8.0",
        ),
        (
            "default",
            with(&["version"], json!("ttkmd-2.8.0")),
            "without the ttkmd- prefix",
        ),
        (
            "default",
            with(&["version"], json!("2.8")),
            "MAJOR.MINOR.PATCH",
        ),
        (
            "default",
            with(&["version"], json!("2.8.0-rc1")),
            "MAJOR.MINOR.PATCH",
        ),
        (
            "default",
            json!({"version": "2.8.0"}),
            "set exactly one of spec.nodeAffinity and spec.nodeSelector",
        ),
        (
            "default",
            with(&["nodeSelector"], json!({})),
            "set exactly one of spec.nodeAffinity and spec.nodeSelector",
        ),
        (
            "default",
            with(&["upgradePolicy", "drain", "timeoutSeconds"], json!(0)),
            "timeoutSeconds must be at least 1",
        ),
        (
            "default",
            with(&["upgradePolicy", "maxUnavailable"], json!(0)),
            "maxUnavailable must be an integer >= 1 or a percentage",
        ),
        (
            "default",
            with(&["upgradePolicy", "maxUnavailable"], json!("0%")),
            "from 1% to 100%",
        ),
        (
            "default",
            with(&["upgradePolicy", "maxUnavailable"], json!("101%")),
            "from 1% to 100%",
        ),
        (
            "default",
            with(&["upgradePolicy", "maxUnavailable"], json!("two")),
            "such as \"25%\"",
        ),
        (
            "default",
            with(&["installer", "imagePullPolicy"], json!("Sometimes")),
            "imagePullPolicy must be one of Always, IfNotPresent, Never",
        ),
        (
            "default",
            with(&["nodeAffinity"], json!({"matchLabels": {"-bad": "x"}})),
            "label keys must be",
        ),
        (
            "default",
            with(
                &["nodeAffinity"],
                json!({"matchLabels": {"pool": "has space"}}),
            ),
            "label values must be",
        ),
        (
            "default",
            with(
                &["nodeAffinity"],
                json!({"matchExpressions": [{"key": "Bad_Prefix.COM/x", "operator": "Exists"}]}),
            ),
            "label keys must be",
        ),
        (
            "default",
            with(
                &["nodeAffinity"],
                json!({"matchExpressions": [{"key": "pool", "operator": "Within", "values": ["a"]}]}),
            ),
            "operator must be one of In, NotIn, Exists, DoesNotExist",
        ),
        (
            "default",
            with(
                &["nodeAffinity"],
                json!({"matchExpressions": [{"key": "pool", "operator": "In"}]}),
            ),
            "In and NotIn need at least one value",
        ),
        (
            "default",
            with(
                &["nodeAffinity"],
                json!({"matchExpressions": [{"key": "pool", "operator": "Exists", "values": ["a"]}]}),
            ),
            "Exists and DoesNotExist take none",
        ),
        (
            "default",
            with(
                &["nodeAffinity"],
                json!({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ok", "not ok"]}]}),
            ),
            "label values must be",
        ),
        (
            &long_name,
            ok.clone(),
            "metadata.name must be at most 57 characters",
        ),
    ];
    for (name, spec, want) in cases {
        let obj = policy(name, spec.clone());
        let err = check(&obj)
            .err()
            .unwrap_or_else(|| panic!("accepted: {spec}"));
        assert!(err.contains(want), "{spec}: want {want:?}, got: {err}");
    }
    // The longest allowed name is accepted.
    check(&policy(&"n".repeat(57), ok.clone())).unwrap();
    // Percentages and integers that are allowed.
    for v in [json!(1), json!(7), json!("1%"), json!("25%"), json!("100%")] {
        check(&policy(
            "default",
            with(&["upgradePolicy", "maxUnavailable"], v.clone()),
        ))
        .unwrap_or_else(|e| panic!("{v}: {e}"));
    }
}

/// `upgradePolicy.nodeTimeoutSeconds`: defaulted to 30 minutes in the schema and the types,
/// and refused outside 1 s to 7 days with a message naming the field and its unit.
#[test]
fn node_timeout_seconds_is_defaulted_and_bounded() {
    let upgrade = &schema()["properties"]["spec"]["properties"]["upgradePolicy"]["properties"];
    assert_eq!(upgrade["nodeTimeoutSeconds"]["default"], json!(1800));
    let p: TenstorrentDriverPolicy =
        serde_json::from_value(policy("d", json!({"version": "2.8.0", "nodeAffinity": {}})))
            .unwrap();
    assert_eq!(p.spec.upgrade_policy.node_timeout_seconds, 1800);
    let with = |seconds: Value| {
        policy(
            "default",
            json!({"version": "2.8.0", "nodeAffinity": {},
                   "upgradePolicy": {"nodeTimeoutSeconds": seconds}}),
        )
    };
    for bad in [json!(0), json!(-5), json!(604_801), json!(1_800_000)] {
        let err = check(&with(bad.clone()))
            .err()
            .unwrap_or_else(|| panic!("accepted nodeTimeoutSeconds {bad}"));
        assert!(
            err.contains("spec.upgradePolicy.nodeTimeoutSeconds must be from 1 to 604800 (7 days)"),
            "{bad}: {err}"
        );
    }
    for ok in [json!(1), json!(300), json!(604_800)] {
        check(&with(ok.clone())).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn pod_selector_label_is_checked_by_the_controller_side_validation() {
    let mut p: TenstorrentDriverPolicy = serde_json::from_value(policy(
        "default",
        json!({"version": "2.8.0", "nodeAffinity": {},
               "upgradePolicy": {"drain": {"podSelectorLabel": "app in (web"}}}),
    ))
    .unwrap();
    let err = p.spec.validate().unwrap_err().to_string();
    assert!(
        err.starts_with("spec.upgradePolicy.drain.podSelectorLabel:"),
        "{err}"
    );
    assert!(err.contains("missing ')'"), "{err}");
    for ok in [
        "",
        "app=web",
        "app",
        "!legacy",
        "tier notin (db,cache)",
        "a==b,c!=d",
    ] {
        p.spec.upgrade_policy.drain.pod_selector_label = ok.into();
        p.spec.validate().unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn max_unavailable_resolves_percentages() {
    let mut p: TenstorrentDriverPolicy = serde_json::from_value(policy(
        "x",
        json!({"version": "2.8.0", "nodeAffinity": {}, "upgradePolicy": {"maxUnavailable": "25%"}}),
    ))
    .unwrap();
    assert_eq!(p.spec.max_unavailable(8).unwrap(), 2);
    assert_eq!(p.spec.max_unavailable(7).unwrap(), 1, "rounded down");
    assert_eq!(p.spec.max_unavailable(2).unwrap(), 1, "at least 1");
    p.spec.upgrade_policy.max_unavailable =
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(3);
    assert_eq!(p.spec.max_unavailable(100).unwrap(), 3);
}

#[test]
fn committed_crd_is_up_to_date() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/helm/tt-k8s-driver-manager/crds/tenstorrentdriverpolicies.driver.tenstorrent.com.yaml"
    );
    let committed: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let generated = serde_json::to_value(ttdp_api::crd()).unwrap();
    assert!(
        committed == generated,
        "the committed CRD is stale: run `cargo xtask crd` and commit the result"
    );
}

/// The rollout guards (canary, waitForCompletion, schedule): well-formed ones are accepted and
/// defaulted; malformed ones are refused by the schema with a message naming the field, and what
/// the schema cannot check (a time zone) by the controller-side validation.
#[test]
fn rollout_guards_are_checked_with_clear_messages() {
    let spec =
        |guards: Value| json!({"version": "2.8.0", "nodeAffinity": {}, "upgradePolicy": guards});
    let good = spec(json!({
        "canary": {"nodes": "10%", "soakSeconds": 600, "autoRollback": true},
        "waitForCompletion": {"podSelector": "job-name"},
        "schedule": {"timeZone": "Europe/Berlin",
                     "windows": [{"days": ["Sat", "Sun"], "start": "02:00", "duration": "4h"}]},
    }));
    check(&policy("default", good.clone())).unwrap();
    let p: TenstorrentDriverPolicy = serde_json::from_value(policy("d", good)).unwrap();
    let wait = p.spec.upgrade_policy.wait_for_completion.clone().unwrap();
    assert_eq!(
        (wait.timeout_seconds, wait.on_timeout.as_str()),
        (0, "Drain")
    );
    p.spec.validate().unwrap();
    let cases = [
        (
            json!({"canary": {"nodes": 0}}),
            "canary.nodes must be an integer >= 1",
        ),
        (
            json!({"canary": {"nodes": 1, "soakSeconds": -1}}),
            "canary.soakSeconds must be from 0",
        ),
        (
            json!({"waitForCompletion": {"podSelector": "app=x", "onTimeout": "Wait"}}),
            "onTimeout must be Drain or Fail",
        ),
        (
            json!({"schedule": {"windows": [{"days": ["Saturday"], "start": "02:00", "duration": "1h"}]}}),
            "must name days as Mon",
        ),
        (
            json!({"schedule": {"windows": [{"days": ["Sat"], "start": "2am", "duration": "1h"}]}}),
            "must be a 24-hour time HH:MM",
        ),
        (
            json!({"schedule": {"windows": [{"days": ["Sat"], "start": "02:00", "duration": "1d"}]}}),
            "must be hours and/or minutes",
        ),
    ];
    for (guards, want) in cases {
        let err = check(&policy("default", spec(guards.clone())))
            .err()
            .unwrap_or_else(|| panic!("accepted: {guards}"));
        assert!(err.contains(want), "{guards}: want {want:?}, got: {err}");
    }
    let zone: TenstorrentDriverPolicy = serde_json::from_value(policy(
        "d",
        spec(json!({"schedule": {"timeZone": "Mars/Olympus",
            "windows": [{"days": ["Sat"], "start": "02:00", "duration": "1h"}]}})),
    ))
    .unwrap();
    let err = zone.spec.validate().unwrap_err().to_string();
    assert!(err.contains("not an IANA time zone"), "{err}");
    let selector: TenstorrentDriverPolicy = serde_json::from_value(policy(
        "d",
        spec(json!({"waitForCompletion": {"podSelector": "app in (a"}})),
    ))
    .unwrap();
    let err = selector.spec.validate().unwrap_err().to_string();
    assert!(err.contains("waitForCompletion.podSelector"), "{err}");
}

/// `spec.module.parameters`: identifiers with safe values pass the schema and the controller's
/// check and reach the kernel's string; anything that could split into two parameters or reach
/// a shell is refused, with a message naming the field.
#[test]
fn module_parameters_are_checked_with_clear_messages() {
    let spec = |params: Value| json!({"version": "2.8.0", "nodeAffinity": {}, "module": {"parameters": params}});
    let good = spec(json!(["reset_limit=5", "_debug=0x1f", "list=a,b:c/d"]));
    check(&policy("default", good.clone())).unwrap();
    let p: TenstorrentDriverPolicy = serde_json::from_value(policy("d", good)).unwrap();
    p.spec.validate().unwrap();
    assert_eq!(
        p.spec.kernel_parameters(),
        "reset_limit=5 _debug=0x1f list=a,b:c/d"
    );
    let none: TenstorrentDriverPolicy =
        serde_json::from_value(policy("d", json!({"version": "2.8.0", "nodeAffinity": {}})))
            .unwrap();
    assert_eq!(none.spec.kernel_parameters(), "", "unset: no parameters");
    assert!(
        !serde_json::to_string(&none.spec)
            .unwrap()
            .contains("module"),
        "an unset module section is not written back"
    );
    for bad in [
        "reset_limit",
        "9lives=1",
        "re-set=1",
        "x=",
        "x=a b",
        "x=1;reboot",
        "x=$(id)",
        "x=`id`",
        "x=a|b",
        "x=\"q\"",
        "x=a\tb",
    ] {
        let err = check(&policy("default", spec(json!([bad]))))
            .err()
            .unwrap_or_else(|| panic!("{bad:?} was accepted by the schema"));
        assert!(
            err.contains("spec.module.parameters entries must be name=value"),
            "{bad:?}: {err}"
        );
        let p: TenstorrentDriverPolicy =
            serde_json::from_value(policy("d", spec(json!([bad])))).unwrap();
        let err = p.spec.validate().unwrap_err().to_string();
        assert!(err.contains("must be name=value"), "{bad:?}: {err}");
    }
    let twice: TenstorrentDriverPolicy =
        serde_json::from_value(policy("d", spec(json!(["a=1", "a=2"])))).unwrap();
    assert_eq!(
        twice.spec.validate().unwrap_err().to_string(),
        "spec.module.parameters sets a more than once; keep one entry per parameter"
    );
    // bounded, so the API server can cost the rule (it enforces maxItems itself)
    let params =
        &schema()["properties"]["spec"]["properties"]["module"]["properties"]["parameters"];
    assert_eq!(
        (
            params["maxItems"].as_u64(),
            params["items"]["maxLength"].as_u64()
        ),
        (Some(32), Some(256))
    );
}

/// `spec.source`: a mirror's git URL and a full commit id pass; anything else is refused by the
/// schema with a message naming the field.
#[test]
fn source_repository_and_commit_are_checked_with_clear_messages() {
    let spec = |source: Value| json!({"version": "2.8.0", "nodeAffinity": {}, "source": source});
    let commit = "0123456789abcdef0123456789abcdef01234567";
    for repository in [
        "https://git.example.com/mirrors/tt-kmd.git",
        "ssh://git@git.example.com/tt-kmd.git",
        "git@git.example.com:mirrors/tt-kmd.git",
        "file:///srv/git/tt-kmd.git",
    ] {
        check(&policy(
            "default",
            spec(json!({"repository": repository, "commit": commit})),
        ))
        .unwrap_or_else(|e| panic!("{repository}: {e}"));
    }
    let cases = [
        (
            json!({"repository": "/srv/git/tt-kmd"}),
            "spec.source.repository must be a git URL",
        ),
        (
            json!({"repository": "https://a b"}),
            "spec.source.repository must be a git URL",
        ),
        (
            json!({"repository": "--upload-pack=touch /x"}),
            "spec.source.repository must be a git URL",
        ),
        (
            json!({"commit": "0123456"}),
            "spec.source.commit must be a full commit id",
        ),
        (
            json!({"commit": commit.to_uppercase()}),
            "spec.source.commit must be a full commit id",
        ),
        (
            json!({"commit": "ttkmd-2.8.0"}),
            "spec.source.commit must be a full commit id",
        ),
    ];
    for (source, want) in cases {
        let err = check(&policy("default", spec(source.clone())))
            .err()
            .unwrap_or_else(|| panic!("{source} was accepted"));
        assert!(err.contains(want), "{source}: {err}");
    }
    let p: TenstorrentDriverPolicy =
        serde_json::from_value(policy("d", spec(json!({"commit": commit})))).unwrap();
    let source = p.spec.source.unwrap();
    assert_eq!(
        (source.repository, source.commit.as_deref()),
        (None, Some(commit))
    );
}

/// `spec.source.prebuilt`: an http(s) URL template naming both placeholders, a known fallback
/// (defaulted to Build) and a CA bundle from exactly one ConfigMap or Secret pass; the rest is
/// refused with a message naming the field.
#[test]
fn prebuilt_modules_are_checked_with_clear_messages() {
    let spec = |prebuilt: Value| json!({"version": "2.8.0", "nodeAffinity": {}, "source": {"prebuilt": prebuilt}});
    let url = "https://ko.example.com/tt-kmd/{version}/{kernelRelease}/tenstorrent.ko";
    let sum = "0123456789abcdef".repeat(4);
    let pin = |version: &str, release: &str, sha256: &str| json!({"version": version, "kernelRelease": release, "sha256": sha256});
    let pins = |version: &str, release: &str, sha256: &str| json!({"url": url, "checksums": [pin(version, release, sha256)]});
    for prebuilt in [
        json!({"url": url, "trustServerChecksum": true}),
        json!({"url": url, "checksums": [pin("2.8.0", "6.8.0-111-generic", &sum), pin("2.7.0", "6.1.0-31-amd64+x~1", &sum)]}),
        json!({"url": url.replace("https", "http"), "fallback": "Fail", "allowInsecureHttp": true, "trustServerChecksum": true}),
        json!({"url": url, "trustServerChecksum": true, "allowCrossHostRedirects": true, "caBundle": {"configMapName": "ko-ca"}}),
        json!({"url": url, "trustServerChecksum": true, "caBundle": {"secretName": "ko-tls", "key": "ca.pem"}}),
    ] {
        check(&policy("default", spec(prebuilt.clone())))
            .unwrap_or_else(|e| panic!("{prebuilt}: {e}"));
    }
    let url_message = "spec.source.prebuilt.url must be an http:// or https:// URL";
    let trusted = |mut prebuilt: Value| {
        prebuilt["trustServerChecksum"] = json!(true);
        prebuilt
    };
    let cases = [
        (
            json!({"url": url}),
            "needs the checksum of each module in checksums (version, kernelRelease, sha256), or trustServerChecksum: true",
        ),
        (
            json!({"url": url, "checksums": [], "trustServerChecksum": false}),
            "needs the checksum of each module in checksums",
        ),
        (
            json!({"url": url.replace("https", "http"), "trustServerChecksum": true}),
            "must be https://; set spec.source.prebuilt.allowInsecureHttp: true",
        ),
        (
            json!({"url": url.replace("https", "http"), "allowInsecureHttp": false, "checksums": [pin("2.8.0", "6.8.0", &sum)]}),
            "must be https://",
        ),
        (
            pins("2.8", "6.8.0", &sum),
            "checksums[].version must be MAJOR.MINOR.PATCH",
        ),
        (
            pins("2.8.0", "6.8.0 x", &sum),
            "checksums[].kernelRelease must be a kernel release",
        ),
        (pins("2.8.0", "6.8.0/x", &sum), "checksums[].kernelRelease"),
        (
            pins("2.8.0", "6.8.0", &sum.to_uppercase()),
            "checksums[].sha256 must be 64 lowercase hex",
        ),
        (
            pins("2.8.0", "6.8.0", &format!("{}g", &sum[1..])),
            "checksums[].sha256 must be 64 lowercase hex",
        ),
        (
            json!({"url": "ftp://ko.example.com/{version}/{kernelRelease}.ko"}),
            url_message,
        ),
        (
            json!({"url": "https://ko.example.com/{version}/tenstorrent.ko"}),
            url_message,
        ),
        (
            json!({"url": "https://ko.example.com/{kernelRelease}/tenstorrent.ko"}),
            url_message,
        ),
        (json!({"url": format!("{url} x")}), url_message),
        (
            json!({"url": url, "fallback": "build"}),
            "spec.source.prebuilt.fallback must be Build or Fail",
        ),
        (
            json!({"url": url, "caBundle": {}}),
            "needs exactly one of configMapName and secretName",
        ),
        (
            json!({"url": url, "caBundle": {"configMapName": "a", "secretName": "b"}}),
            "needs exactly one of configMapName and secretName",
        ),
    ];
    let cases = cases.into_iter().enumerate().map(|(i, (prebuilt, want))| {
        // the first cases are about trust; the rest must fail on their own point alone
        (if i < 4 { prebuilt } else { trusted(prebuilt) }, want)
    });
    for (prebuilt, want) in cases {
        let err = check(&policy("default", spec(prebuilt.clone())))
            .err()
            .unwrap_or_else(|| panic!("{prebuilt} was accepted"));
        assert!(err.contains(want), "{prebuilt}: {err}");
    }
    let p: TenstorrentDriverPolicy = serde_json::from_value(policy(
        "d",
        spec(json!({"url": url, "caBundle": {"configMapName": "ko-ca"}})),
    ))
    .unwrap();
    let prebuilt = p.spec.source.unwrap().prebuilt.unwrap();
    assert!(
        !prebuilt.trust_server_checksum
            && !prebuilt.allow_insecure_http
            && !prebuilt.allow_cross_host_redirects
            && prebuilt.checksums.is_empty(),
        "nothing is trusted by default: {prebuilt:?}"
    );
    assert_eq!(
        prebuilt.fallback, "Build",
        "a missing file is built by default"
    );
    assert_eq!(prebuilt.ca_bundle.unwrap().key, "ca.crt");
}

/// `spec.module.signing`: a Secret name passes and reads back; a missing, empty or malformed
/// name is refused by the schema with a message naming the field.
#[test]
fn module_signing_names_a_secret_with_clear_messages() {
    let spec = |module: Value| json!({"version": "2.8.0", "nodeAffinity": {}, "module": module});
    let good = spec(json!({"signing": {"secretName": "tt-kmd-signing"}}));
    check(&policy("default", good.clone())).unwrap();
    let p: TenstorrentDriverPolicy = serde_json::from_value(policy("d", good)).unwrap();
    p.spec.validate().unwrap();
    let module = p.spec.module.unwrap();
    assert_eq!(
        module.signing.as_ref().unwrap().secret_name,
        "tt-kmd-signing"
    );
    assert!(module.parameters.is_empty() && module.is_empty());
    for bad in ["Signing", "-x", "x_y", "a b", "x."] {
        let err = check(&policy(
            "default",
            spec(json!({"signing": {"secretName": bad}})),
        ))
        .err()
        .unwrap_or_else(|| panic!("{bad:?} was accepted by the schema"));
        assert!(
            err.contains("spec.module.signing.secretName must be a Secret name"),
            "{bad:?}: {err}"
        );
    }
    let signing = &schema()["properties"]["spec"]["properties"]["module"]["properties"]["signing"];
    assert_eq!(
        signing["required"],
        json!(["secretName"]),
        "the API server refuses a signing section without secretName"
    );
    let err = check(&policy(
        "default",
        spec(json!({"signing": {"secretName": ""}})),
    ))
    .expect_err("an empty name is refused");
    assert!(err.contains("secretName"), "{err}");
}
