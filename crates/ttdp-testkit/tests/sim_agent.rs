//! Smoke test of the whole chain with the real `ttdp-agent` binary: the real DaemonSet
//! controller -> simulated kubelet -> agent process on a simulated host -> simulated kernel,
//! tt-kmd built from the simulated repository. It runs the `ttdp-agent` binary of this target directory (built here
//! when missing), or `TTDP_AGENT_BIN`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ExecAction, Node, ObjectFieldSelector, PodSpec,
    PodTemplateSpec, Probe,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use ttdp_api::names;
use ttdp_testkit::sim::{
    SCENARIO_LABEL, SimCluster, SimClusterOptions, TenstorrentNode, eventually,
};

const AGENT_IMAGE: &str = "sim.test/ttdp-agent";
/// The policy the agents belong to (their pods' policy label, and the grant's).
const POLICY: &str = "smoke";

/// `TTDP_AGENT_BIN`, or `ttdp-agent` next to this test's `deps/` directory.
fn agent_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TTDP_AGENT_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let path = profile_dir.join("ttdp-agent");
    if !path.is_file() {
        // `cargo test --workspace` has built it already; a lone `cargo test -p ttdp-testkit`
        // builds it here, into the same target directory.
        let status = std::process::Command::new(
            std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()),
        )
        .args(["build", "-p", "ttdp-agent", "--bin", "ttdp-agent"])
        .args(["--features", "sim,test-hooks"])
        .env("CARGO_TARGET_DIR", profile_dir.parent().unwrap())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cannot run cargo to build ttdp-agent");
        assert!(status.success(), "building ttdp-agent failed");
    }
    path
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    }
}

fn field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.to_owned(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// The shape of the controller's agent DaemonSet that matters here.
fn agent_daemonset(cluster: &SimCluster, version: &str) -> DaemonSet {
    let labels = BTreeMap::from([("app".to_owned(), "agent".to_owned())]);
    DaemonSet {
        metadata: ObjectMeta {
            name: Some("ttdrv-smoke".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                rolling_update: None,
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(
                        labels
                            .into_iter()
                            .chain([(names::labels::POLICY.to_owned(), POLICY.to_owned())])
                            .collect(),
                    ),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    node_selector: Some(BTreeMap::from([
                        (
                            "feature.node.kubernetes.io/pci-1200_1e52.present".to_owned(),
                            "true".to_owned(),
                        ),
                        (SCENARIO_LABEL.to_owned(), cluster.prefix().to_owned()),
                    ])),
                    containers: vec![Container {
                        name: "agent".to_owned(),
                        image: Some(format!("{AGENT_IMAGE}:dev")),
                        command: Some(vec!["ttdp-agent".to_owned()]),
                        env: Some(vec![
                            env("TT_KMD_VERSION", version),
                            env("TT_SMI_VERSION", "3.0.0"),
                            env("TTDP_TT_SMI_PATH", "none"),
                            field("NODE_NAME", "spec.nodeName"),
                            field("POD_NAME", "metadata.name"),
                            field("POD_NAMESPACE", "metadata.namespace"),
                        ]),
                        readiness_probe: Some(Probe {
                            exec: Some(ExecAction {
                                command: Some(vec!["ttdp-agent".to_owned(), "probe".to_owned()]),
                            }),
                            period_seconds: Some(10),
                            timeout_seconds: Some(5),
                            failure_threshold: Some(1),
                            ..Probe::default()
                        }),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

#[tokio::test]
async fn the_real_agent_installs_upgrades_and_stands_down() {
    let binary = agent_binary();
    assert!(binary.is_file(), "no agent binary at {}", binary.display());
    let cluster = SimCluster::start(
        SimClusterOptions::new()
            .node(TenstorrentNode::new().loaded("2.7.0"))
            .tenstorrent_nodes(1)
            .node(TenstorrentNode::new().host_managed("1.34.0"))
            .kmd_versions(&["2.8.0"])
            .image(AGENT_IMAGE, &binary)
            .time_scale(0.1),
    )
    .await
    .unwrap();
    // No controller runs here: grant the node with 2.7.0 loaded its upgrade, as the controller
    // does once the node is cordoned and drained (without it the agent keeps 2.7.0 loaded).
    let loaded_node = &cluster.tenstorrent_node_names()[0];
    Api::<Node>::all(cluster.client())
        .patch(
            loaded_node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                names::annotations::UPGRADE_GRANT: names::upgrade_grant(POLICY, "2.8.0")
            }}})),
        )
        .await
        .unwrap();
    let api: Api<DaemonSet> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(&PostParams::default(), &agent_daemonset(&cluster, "2.8.0"))
        .await
        .unwrap();
    eventually("every agent ready", Duration::from_secs(120), || {
        let api = api.clone();
        async move { (api.get("ttdrv-smoke").await.ok()?.status?.number_ready == 3).then_some(()) }
    })
    .await
    .unwrap();

    let tt = cluster.tenstorrent_node_names();
    let expected = [
        ("2.8.0", "container"),
        ("2.8.0", "container"),
        ("1.34.0", "host"),
    ];
    for (name, (version, mode)) in tt.iter().zip(expected) {
        let root = cluster
            .node(name)
            .unwrap()
            .host_root()
            .unwrap()
            .to_path_buf();
        let loaded = std::fs::read_to_string(root.join("sys/module/tenstorrent/version")).unwrap();
        assert_eq!(loaded.trim(), version, "module on {name}");
        let node = cluster.get_node(name).await.unwrap();
        let labels = node.metadata.labels.unwrap();
        assert_eq!(
            labels["driver.tenstorrent.com/kmd-version"], version,
            "label on {name}"
        );
        assert_eq!(
            labels["driver.tenstorrent.com/install-mode"], mode,
            "mode of {name}"
        );
    }
    cluster.shutdown().await.unwrap();
}
