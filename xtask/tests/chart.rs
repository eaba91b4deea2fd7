//! The Helm chart, rendered by the real `helm`: it lints strictly, every rendered object parses
//! into its Kubernetes type without losing a field, and values change what they should.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::{
    admissionregistration::v1 as adm, apps::v1 as apps, core::v1 as core, rbac::v1 as rbac,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn chart() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/tt-k8s-driver-manager")
}

fn helm() -> PathBuf {
    if let Ok(p) = std::env::var("TTDP_HELM") {
        return p.into();
    }
    let p = PathBuf::from(std::env::var("HOME").unwrap()).join(".local/ttdp-tools/bin/helm");
    assert!(
        p.is_file(),
        "helm not found at {}: run `bash .ci/kube-tools` first",
        p.display()
    );
    p
}

/// The chart's default `digest:` of the top-level values section `section` (`image` or
/// `driver`), as `cargo xtask release` wrote it.
fn default_digest(section: &str) -> String {
    let values = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let mut in_section = false;
    values
        .lines()
        .find_map(|l| {
            if !l.starts_with([' ', '#']) && !l.is_empty() {
                in_section = l == format!("{section}:");
            }
            l.strip_prefix("  digest: ").filter(|_| in_section)
        })
        .unwrap()
        .trim_matches('"')
        .to_owned()
}

fn template(sets: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", "tt-k8s-driver-manager"])
        .arg(chart())
        .args(["-n", "tt-k8s-driver-manager-system", "--include-crds"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

/// Parses `doc` as `T` and checks nothing was dropped (a misspelled field would be).
fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> T {
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", doc["kind"]));
    assert_eq!(
        strip_nulls(&serde_json::to_value(&t).unwrap()),
        strip_nulls(doc),
        "{} {} loses fields when parsed",
        doc["kind"],
        doc["metadata"]["name"]
    );
    t
}

fn find<'a>(docs: &'a [Value], kind: &str, name_suffix: &str) -> &'a Value {
    docs.iter()
        .find(|d| {
            d["kind"] == kind
                && d["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .ends_with(name_suffix)
        })
        .unwrap_or_else(|| panic!("no {kind} *{name_suffix}"))
}

#[test]
fn lints_strictly() {
    let out = Command::new(helm())
        .args(["lint", "--strict"])
        .arg(chart())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn every_object_parses_into_its_type() {
    let docs = template(&["metrics.serviceMonitor.enabled=true"]);
    let mut kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ServiceMonitor",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    for d in &docs {
        match d["kind"].as_str().unwrap() {
            "ClusterRole" => drop(typed::<rbac::ClusterRole>(d)),
            "ClusterRoleBinding" => drop(typed::<rbac::ClusterRoleBinding>(d)),
            "Role" => drop(typed::<rbac::Role>(d)),
            "RoleBinding" => drop(typed::<rbac::RoleBinding>(d)),
            "Deployment" => drop(typed::<apps::Deployment>(d)),
            "Service" => drop(typed::<core::Service>(d)),
            "ServiceAccount" => drop(typed::<core::ServiceAccount>(d)),
            "CustomResourceDefinition" => {
                let crd: CustomResourceDefinition = typed(d);
                assert_eq!(crd, ttdp_api::crd(), "the chart's CRD is the generated one");
            }
            "ValidatingAdmissionPolicy" => drop(typed::<adm::ValidatingAdmissionPolicy>(d)),
            "ValidatingAdmissionPolicyBinding" => {
                drop(typed::<adm::ValidatingAdmissionPolicyBinding>(d))
            }
            "ServiceMonitor" => assert_eq!(d["spec"]["endpoints"][0]["path"], "/metrics"),
            other => panic!("unexpected kind {other}"),
        }
    }
}

#[test]
fn controller_is_locked_down_and_configured_from_values() {
    let docs = template(&[]);
    let deploy: apps::Deployment = typed(find(&docs, "Deployment", "-controller"));
    let pod = deploy.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("tt-k8s-driver-manager-controller")
    );
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    let c = &pod.containers[0];
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    assert_eq!(
        c.image.clone().unwrap(),
        format!(
            "ghcr.io/tenstorrent/tt-k8s-driver-manager@{}",
            default_digest("image")
        )
    );
    assert_eq!(
        c.liveness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/healthz")
    );
    assert_eq!(
        c.readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/readyz")
    );
    let env = |docs: &[Value], name: &str| -> String {
        let d: apps::Deployment = typed(find(docs, "Deployment", "-controller"));
        let c = d.spec.unwrap().template.spec.unwrap().containers.remove(0);
        c.env
            .unwrap()
            .into_iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value)
            .unwrap_or_default()
    };
    assert_eq!(
        env(&docs, "TTDP_DEPLOY_GATES"),
        ttdp_api::names::DEFAULT_DEPLOY_GATE
    );
    assert_eq!(
        env(&docs, "TTDP_DEFAULT_IMAGE"),
        format!(
            "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder@{}",
            default_digest("driver")
        )
    );
    // another registry keeps the digest (an archive copied unchanged); no digest: the tag
    let docs = template(&["driver.repository=registry.example/ttdp-agent"]);
    assert_eq!(
        env(&docs, "TTDP_DEFAULT_IMAGE"),
        format!("registry.example/ttdp-agent@{}", default_digest("driver"))
    );
    let docs = template(&["driver.digest=", "image.digest=", "image.tag=dev"]);
    assert_eq!(
        env(&docs, "TTDP_DEFAULT_IMAGE"),
        format!(
            "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
    let d: apps::Deployment = typed(find(&docs, "Deployment", "-controller"));
    assert_eq!(
        d.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .as_deref(),
        Some("ghcr.io/tenstorrent/tt-k8s-driver-manager:dev")
    );
    assert_eq!(env(&docs, "TTDP_LEADER_ELECTION"), "true");
    let docs = template(&[
        "controller.deployGates=null",
        "driver.image=example.com/b:1",
    ]);
    assert_eq!(env(&docs, "TTDP_DEPLOY_GATES"), "");
    assert_eq!(env(&docs, "TTDP_DEFAULT_IMAGE"), "example.com/b:1");
}

#[test]
fn bad_values_are_rejected() {
    for set in [
        "controller.logFormat=xml",
        "controller.deployGates={bad key}",
        "image.pullPolicy=Sometimes",
        "image.digest=latest",
        "driver.digest=sha256:abc",
    ] {
        let out = Command::new(helm())
            .args(["template", "x"])
            .arg(chart())
            .args(["--set", set])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{set} was accepted");
    }
}

#[test]
fn agent_may_only_touch_its_own_node_and_pod() {
    let docs = template(&[]);
    let role: rbac::ClusterRole = typed(find(&docs, "ClusterRole", "-agent"));
    let verbs: Vec<String> = role
        .rules
        .unwrap()
        .into_iter()
        .flat_map(|r| r.verbs)
        .collect();
    assert!(
        !verbs
            .iter()
            .any(|v| v == "delete" || v == "list" || v == "update"),
        "{verbs:?}"
    );
    let vap: adm::ValidatingAdmissionPolicy =
        typed(find(&docs, "ValidatingAdmissionPolicy", "-agent-own-node"));
    let spec = vap.spec.unwrap();
    assert_eq!(
        spec.match_conditions.unwrap()[0].expression,
        "request.userInfo.username == \"system:serviceaccount:tt-k8s-driver-manager-system:tt-k8s-driver-manager-agent\""
    );
    let text = serde_json::to_string(&spec.validations).unwrap();
    for label in [
        ttdp_api::names::labels::KMD_VERSION,
        ttdp_api::names::labels::INSTALL_MODE,
        ttdp_api::names::labels::TT_SMI_VERSION,
    ] {
        assert!(
            text.contains(label)
                || serde_json::to_string(&spec.variables)
                    .unwrap()
                    .contains(label),
            "{label}"
        );
    }
    assert!(
        template(&["admissionPolicy.enabled=false"])
            .iter()
            .all(|d| d["kind"] != "ValidatingAdmissionPolicy")
    );
}

#[test]
fn every_controller_env_var_in_the_chart_is_a_controller_flag() {
    let src: String = ["args.rs", "main.rs"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../crates/ttdp-controller/src")
                    .join(f),
            )
            .unwrap()
        })
        .collect();
    let docs = template(&[]);
    let d: apps::Deployment = typed(find(&docs, "Deployment", "-controller"));
    let env = d
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers
        .remove(0)
        .env
        .unwrap();
    let names: Vec<String> = env
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n.starts_with("TTDP_"))
        .collect();
    assert!(names.len() >= 9, "{names:?}");
    for name in names {
        assert!(
            src.contains(&format!("env = \"{name}\"")),
            "the chart sets {name}, which the controller does not read"
        );
    }
}

/// A fresh folder under cargo's temporary directory for integration tests.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("chart-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs helm with its caches and repository list in `home`, so nothing of the user's is used.
fn helm_in(home: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(helm())
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn values_accept_global() {
    // An umbrella chart hands its `global` values to every dependency; the schema must let
    // them through, whatever they hold.
    let docs = template(&["global.foo=bar", "global.imageRegistry.nested=x"]);
    assert!(docs.iter().any(|d| d["kind"] == "Deployment"));
    // Everything else stays strict.
    let out = Command::new(helm())
        .args(["template", "x"])
        .arg(chart())
        .args(["--set", "notAValue=1"])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "an unknown top-level value was accepted"
    );
}

#[test]
fn works_as_a_dependency_of_an_umbrella_chart() {
    let home = scratch("umbrella");
    let umbrella = home.join("umbrella");
    std::fs::create_dir_all(&umbrella).unwrap();
    let chart_dir = chart().canonicalize().unwrap();
    std::fs::write(
        umbrella.join("Chart.yaml"),
        format!(
            "apiVersion: v2\nname: umbrella\nversion: 1.0.0\ndependencies:\n\
             - name: tt-k8s-driver-manager\n  version: \">=0.0.0\"\n  repository: file://{}\n",
            chart_dir.display()
        ),
    )
    .unwrap();
    std::fs::write(
        umbrella.join("values.yaml"),
        "global:\n  imageRegistry: registry.example\n  labels: {team: ml}\n\
         tt-k8s-driver-manager:\n  controller:\n    replicas: 2\n",
    )
    .unwrap();
    let umbrella_path = umbrella.to_str().unwrap();
    helm_in(&home, &["dependency", "update", umbrella_path]);
    let rendered = helm_in(
        &home,
        &[
            "template",
            "stack",
            umbrella_path,
            "-n",
            "tt-k8s-driver-manager-system",
            "--include-crds",
        ],
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple(&rendered).unwrap();
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let deploy: apps::Deployment = typed(find(&docs, "Deployment", "-controller"));
    assert_eq!(
        deploy.spec.unwrap().replicas,
        Some(2),
        "the umbrella's values reach the chart"
    );
    let crd: CustomResourceDefinition = typed(find(&docs, "CustomResourceDefinition", ".com"));
    assert_eq!(crd, ttdp_api::crd(), "the dependency brings its CRD");
    std::fs::remove_dir_all(&home).unwrap();
}

/// The value of the controller container's environment variable `name`.
fn controller_env(docs: &[Value], name: &str) -> Option<String> {
    let d: apps::Deployment = typed(find(docs, "Deployment", "-controller"));
    let pod = d.spec?.template.spec?;
    let var = pod.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)?;
    var.value.clone()
}

#[test]
fn agent_pod_values_reach_the_controller_and_the_agents_service_account() {
    let docs = template(&[
        "imagePullSecrets[0].name=regcred",
        "agent.imagePullSecrets[0].name=agents-only",
        "agent.resources.limits.memory=1Gi",
        "agent.tolerations[0].key=dedicated",
        "agent.tolerations[0].operator=Exists",
        "agent.nodeSelector.pool=tt",
        "proxy.httpsProxy=http://proxy.internal:3128",
        "proxy.noProxy=10.0.0.0/8",
    ]);
    let json = controller_env(&docs, "TTDP_AGENT_POD").expect("TTDP_AGENT_POD is set");
    let pod: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        pod["imagePullSecrets"],
        serde_json::json!(["regcred", "agents-only"])
    );
    assert_eq!(pod["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert_eq!(pod["nodeSelector"]["pool"], "tt");
    assert_eq!(pod["proxy"]["httpsProxy"], "http://proxy.internal:3128");
    assert_eq!(pod["proxy"]["noProxy"], "10.0.0.0/8");
    let agent_sa: core::ServiceAccount = typed(find(&docs, "ServiceAccount", "-agent"));
    let names: Vec<String> = (agent_sa.image_pull_secrets.into_iter().flatten())
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["regcred", "agents-only"]);

    let defaults = template(&[]);
    let none: Value =
        serde_json::from_str(&controller_env(&defaults, "TTDP_AGENT_POD").unwrap()).unwrap();
    assert_eq!(none["imagePullSecrets"], serde_json::json!([]));
    assert!(
        none.get("resources").is_none(),
        "the agent's own requests stay"
    );
    let d: apps::Deployment = typed(find(&defaults, "Deployment", "-controller"));
    let selector = d
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .node_selector
        .unwrap();
    assert_eq!(
        selector["kubernetes.io/arch"], "amd64",
        "the image is built for amd64"
    );
}
