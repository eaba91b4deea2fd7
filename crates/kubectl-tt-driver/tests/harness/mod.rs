//! Running the real `kubectl` with the plugin on its PATH against the ttdp-testkit API server,
//! with a populated fleet.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, ObjectReference, Pod, PodTemplateSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use ttdp_api::names::DEFAULT_NAMESPACE;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};
use ttdp_testkit::apiserver::TestApiServer;

use crate::fixture;

/// How long any single kubectl run may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The real kubectl: `$TTDP_KUBECTL`, else `~/.local/ttdp-tools/bin/kubectl` (installed by
/// `.ci/kube-tools`), else `kubectl` on PATH. Panics with instructions when there is none:
/// these tests must fail, not skip, without it.
pub fn kubectl() -> PathBuf {
    if let Some(p) = std::env::var_os("TTDP_KUBECTL") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "TTDP_KUBECTL={} is not a file; point it at a kubectl binary or unset it",
            p.display()
        );
        return p;
    }
    if let Some(home) = std::env::var_os("HOME") {
        let p = Path::new(&home).join(".local/ttdp-tools/bin/kubectl");
        if p.is_file() {
            return p;
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("kubectl");
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "kubectl not found: these end-to-end tests run the real kubectl. Install it with \
         `bash .ci/kube-tools` (puts kubectl into ~/.local/ttdp-tools/bin) or set TTDP_KUBECTL"
    );
}

/// The output of one kubectl run.
#[derive(Debug)]
pub struct Run {
    /// Exit code.
    pub code: Option<i32>,
    /// stdout.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
}

impl Run {
    /// Panics with both streams unless the run succeeded.
    pub fn ok(self) -> Run {
        assert_eq!(self.code, Some(0), "kubectl failed: {self:#?}");
        self
    }

    /// Panics unless the run failed with exit code 1.
    pub fn failed(self) -> Run {
        assert_eq!(self.code, Some(1), "kubectl should have failed: {self:#?}");
        self
    }
}

/// A test API server, a client, and a directory holding the plugin for PATH.
pub struct Harness {
    /// The server.
    pub server: TestApiServer,
    /// A client of it.
    pub client: Client,
    bin: tempfile::TempDir,
}

impl Harness {
    /// A server without the CRD.
    pub async fn bare() -> Harness {
        let server = TestApiServer::start()
            .await
            .expect("test api server starts");
        let client = server.client().await.expect("client");
        let bin = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(
            env!("CARGO_BIN_EXE_kubectl-tt-driver"),
            bin.path().join("kubectl-tt-driver"),
        )
        .expect("symlink the plugin");
        Harness {
            server,
            client,
            bin,
        }
    }

    /// A server with the CRD installed and no policies.
    pub async fn with_crd() -> Harness {
        let h = Harness::bare().await;
        let crds: Api<CustomResourceDefinition> = Api::all(h.client.clone());
        crds.create(&PostParams::default(), &ttdp_api::crd())
            .await
            .expect("install the CRD");
        h
    }

    /// A server with the fleet of [`fixture::every_state`] (both policies with their
    /// statuses), its Nodes (node-3 and node-7 cordoned by fleet), the DaemonSet of `fleet`
    /// and a Warning Event about `fleet`.
    pub async fn populated() -> Harness {
        let h = Harness::with_crd().await;
        let fleet = fixture::every_state();
        for view in &fleet.policies {
            h.create_policy(&view.policy).await;
        }
        for i in 1..=11 {
            let name = format!("node-{i}");
            let cordoned = matches!(i, 3 | 7).then_some("fleet");
            h.create_node(&fixture::k8s_node(&name, Some("2.7.0"), cordoned))
                .await;
        }
        h.create_daemonset("fleet", 9, 8).await;
        h.create_agent_pod("fleet", "node-7").await;
        h.create_event(
            "fleet",
            "Warning",
            "DrainTimeout",
            "node-7: pods ml/trainer-0 did not leave within 600s",
        )
        .await;
        h
    }

    /// Creates a policy and then writes its status through the status subresource.
    pub async fn create_policy(&self, policy: &TenstorrentDriverPolicy) {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.client.clone());
        let mut new = policy.clone();
        new.metadata = ObjectMeta {
            name: policy.metadata.name.clone(),
            ..ObjectMeta::default()
        };
        new.status = None;
        let name = policy.metadata.name.clone().expect("named");
        api.create(&PostParams::default(), &new)
            .await
            .expect("create policy");
        self.set_status(policy).await;
        let _ = name;
    }

    /// Replaces a policy's status.
    pub async fn set_status(&self, policy: &TenstorrentDriverPolicy) {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.client.clone());
        let name = policy.metadata.name.clone().expect("named");
        let mut status = serde_json::to_value(&policy.status).expect("status json");
        if let Some(s) = status.as_object_mut() {
            s.insert("observedGeneration".into(), json!(1));
        }
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .expect("write status");
    }

    /// Moves one node of a policy to `state` with loaded `version`.
    pub async fn set_node_state(&self, policy: &str, node: &str, state: NodeState, version: &str) {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.client.clone());
        let mut p = api.get(policy).await.expect("get policy");
        let status = p.status.as_mut().expect("has status");
        let n = status
            .nodes
            .iter_mut()
            .find(|n| n.name == node)
            .expect("node listed");
        n.state = state;
        n.current_version = Some(version.to_owned());
        self.set_status(&p).await;
    }

    /// Creates a Node.
    pub async fn create_node(&self, node: &Node) {
        let api: Api<Node> = Api::all(self.client.clone());
        api.create(&PostParams::default(), node)
            .await
            .expect("create node");
    }

    /// Creates the namespace (if needed) and DaemonSet `ttdrv-<policy>` with these counters.
    pub async fn create_daemonset(&self, policy: &str, desired: i32, ready: i32) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(DEFAULT_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let _ = namespaces.create(&PostParams::default(), &ns).await;
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), DEFAULT_NAMESPACE);
        let labels = std::collections::BTreeMap::from([("app".to_owned(), "x".to_owned())]);
        let ds = DaemonSet {
            metadata: ObjectMeta {
                name: Some(ttdp_api::names::daemonset_name(policy)),
                ..ObjectMeta::default()
            },
            spec: Some(DaemonSetSpec {
                selector: LabelSelector {
                    match_labels: Some(labels.clone()),
                    ..LabelSelector::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(
                        serde_json::from_value(json!({
                            "containers": [{"name": "agent", "image": "ttdp-agent:test"}]
                        }))
                        .expect("pod spec"),
                    ),
                },
                ..DaemonSetSpec::default()
            }),
            status: None,
        };
        let name = ds.metadata.name.clone().expect("named");
        api.create(&PostParams::default(), &ds)
            .await
            .expect("create daemonset");
        let status = DaemonSetStatus {
            desired_number_scheduled: desired,
            number_ready: ready,
            current_number_scheduled: desired,
            number_misscheduled: 0,
            updated_number_scheduled: Some(ready),
            ..DaemonSetStatus::default()
        };
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .expect("daemonset status");
    }

    /// Creates an agent pod of `policy` on `node` in the operator namespace (which
    /// [`Harness::create_daemonset`] creates).
    pub async fn create_agent_pod(&self, policy: &str, node: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), DEFAULT_NAMESPACE);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": format!("ttdrv-{policy}-{node}"),
                "labels": { ttdp_api::names::labels::POLICY: policy },
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "agent", "image": "ttdp-agent:test"}],
            },
        }))
        .expect("pod");
        api.create(&PostParams::default(), &pod)
            .await
            .expect("create agent pod");
    }

    /// Creates a core/v1 Event about a policy in namespace `default`.
    pub async fn create_event(&self, policy: &str, type_: &str, reason: &str, message: &str) {
        let api: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let now = Time(jiff::Timestamp::now());
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{policy}.")),
                namespace: Some("default".to_owned()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("driver.tenstorrent.com/v1alpha1".to_owned()),
                kind: Some("TenstorrentDriverPolicy".to_owned()),
                name: Some(policy.to_owned()),
                ..ObjectReference::default()
            },
            type_: Some(type_.to_owned()),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            reporting_component: Some("ttdp-controller".to_owned()),
            ..Event::default()
        };
        api.create(&PostParams::default(), &ev)
            .await
            .expect("create event");
    }

    /// PATH with the plugin first, then kubectl's directory, then the system.
    pub fn path_env(&self) -> std::ffi::OsString {
        let kubectl = kubectl();
        let mut dirs = vec![self.bin.path().to_path_buf()];
        if let Some(d) = kubectl.parent() {
            dirs.push(d.to_path_buf());
        }
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        std::env::join_paths(dirs).expect("PATH")
    }

    /// A `kubectl` command with the plugin on PATH and KUBECONFIG pointing at the server.
    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(kubectl());
        cmd.args(args)
            .env("PATH", self.path_env())
            .env("KUBECONFIG", self.server.kubeconfig_path())
            .env_remove("NO_COLOR")
            .env_remove("COLUMNS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs `kubectl <args>` to completion (bounded by [`RUN_TIMEOUT`]).
    pub async fn kubectl(&self, args: &[&str]) -> Run {
        self.run(self.command(args)).await
    }

    /// Runs a prepared command to completion.
    pub async fn run(&self, mut cmd: tokio::process::Command) -> Run {
        let output = tokio::time::timeout(RUN_TIMEOUT, cmd.output())
            .await
            .expect("kubectl finished in time")
            .expect("kubectl ran");
        Run {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}
