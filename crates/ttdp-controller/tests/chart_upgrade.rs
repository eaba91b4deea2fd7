//! The chart over time, with the real `helm` on a real control plane: the previous chart (the
//! chart as an earlier commit had it, whose CRD lacks `spec.source.prebuilt.checksums`) is
//! installed and holds policies; then the upgrade runs as docs/install.md tells an admin to run
//! it: this chart's CRD applied (`helm show crds <chart> | kubectl apply --server-side
//! --force-conflicts -f -`, since Helm never upgrades the files in `crds/`), then `helm upgrade`.
//! Every policy stays as it was, a policy may use the new field and it round-trips (not pruned),
//! and `helm uninstall` leaves the CRD and the policies in place.
//!
//! The test puts an older CRD on its cluster, which would break any other suite running on the
//! same cluster: it starts a control plane of its own instead of the shared one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use ttdp_testkit::launcher::{Assets, ControlPlane};
use ttdp_testkit::sim::cluster::client_for;

const CHART: &str = "deploy/helm/tt-k8s-driver-manager";
const CRD_NAME: &str = "tenstorrentdriverpolicies.driver.tenstorrent.com";
/// The chart as it was before the prebuilt modules' checksums: its CRD has no
/// `spec.source.prebuilt.checksums`, which the current one has.
const PREVIOUS_COMMIT: &str = "bb363f2bd666e847b23f18600ec223eb8a865ce2";
const RELEASE: &str = "ttdm";
const NAMESPACE: &str = "tt-k8s-driver-manager-system";
/// No kubelet runs the controller image here: its pod is pinned to a node that does not exist.
const NO_NODE: &str = "controller.nodeSelector.kubernetes\\.io/hostname=no-such-node";
/// What the chart's notes say after `helm upgrade`.
const CRD_REMINDER: &str = "Helm does not upgrade CRDs.";
const SHA256: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `helm` or `kubectl`: `$TTDP_HELM` / `$TTDP_KUBECTL`, else `~/.local/ttdp-tools/bin`.
fn tool(name: &str) -> PathBuf {
    if let Ok(p) = std::env::var(format!("TTDP_{}", name.to_uppercase())) {
        return p.into();
    }
    let p = PathBuf::from(std::env::var("HOME").unwrap_or_default())
        .join(".local/ttdp-tools/bin")
        .join(name);
    assert!(
        p.is_file(),
        "{name} not found at {}: run `bash .ci/kube-tools` first",
        p.display()
    );
    p
}

/// Runs `name` (helm or kubectl) on the cluster of `kubeconfig` with `stdin`; its output, or a
/// panic with its errors.
fn run(name: &str, kubeconfig: &Path, home: &Path, args: &[&str], stdin: &str) -> String {
    let mut child = Command::new(tool(name))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .current_dir(repo_root())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{name} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The chart of [`PREVIOUS_COMMIT`], extracted under `dir`.
fn previous_chart(dir: &Path) -> PathBuf {
    let archive = dir.join("previous.tar");
    let status = Command::new("git")
        .args(["archive", "--format=tar", "-o"])
        .arg(&archive)
        .args([PREVIOUS_COMMIT, CHART])
        .current_dir(repo_root())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "git archive {PREVIOUS_COMMIT}: the test needs the repository's history"
    );
    let status = Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success());
    dir.join(CHART)
}

fn policies(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(
        "driver.tenstorrent.com",
        "v1alpha1",
        "TenstorrentDriverPolicy",
    );
    let resource = ApiResource::from_gvk_with_plural(&gvk, "tenstorrentdriverpolicies");
    Api::all_with(client.clone(), &resource)
}

/// Whether the CRD's served schema has `spec.source.prebuilt.checksums`.
fn has_checksums(crd: &CustomResourceDefinition) -> bool {
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    let prebuilt = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["source"]["properties"]
        ["prebuilt"]["properties"];
    assert!(prebuilt.is_object(), "the CRD has no spec.source.prebuilt");
    prebuilt.get("checksums").is_some()
}

async fn wait_served(client: &Client) {
    let start = Instant::now();
    while policies(client).list(&Default::default()).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the TenstorrentDriverPolicy resource is not served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Applies a policy (server-side, as `kubectl apply --server-side` would).
async fn apply_policy(client: &Client, name: &str, spec: Value) -> DynamicObject {
    let body = json!({
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": {"name": name},
        "spec": spec,
    });
    let pp = PatchParams::apply("chart-upgrade-test").validation_strict();
    policies(client)
        .patch(name, &pp, &Patch::Apply(body))
        .await
        .unwrap()
}

/// The policies the previous chart's users made.
fn old_policies() -> [(&'static str, Value); 2] {
    [
        (
            "fleet",
            json!({"version": "2.7.0", "nodeAffinity": {"matchLabels": {"pool": "a"}}}),
        ),
        (
            "canary",
            json!({
                "version": "2.8.0",
                "nodeAffinity": {"matchLabels": {"pool": "b"}},
                "upgradePolicy": {"maxUnavailable": 1},
                "source": {"repository": "https://git.example/tt-kmd.git"},
            }),
        ),
    ]
}

#[test]
fn upgrade_from_the_previous_chart_keeps_policies_and_adds_new_fields() {
    let assets = Assets::locate().unwrap();
    let runs = tempfile::tempdir().unwrap();
    // Blocking, on this thread: the control plane's processes live as long as it does.
    let plane = ControlPlane::start(&assets, runs.path()).unwrap();
    let kubeconfig = plane.kubeconfig().to_path_buf();
    let home = tempfile::tempdir().unwrap();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(upgrade_scenario(&kubeconfig, home.path()));
    drop(plane);
}

async fn upgrade_scenario(kubeconfig: &Path, home: &Path) {
    let client = client_for(kubeconfig).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let helm = |args: &[&str]| run("helm", kubeconfig, home, args, "");
    let previous = previous_chart(home);
    let previous = previous.to_str().unwrap();

    // The previous chart, installed, holding policies; its CRD lacks the new field.
    helm(&[
        "install",
        RELEASE,
        previous,
        "-n",
        NAMESPACE,
        "--create-namespace",
        "--set",
        NO_NODE,
    ]);
    wait_served(&client).await;
    assert!(
        !has_checksums(&crds.get(CRD_NAME).await.unwrap()),
        "the previous chart's CRD already has spec.source.prebuilt.checksums: \
         pick an older PREVIOUS_COMMIT"
    );
    let mut before = Vec::new();
    for (name, spec) in old_policies() {
        before.push(apply_policy(&client, name, spec).await);
    }

    // The upgrade, as docs/install.md says: this chart's CRD, then helm upgrade.
    let crd_yaml = helm(&["show", "crds", CHART]);
    run(
        "kubectl",
        kubeconfig,
        home,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &crd_yaml,
    );
    let upgraded = helm(&["upgrade", RELEASE, CHART, "-n", NAMESPACE, "--set", NO_NODE]);
    assert!(
        upgraded.contains(CRD_REMINDER),
        "helm upgrade does not remind of the CRD step:\n{upgraded}"
    );
    let history = helm(&["history", RELEASE, "-n", NAMESPACE, "-o", "json"]);
    let history: Vec<Value> = serde_json::from_str(&history).unwrap();
    assert_eq!(history.len(), 2, "{history:?}");
    assert_eq!(history[1]["status"], "deployed", "{history:?}");
    assert!(
        has_checksums(&crds.get(CRD_NAME).await.unwrap()),
        "the CRD in the cluster lacks spec.source.prebuilt.checksums after the upgrade"
    );

    // Every policy is still there, the same object with the same spec.
    wait_served(&client).await;
    for old in &before {
        let now = policies(&client)
            .get_opt(&old.name_any())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("policy {} is gone after the upgrade", old.name_any()));
        assert_eq!(
            now.uid(),
            old.uid(),
            "policy {} was recreated",
            old.name_any()
        );
        assert_eq!(
            now.data["spec"],
            old.data["spec"],
            "policy {} changed",
            old.name_any()
        );
    }

    // The new field is accepted (strict field validation: not an unknown field) and kept.
    let checksums =
        json!([{"version": "2.7.0", "kernelRelease": "6.8.0-111-generic", "sha256": SHA256}]);
    let mut spec = old_policies()[0].1.clone();
    spec["source"] = json!({"prebuilt": {
        "url": "https://ko.example/{version}/{kernelRelease}/tenstorrent.ko",
        "checksums": checksums,
    }});
    apply_policy(&client, "fleet", spec).await;
    let read = policies(&client).get("fleet").await.unwrap();
    assert_eq!(
        read.data["spec"]["source"]["prebuilt"]["checksums"], checksums,
        "spec.source.prebuilt.checksums does not round-trip: {}",
        read.data["spec"]
    );

    // helm uninstall leaves the CRD, and with it every policy.
    helm(&["uninstall", RELEASE, "-n", NAMESPACE]);
    assert!(crds.get_opt(CRD_NAME).await.unwrap().is_some());
    let names: Vec<String> = policies(&client)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(names, ["canary", "fleet"], "policies after helm uninstall");
}
