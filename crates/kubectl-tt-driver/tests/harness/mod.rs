//! Running the real `kubectl` with the plugin on its PATH against a real control plane
//! (`ttdp_testkit::launcher::test_kubeconfig`), with a populated fleet.
//!
//! Each test works in its own [`Scratch`]: its policies and nodes are named `<prefix>-fleet`,
//! `<prefix>-node-7`, ... and removed when the test ends. The plugin lists every policy and
//! node of the cluster, so tests assert on their own objects only (other tests' policies may
//! be there at the same time).
//!
//! Nothing here fakes what the real server can do: the DaemonSet's counters come from the real
//! DaemonSet controller, its agent pods run on simulated kubelets (one healthy, one
//! crash-looping), 403s come from ServiceAccounts that RBAC limits and 401s from a token the
//! server does not know. Only what a shared real cluster cannot be made to answer goes through
//! the [`FaultProxy`]: an API the server does not serve (the CRD not installed,
//! events.k8s.io/v1 missing), a cluster without policies, and a 500.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Event, Node, ObjectReference, Pod, Taint};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use ttdp_api::{NodeState, TenstorrentDriverPolicy};
use ttdp_testkit::cluster_setup::{apply_service_account, install_crd};
use ttdp_testkit::fault_proxy::FaultProxy;
use ttdp_testkit::launcher::tokens;
use ttdp_testkit::scratch::Scratch;
use ttdp_testkit::sim::{
    ImageMap, KubeletConfig, SCENARIO_LABEL, SimKubelet, SimNodeSpec, TimeScale,
};

use crate::fixture;

/// How long any single kubectl run may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the cluster may take to reach a state a test set up.
const SETTLE: Duration = Duration::from_secs(60);
/// The agent image of the test DaemonSet; the simulated kubelets run it as `/bin/sh`.
const AGENT_IMAGE: &str = "ttdp.test/agent";
/// The agent's script: crash at once where the node says so (`CRASH=1`), else stay up.
const AGENT_SCRIPT: &str = "if [ \"$CRASH\" = 1 ]; then echo 'modprobe: ERROR: could not insert tenstorrent' >&2; exit 1; fi; exec /bin/sleep 600";
/// Nodes of the populated fleet that run an agent pod: node-6 (healthy) and node-7
/// (crash-looping).
pub const AGENT_NODES: [&str; 2] = ["node-6", "node-7"];

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

/// A test's corner of the real cluster, a fault proxy in front of it, and a directory holding
/// the plugin for PATH (and the kubeconfigs of limited identities).
pub struct Harness {
    /// The test's prefix, namespace and cleanup.
    pub scratch: Scratch,
    /// An admin client of the real server.
    pub client: Client,
    /// A proxy in front of the real server, for what the server cannot be made to answer.
    pub proxy: FaultProxy,
    kubelet: Option<SimKubelet>,
    bin: tempfile::TempDir,
}

impl Harness {
    /// The CRD installed (shared, left in place), no policies of this test yet.
    pub async fn start() -> Harness {
        let scratch = Scratch::new("kt")
            .await
            .expect("a scratch namespace on the test cluster");
        install_crd(&scratch.client()).await.expect("the ttdp CRD");
        let client = scratch.client();
        let proxy = FaultProxy::start(client.clone())
            .await
            .expect("the fault proxy starts");
        let bin = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(
            env!("CARGO_BIN_EXE_kubectl-tt-driver"),
            bin.path().join("kubectl-tt-driver"),
        )
        .expect("symlink the plugin");
        std::os::unix::fs::symlink(
            env!("CARGO_BIN_EXE_kubectl_complete-tt-driver"),
            bin.path().join("kubectl_complete-tt-driver"),
        )
        .expect("symlink the completion helper");
        Harness {
            scratch,
            client,
            proxy,
            kubelet: None,
            bin,
        }
    }

    /// The fleet of [`fixture::every_state`] named for this test (`<prefix>-fleet` over
    /// `<prefix>-node-1..9`, `<prefix>-canary` over `<prefix>-node-10..11`), with statuses,
    /// its Nodes (node-3 and node-7 cordoned by fleet) and a Warning
    /// Event about fleet.
    pub async fn populated() -> Harness {
        Harness::populate(false).await
    }

    /// [`Harness::populated`], and the real DaemonSet `ttdrv-<prefix>-fleet` in the test's
    /// namespace running on [`AGENT_NODES`], served by simulated kubelets: the agent on node-6
    /// is Ready, the one on node-7 crash-loops, so the DaemonSet controller reports 1/2 ready.
    pub async fn populated_with_agents() -> Harness {
        Harness::populate(true).await
    }

    async fn populate(agents: bool) -> Harness {
        let mut h = Harness::start().await;
        let fleet = fixture::every_state();
        for view in &fleet.policies {
            h.create_policy(&view.policy).await;
        }
        let on_kubelet: &[&str] = if agents { &AGENT_NODES } else { &[] };
        for i in 1..=11 {
            let short = format!("node-{i}");
            if !on_kubelet.contains(&short.as_str()) {
                h.create_node(&fixture::k8s_node(&short, Some("2.7.0"), None))
                    .await;
            }
        }
        if agents {
            h.start_kubelet(on_kubelet).await;
        }
        for short in ["node-3", "node-7"] {
            h.cordon(short, "fleet").await;
        }
        h.create_event(
            "fleet",
            "Warning",
            "DrainTimeout",
            &format!(
                "{}: pods ml/trainer-0 did not leave within 600s",
                h.n("node-7")
            ),
        )
        .await;
        if agents {
            h.create_agent_daemonset("fleet").await;
        }
        h
    }

    /// Links the plugin as a krew install does (`kubectl-tt_driver`, run as `kubectl
    /// tt-driver`) and, as the krew manifest's caveat says, as `kubectl_complete-tt_driver`
    /// (a link to the plugin itself).
    pub fn link_as_krew(&self) {
        let plugin = self.bin.path().join("kubectl-tt_driver");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kubectl-tt-driver"), &plugin)
            .expect("link the plugin as krew does");
        std::os::unix::fs::symlink(
            "kubectl-tt_driver",
            self.bin.path().join("kubectl_complete-tt_driver"),
        )
        .expect("link the completion name to the plugin");
    }

    /// Writes `record` as node `short`'s upgrade record (annotation and state label), as the
    /// controller does before acting on the node.
    pub async fn set_record(&self, short: &str, record: &ttdp_api::node_record::NodeRecord) {
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"metadata": {
            "annotations": {ttdp_api::names::annotations::UPGRADE_RECORD: record.to_annotation()},
            "labels": {ttdp_api::names::labels::UPGRADE_STATE: record.state_label()},
        }});
        api.patch(
            &self.n(short),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .unwrap_or_else(|e| panic!("record on node {}: {e}", self.n(short)));
    }

    /// The agent pods of policy `policy` (short name) in the test's namespace: (node, pod).
    pub async fn agent_pods(&self, policy: &str) -> Vec<(String, String)> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let selector = format!("{}={}", ttdp_api::names::labels::POLICY, self.n(policy));
        pods.list(&ListParams::default().labels(&selector))
            .await
            .expect("list agent pods")
            .items
            .iter()
            .map(|p| {
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                (
                    node.unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    /// The test's prefix.
    pub fn prefix(&self) -> &str {
        self.scratch.prefix()
    }

    /// `<prefix>-<short>`.
    pub fn n(&self, short: &str) -> String {
        self.scratch.name(short)
    }

    /// The test's namespace (where its DaemonSet runs).
    pub fn ns(&self) -> &str {
        self.scratch.namespace()
    }

    /// The admin kubeconfig of the real cluster.
    pub fn kubeconfig(&self) -> &Path {
        self.scratch.kubeconfig()
    }

    /// `policy` with this test's names: the policy, its nodes and the node names in its
    /// condition and node messages get the prefix. Nodes are selected by the test's
    /// [`SCENARIO_LABEL`], so no other test's node counts as one of its nodes.
    pub fn named(&self, policy: &TenstorrentDriverPolicy) -> TenstorrentDriverPolicy {
        let rename = |text: &str| text.replace("node-", &self.n("node-"));
        let mut p = policy.clone();
        p.metadata.name = p.metadata.name.as_deref().map(|n| self.n(n));
        p.spec.node_affinity = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                SCENARIO_LABEL.to_owned(),
                self.prefix().to_owned(),
            )])),
            ..LabelSelector::default()
        });
        if let Some(status) = p.status.as_mut() {
            for node in &mut status.nodes {
                node.name = self.n(&node.name);
                node.message = node.message.as_deref().map(rename);
            }
            for c in &mut status.conditions {
                c.message = rename(&c.message);
            }
        }
        p
    }

    /// Creates [`Harness::named`]`(policy)`, then writes its status through the status
    /// subresource.
    pub async fn create_policy(&self, policy: &TenstorrentDriverPolicy) {
        let named = self.named(policy);
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.client.clone());
        let mut new = named.clone();
        new.metadata = ObjectMeta {
            name: named.metadata.name.clone(),
            ..ObjectMeta::default()
        };
        new.status = None;
        api.create(&PostParams::default(), &new)
            .await
            .expect("create policy");
        self.set_status(&named).await;
    }

    /// Replaces a policy's status (the policy already carries this test's names).
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
        .unwrap_or_else(|e| panic!("write the status of policy {name}: {e}"));
    }

    /// Moves node `node` (short name) of policy `policy` (short name) to `state` with loaded
    /// `version`.
    pub async fn set_node_state(&self, policy: &str, node: &str, state: NodeState, version: &str) {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.client.clone());
        let mut p = api.get(&self.n(policy)).await.expect("get policy");
        let node = self.n(node);
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

    /// Creates `node` renamed `<prefix>-<name>` and labelled with the test's
    /// [`SCENARIO_LABEL`]. No kubelet serves it: the plugin reads only its labels, annotations
    /// and `spec.unschedulable`.
    pub async fn create_node(&self, node: &Node) {
        let mut node = node.clone();
        let short = node.metadata.name.clone().expect("named");
        node.metadata.name = Some(self.n(&short));
        node.metadata
            .labels
            .get_or_insert_default()
            .insert(SCENARIO_LABEL.to_owned(), self.prefix().to_owned());
        let api: Api<Node> = Api::all(self.client.clone());
        api.create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("create node {}: {e}", self.n(&short)));
    }

    /// Cordons node `short` the way the controller does for policy `policy` (short name).
    pub async fn cordon(&self, short: &str, policy: &str) {
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({
            "metadata": {"annotations": {
                ttdp_api::names::annotations::CORDONED_BY: ttdp_api::names::cordon_owner(&self.n(policy)),
            }},
            "spec": {"unschedulable": true},
        });
        api.patch(
            &self.n(short),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .unwrap_or_else(|e| panic!("cordon node {}: {e}", self.n(short)));
    }

    /// Registers nodes `shorts` (labelled like [`fixture::k8s_node`] at 2.7.0, tainted
    /// `SCENARIO_LABEL=<prefix>:NoSchedule` so nothing else is scheduled there) on a simulated
    /// kubelet that runs [`AGENT_IMAGE`] as `/bin/sh`; node-7's agent crashes.
    async fn start_kubelet(&mut self, shorts: &[&str]) {
        let specs = shorts
            .iter()
            .map(|short| {
                let template = fixture::k8s_node(short, Some("2.7.0"), None);
                let mut spec = SimNodeSpec::new(self.n(short));
                spec.labels = template.metadata.labels.unwrap_or_default();
                spec.labels
                    .insert(SCENARIO_LABEL.to_owned(), self.prefix().to_owned());
                spec.taints = vec![Taint {
                    key: SCENARIO_LABEL.to_owned(),
                    value: Some(self.prefix().to_owned()),
                    effect: "NoSchedule".to_owned(),
                    time_added: None,
                }];
                if *short == "node-7" {
                    spec.env = vec![("CRASH".to_owned(), "1".to_owned())];
                }
                spec
            })
            .collect();
        // Real time: the crash-looping agent then spends 10 s, 20 s, ... in CrashLoopBackOff
        // between runs of a few milliseconds, so every read sees it backing off.
        let config = KubeletConfig {
            image_map: ImageMap::new().with(AGENT_IMAGE, "/bin/sh"),
            time_scale: TimeScale::REAL,
            ..KubeletConfig::default()
        };
        let kubelet = SimKubelet::start(self.client.clone(), config, specs)
            .await
            .expect("simulated kubelet starts");
        self.kubelet = Some(kubelet);
    }

    /// Creates the DaemonSet `ttdrv-<prefix>-<policy>` in the test's namespace, its pods
    /// labelled with the policy as the controller labels them, on [`AGENT_NODES`]; waits until
    /// the DaemonSet controller reports 2 desired and 1 ready and node-7's agent is in
    /// CrashLoopBackOff.
    pub async fn create_agent_daemonset(&self, policy: &str) {
        let policy = self.n(policy);
        let name = ttdp_api::names::daemonset_name(&policy);
        let nodes: Vec<String> = AGENT_NODES.iter().map(|n| self.n(n)).collect();
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {ttdp_api::names::labels::POLICY: policy}},
                "template": {
                    "metadata": {"labels": {ttdp_api::names::labels::POLICY: policy}},
                    "spec": {
                        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{
                                "key": "kubernetes.io/hostname", "operator": "In", "values": nodes,
                            }]}],
                        }}},
                        "tolerations": [{"key": SCENARIO_LABEL, "operator": "Equal",
                                         "value": self.prefix(), "effect": "NoSchedule"}],
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{
                            "name": "agent",
                            "image": AGENT_IMAGE,
                            "command": ["/bin/sh"],
                            "args": ["-c", AGENT_SCRIPT],
                        }],
                    },
                },
            },
        }))
        .expect("daemonset");
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), self.ns());
        api.create(&PostParams::default(), &ds)
            .await
            .unwrap_or_else(|e| panic!("create daemonset {name}: {e}"));
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let crashing = self.n("node-7");
        let started = Instant::now();
        loop {
            let status = api.get(&name).await.ok().and_then(|d| d.status);
            let counted = status
                .as_ref()
                .is_some_and(|s| s.desired_number_scheduled == 2 && s.number_ready == 1);
            let backing_off = pods
                .list(
                    &ListParams::default()
                        .labels(&format!("{}={policy}", ttdp_api::names::labels::POLICY)),
                )
                .await
                .map(|l| l.items)
                .unwrap_or_default()
                .iter()
                .any(|p| {
                    let facts = kubectl_tt_driver::fleet::PodFacts::from(p);
                    facts.node == crashing && facts.status == "CrashLoopBackOff"
                });
            if counted && backing_off {
                return;
            }
            assert!(
                started.elapsed() < SETTLE,
                "daemonset {name} did not reach 1/2 ready with a crash-looping agent on \
                 {crashing} within {SETTLE:?}; status {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates a core/v1 Event in namespace `default` about policy `policy` (short name).
    pub async fn create_event(&self, policy: &str, type_: &str, reason: &str, message: &str) {
        let policy = self.n(policy);
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
                name: Some(policy.clone()),
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
            .unwrap_or_else(|e| panic!("create an event about {policy}: {e}"));
    }

    /// A kubeconfig for the ServiceAccount `<namespace>/<short>` (created here) that RBAC
    /// lets do only `rules` (none: a ClusterRole `<prefix>-<short>` and its binding otherwise,
    /// both removed with the test). Waits until the server's authorizer agrees.
    pub async fn identity(&self, short: &str, rules: serde_json::Value) -> PathBuf {
        apply_service_account(&self.scratch.client(), self.ns(), short)
            .await
            .expect("service account");
        let user = format!("system:serviceaccount:{}:{short}", self.ns());
        let granted = rules.as_array().is_some_and(|r| !r.is_empty());
        if granted {
            let role: ClusterRole = serde_json::from_value(json!({
                "metadata": {"name": self.n(short)},
                "rules": rules,
            }))
            .expect("cluster role");
            Api::<ClusterRole>::all(self.client.clone())
                .create(&PostParams::default(), &role)
                .await
                .expect("create cluster role");
            let binding: ClusterRoleBinding = serde_json::from_value(json!({
                "metadata": {"name": self.n(short)},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": self.n(short)},
                "subjects": [{"kind": "ServiceAccount", "name": short, "namespace": self.ns()}],
            }))
            .expect("cluster role binding");
            Api::<ClusterRoleBinding>::all(self.client.clone())
                .create(&PostParams::default(), &binding)
                .await
                .expect("create cluster role binding");
            // The authorizer reads RBAC from an informer: wait until it sees the binding.
            let started = Instant::now();
            while !self
                .allowed(
                    &user,
                    "list",
                    "driver.tenstorrent.com",
                    "tenstorrentdriverpolicies",
                )
                .await
            {
                assert!(
                    started.elapsed() < SETTLE,
                    "RBAC for {user} not in effect within {SETTLE:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let token = tokens::service_account_token(&self.client, self.ns(), short)
            .await
            .expect("service account token");
        tokens::write_token_kubeconfig(self.kubeconfig(), &token, self.bin.path(), short)
            .expect("token kubeconfig")
    }

    /// A kubeconfig for the real server with a token it never issued.
    pub fn stranger(&self) -> PathBuf {
        tokens::write_token_kubeconfig(
            self.kubeconfig(),
            "not-a-token-this-server-issued",
            self.bin.path(),
            "stranger",
        )
        .expect("stranger kubeconfig")
    }

    async fn allowed(&self, user: &str, verb: &str, group: &str, resource: &str) -> bool {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_owned()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    group: Some(group.to_owned()),
                    resource: Some(resource.to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .ok()
            .and_then(|r| r.status)
            .is_some_and(|s| s.allowed)
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

    /// A `kubectl` command with the plugin on PATH and KUBECONFIG naming the real cluster.
    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        self.command_with(self.kubeconfig(), args)
    }

    /// A `kubectl` command with the plugin on PATH and KUBECONFIG=`kubeconfig`.
    pub fn command_with(&self, kubeconfig: &Path, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(kubectl());
        cmd.args(args)
            .env("PATH", self.path_env())
            .env("KUBECONFIG", kubeconfig)
            .env_remove("NO_COLOR")
            .env_remove("COLUMNS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs `kubectl <args>` against the real cluster to completion (bounded by
    /// [`RUN_TIMEOUT`]).
    pub async fn kubectl(&self, args: &[&str]) -> Run {
        self.run(self.command(args)).await
    }

    /// Runs `kubectl <args>` through the fault proxy.
    pub async fn kubectl_via_proxy(&self, args: &[&str]) -> Run {
        self.run(self.command_with(self.proxy.kubeconfig(), args))
            .await
    }

    /// Runs `kubectl <args>` with KUBECONFIG=`kubeconfig`.
    pub async fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Run {
        self.run(self.command_with(kubeconfig, args)).await
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

    /// The summary blocks of this test's policies in `status` output (a `<policy>: version
    /// ...` line and its indented lines), in order.
    pub fn own_summaries(&self, out: &str) -> String {
        let mut kept = String::new();
        let mut in_own = false;
        for line in out.lines() {
            if line.starts_with("  ") {
                if in_own {
                    kept.push_str(line);
                    kept.push('\n');
                }
                continue;
            }
            in_own =
                line.starts_with(&format!("{}-", self.prefix())) && line.contains(": version ");
            if in_own {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        kept
    }

    /// The entries of a JSON array whose `name` is one of this test's names.
    pub fn own(&self, items: &serde_json::Value) -> Vec<serde_json::Value> {
        items
            .as_array()
            .expect("an array")
            .iter()
            .filter(|i| i["name"].as_str().is_some_and(|n| self.scratch.owns(n)))
            .cloned()
            .collect()
    }
}
