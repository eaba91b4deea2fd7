//! The Helm chart's RBAC covers every request the controller and the agent make.
//!
//! One scenario exercises every code path that talks to the API server (fresh install on two
//! nodes, an upgrade with a device-holding workload: cordon, drain by eviction, agent pod
//! deletion, uncordon; then deleting the policy so the finalizer cleanup runs). The controller
//! and the agents reach the test API server through small proxies that stamp their requests with
//! a User-Agent of their own, so the server's request recorder tells them apart from the
//! simulation's own requests (nodes, workloads, kubelet status). Every recorded request of each
//! identity is then checked against the Roles/ClusterRoles `helm template` binds to its
//! ServiceAccount.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use harness::{IMAGE_REPOSITORY, SPEED, STEP, agent_binary, condition, tt_node};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::labels;
use ttdp_controller::{RunOptions, Settings};
use ttdp_testkit::apiserver::RecordedRequest;
use ttdp_testkit::sim::{DeviceUse, SimCluster, SimClusterOptions, Workload, WorkloadOwner};

const CONTROLLER_UA: &str = "rbac-test-controller";
const AGENT_UA: &str = "rbac-test-agent";
const RELEASE_NAMESPACE: &str = "tt-k8s-driver-manager-system";
const CHART: &str = "deploy/helm/tt-k8s-driver-manager";

/// A proxy on 127.0.0.1 that forwards HTTP/1.1 to the API server (known once it started),
/// replacing each request's User-Agent with `user_agent`.
async fn tagging_proxy(upstream: Arc<OnceLock<SocketAddr>>, user_agent: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = *upstream
                .get()
                .expect("proxy used before the server started");
            tokio::spawn(forward(client, upstream, user_agent));
        }
    });
    url
}

async fn forward(client: TcpStream, upstream: SocketAddr, user_agent: &str) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
    });
    let mut reader = BufReader::new(client_read);
    loop {
        let mut request = Vec::new();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("user-agent:") {
                continue;
            }
            if let Some(value) = lower.strip_prefix("content-length:") {
                length = value.trim().parse().unwrap_or(0);
            }
            request.extend_from_slice(line.as_bytes());
        }
        request.extend_from_slice(format!("User-Agent: {user_agent}\r\n\r\n").as_bytes());
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        request.extend_from_slice(&body);
        if server_write.write_all(&request).await.is_err() {
            return;
        }
    }
}

fn write_kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let path = dir.join("agent-kubeconfig");
    let config = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "agent",
        "clusters": [{"name": "agent", "cluster": {"server": server}}],
        "users": [{"name": "agent", "user": {}}],
        "contexts": [{"name": "agent", "context": {"cluster": "agent", "user": "agent"}}],
    });
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

fn fake_tt_smi(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("tt-smi");
    std::fs::write(&path, "#!/bin/sh\necho tt-smi 3.0.0 simulated\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn scaled(seconds: f64) -> String {
    format!("{}ms", (seconds * SPEED * 1000.0).round() as u64)
}

/// Waits until `check` holds for the policy (or it is gone, with `None`).
async fn wait_policy(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(Option<&TenstorrentDriverPolicy>) -> bool,
) {
    let api: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    let start = Instant::now();
    while start.elapsed() < STEP * 2 {
        if let Ok(p) = api.get_opt(name).await
            && check(p.as_ref())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what} on policy {name}");
}

fn ready(p: Option<&TenstorrentDriverPolicy>) -> bool {
    p.is_some_and(|p| {
        condition(p, "Ready").is_some_and(|c| c.0 == "True")
            && p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation
    })
}

/// One RBAC rule, flattened.
#[derive(Debug)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    names: Vec<String>,
    /// `None`: cluster-wide (ClusterRoleBinding); otherwise only in this namespace.
    namespace: Option<String>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl Rule {
    fn allows(&self, r: &RecordedRequest, namespace: &str) -> bool {
        let resource = if r.subresource.is_empty() {
            r.resource.clone()
        } else {
            format!("{}/{}", r.resource, r.subresource)
        };
        let any = |list: &[String], item: &str| list.iter().any(|x| x == "*" || x == item);
        self.namespace.as_deref().is_none_or(|ns| ns == namespace)
            && any(&self.groups, &r.group)
            && any(&self.resources, &resource)
            && any(&self.verbs, &r.verb)
            && (self.names.is_empty() || self.names.contains(&r.name))
    }
}

/// `helm template` of the chart as JSON documents.
fn render_chart() -> Vec<Value> {
    let home = std::env::var("HOME").unwrap_or_default();
    let helm = Path::new(&home).join(".local/ttdp-tools/bin/helm");
    assert!(
        helm.is_file(),
        "{} is missing: install the pinned kube tools with .ci/kube-tools",
        helm.display()
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(&helm)
        .args([
            "template",
            "tt-k8s-driver-manager",
            CHART,
            "-n",
            RELEASE_NAMESPACE,
        ])
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// The rules the chart grants the ServiceAccount `account` of the release namespace.
fn rules_for(docs: &[Value], account: &str) -> Vec<Rule> {
    let kind = |d: &Value| d["kind"].as_str().unwrap_or_default().to_owned();
    let role_rules = |role_kind: &str, name: &str, role_ns: Option<&str>| -> Vec<Value> {
        docs.iter()
            .filter(|d| kind(d) == role_kind && d["metadata"]["name"] == name)
            .filter(|d| {
                role_kind == "ClusterRole" || d["metadata"]["namespace"].as_str() == role_ns
            })
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let mut rules = Vec::new();
    for binding in docs
        .iter()
        .filter(|d| matches!(kind(d).as_str(), "ClusterRoleBinding" | "RoleBinding"))
    {
        let bound = binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == account
                    && s["namespace"] == RELEASE_NAMESPACE
            });
        if !bound {
            continue;
        }
        let namespace = (kind(binding) == "RoleBinding").then(|| {
            binding["metadata"]["namespace"]
                .as_str()
                .unwrap_or(RELEASE_NAMESPACE)
                .to_owned()
        });
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default();
        for rule in role_rules(role_kind, role_name, namespace.as_deref()) {
            rules.push(Rule {
                groups: strings(&rule["apiGroups"]),
                resources: strings(&rule["resources"]),
                verbs: strings(&rule["verbs"]),
                names: strings(&rule["resourceNames"]),
                namespace: namespace.clone(),
            });
        }
    }
    rules
}

/// Non-resource paths every authenticated identity may read (Kubernetes' default
/// `system:discovery` and `system:public-info-viewer` ClusterRoles).
fn is_discovery(r: &RecordedRequest) -> bool {
    r.verb.is_empty()
        && r.method == "GET"
        && [
            "/api",
            "/apis",
            "/version",
            "/openapi/",
            "/healthz",
            "/livez",
            "/readyz",
        ]
        .iter()
        .any(|p| r.path.starts_with(p))
}

/// The requests of `requests` that `rules` do not allow, one line each.
fn denied(requests: &[RecordedRequest], rules: &[Rule], operator_ns: &str) -> Vec<String> {
    let mut out: Vec<String> = requests
        .iter()
        .filter(|r| !is_discovery(r))
        .filter(|r| {
            let ns = if r.namespace == operator_ns {
                RELEASE_NAMESPACE
            } else {
                r.namespace.as_str()
            };
            !rules.iter().any(|rule| rule.allows(r, ns))
        })
        .map(|r| {
            let resource = if r.subresource.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            format!(
                "verb={:?} group={:?} resource={resource:?} namespace={:?} ({} {} -> {})",
                r.verb, r.group, r.namespace, r.method, r.path, r.status
            )
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_allows_every_request_of_the_controller_and_the_agent() {
    let docs = render_chart();
    let accounts: Vec<String> = docs
        .iter()
        .filter(|d| d["kind"] == "ServiceAccount")
        .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the chart renders the controller Deployment");
    let controller_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("the controller Deployment names its ServiceAccount")
        .to_owned();
    let agent_accounts: Vec<&String> = accounts
        .iter()
        .filter(|a| **a != controller_account)
        .collect();
    assert_eq!(
        agent_accounts.len(),
        1,
        "expected one agent ServiceAccount besides the controller's {controller_account}: {accounts:?}"
    );
    let agent_account = agent_accounts[0].clone();

    let tmp = tempfile::tempdir().unwrap();
    let upstream = Arc::new(OnceLock::new());
    let controller_url = tagging_proxy(upstream.clone(), CONTROLLER_UA).await;
    let agent_url = tagging_proxy(upstream.clone(), AGENT_UA).await;
    let agent_kubeconfig = write_kubeconfig(tmp.path(), &agent_url);

    let prefix = format!("rbac{}", std::process::id() % 100_000);
    let mut options = SimClusterOptions::new()
        .in_process()
        .name_prefix(&prefix)
        .image(IMAGE_REPOSITORY, agent_binary())
        .time_scale(SPEED)
        .kmd_versions(&["2.7.0", "2.8.0"])
        .env(
            "TTDP_TT_SMI_PATH",
            &fake_tt_smi(tmp.path()).display().to_string(),
        )
        .env("TTDP_PROBE_PERIOD", &scaled(10.0))
        .env("TTDP_RETRY_INITIAL", &scaled(5.0))
        .env("TTDP_RETRY_MAX", &scaled(20.0))
        .env("TTDP_UNLOAD_WAIT", &scaled(10.0))
        .env("TTDP_BUILD_JOBS", "1")
        .env("KUBECONFIG", &agent_kubeconfig.display().to_string());
    for _ in 0..2 {
        options = options.node(tt_node(&prefix));
    }
    let cluster = SimCluster::start(options).await.expect("simulated cluster");
    let server = cluster.api_server().expect("the test API server");
    upstream.set(server.address()).unwrap();
    let client = cluster.client();

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &ttdp_api::crd())
        .await
        .unwrap();
    let policies: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    for _ in 0..100 {
        if policies.list(&ListParams::default().limit(1)).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let operator_ns = format!("{prefix}-system");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": operator_ns}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let sa: ServiceAccount = serde_json::from_value(
        json!({"metadata": {"name": agent_account, "namespace": operator_ns}}),
    )
    .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), &operator_ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();

    let mut controller_config = kube::Config::new(controller_url.parse().unwrap());
    controller_config.default_retry = false;
    let controller_client = Client::try_from(controller_config).unwrap();
    let settings = Settings {
        namespace: operator_ns.clone(),
        default_image: format!("{IMAGE_REPOSITORY}:test"),
        tt_smi_version: "3.0.0".into(),
        deploy_gates: vec!["tenstorrent.com/deploy.tt-telemetry".into()],
        require_nfd: true,
        kmd_repository: Some(cluster.kmd_repo().url()),
        agent_service_account: agent_account.clone(),
        retry_base: Duration::from_secs(2),
        retry_max: Duration::from_secs(10),
    };
    let token = CancellationToken::new();
    let controller = tokio::spawn(ttdp_controller::run(
        controller_client,
        settings,
        RunOptions::default(),
        token.clone(),
    ));

    // Fresh install on both nodes.
    let name = format!("{prefix}-fleet");
    let policy: TenstorrentDriverPolicy = serde_json::from_value(json!({
        "apiVersion": "driver.tenstorrent.com/v1alpha1",
        "kind": "TenstorrentDriverPolicy",
        "metadata": {"name": name},
        "spec": {"version": "2.7.0", "nodeAffinity": {"matchLabels": {harness::RUN_LABEL: prefix}}},
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    wait_policy(&client, &name, "Ready on 2.7.0", ready).await;

    // Upgrade with a device-holding workload: cordon, drain (eviction), agent pod deletion,
    // uncordon.
    let nodes = cluster.tenstorrent_node_names();
    cluster
        .add_workload(
            &Workload::new("inference-0", &nodes[0])
                .device(DeviceUse::HostPath)
                .owner(WorkloadOwner::ReplicaSet)
                .label("app", "inference"),
        )
        .await
        .unwrap();
    policies
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"version": "2.8.0"}})),
        )
        .await
        .unwrap();
    wait_policy(&client, &name, "Ready on 2.8.0", ready).await;
    for node in &nodes {
        let n = cluster.get_node(node).await.unwrap();
        assert_eq!(
            n.labels().get(labels::KMD_VERSION).map(String::as_str),
            Some("2.8.0"),
            "{node} upgraded"
        );
    }

    // Deleting the policy runs the finalizer cleanup.
    policies
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    wait_policy(&client, &name, "deletion", |p| p.is_none()).await;

    token.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), controller).await;
    let recorder = server.recorder().clone();
    let _ = cluster.shutdown().await;

    let controller_requests = recorder.by_user_agent(CONTROLLER_UA);
    let agent_requests = recorder.by_user_agent(AGENT_UA);
    let did = |requests: &[RecordedRequest], verb: &str, resource: &str, sub: &str| {
        requests
            .iter()
            .any(|r| r.verb == verb && r.resource == resource && r.subresource == sub)
    };
    // The scenario did exercise what it is meant to check.
    for (verb, resource, sub) in [
        ("create", "pods", "eviction"),
        ("delete", "pods", ""),
        ("patch", "nodes", ""),
        ("patch", "daemonsets", ""),
        ("watch", "tenstorrentdriverpolicies", ""),
    ] {
        assert!(
            did(&controller_requests, verb, resource, sub),
            "the controller never made a {verb} {resource}/{sub} request: the scenario missed it"
        );
    }
    assert!(
        did(&agent_requests, "patch", "nodes", ""),
        "no request carried the agent's User-Agent: it did not use the proxy's kubeconfig"
    );

    for (who, requests) in [
        ("controller", &controller_requests),
        ("agent", &agent_requests),
    ] {
        let mut kinds: Vec<String> = requests
            .iter()
            .map(|r| {
                format!(
                    "{} {}/{}/{} ns={}",
                    r.verb, r.group, r.resource, r.subresource, r.namespace
                )
            })
            .collect();
        kinds.sort();
        kinds.dedup();
        eprintln!(
            "{who} requests ({}):\n  {}",
            requests.len(),
            kinds.join("\n  ")
        );
    }
    let mut failures = Vec::new();
    for (who, account, requests) in [
        ("controller", &controller_account, &controller_requests),
        ("agent", &agent_account, &agent_requests),
    ] {
        let rules = rules_for(&docs, account);
        let denied = denied(requests, &rules, &operator_ns);
        if !denied.is_empty() {
            failures.push(format!(
                "the chart does not allow these {who} requests (ServiceAccount {account}):\n  {}",
                denied.join("\n  ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The check can fail: without the eviction grant the controller's drain is denied.
    let mut without_eviction = rules_for(&docs, &controller_account);
    without_eviction.retain(|r| !r.resources.iter().any(|x| x == "pods/eviction"));
    let denied = denied(&controller_requests, &without_eviction, &operator_ns);
    assert!(
        denied.iter().any(|d| d.contains("pods/eviction")),
        "{denied:?}"
    );
}
