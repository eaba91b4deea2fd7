//! The objects of the drain benchmark on a real control plane: a node with `n` pods of mixed
//! owners and a spare node for the replacements, both served by a simulated kubelet. One
//! application, a Deployment of six pods on the node, has a PodDisruptionBudget whose status the
//! real disruption controller computes; the other pods (a ReplicaSet, a ReplicaSet with emptyDir,
//! a DaemonSet, bare pods) have none, so their number grows with `n` and the budget's does not.
//! The applications' pods turn Ready 2 s after they start (a readiness probe's initial delay),
//! replacements included: the real controllers make them and the real scheduler puts them on the
//! spare node. The budget allows half of the Deployment to be unavailable: a drain is blocked
//! once, until the first half's replacements are Ready.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use ttdp_testkit::sim::{
    ImageMap, KubeletConfig, SCENARIO_LABEL, SimKubelet, SimNodeSpec, TimeScale, pod_is_ready,
};

/// The image the kubelet runs as `/bin/sleep`: a process with a readiness probe.
const APP_IMAGE: &str = "ttdp.bench/app";
/// Label saying what owns a pod (`web`, `scratch`, `logs`, `bare`).
pub const ROLE_LABEL: &str = "bench.ttdp.tenstorrent.com/role";
/// Label of the pair of nodes of one drain.
const GROUP_LABEL: &str = "bench.ttdp.tenstorrent.com/group";
/// How long setting up a node's pods may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(300);

/// The role of the `i`-th of `n` pods: 60 % applications, of which the first six are `web` (the
/// Deployment under the budget) and the rest `api` (a ReplicaSet), 20 % `scratch` (a ReplicaSet
/// with emptyDir), 10 % `logs` (DaemonSet), 10 % `bare` (no controller).
fn role_of(i: usize) -> &'static str {
    match i % 10 {
        0..=5 if i < 10 => "web",
        0..=5 => "api",
        6 | 7 => "scratch",
        8 => "logs",
        _ => "bare",
    }
}

/// One drained node and its spare, with their workloads and budget.
pub struct DrainNode {
    /// The node to drain.
    pub node: String,
    /// The budget's name (in `namespace`).
    pub budget: String,
    /// The namespace of the workloads.
    pub namespace: String,
    kubelet: SimKubelet,
}

/// Creates `body` in `namespace`: the resource follows from its `apiVersion` and `kind`.
async fn create(client: &Client, namespace: &str, body: Value) -> Result<()> {
    let object: DynamicObject = serde_json::from_value(body)?;
    let types = object.types.clone().unwrap_or_default();
    let resource = ApiResource::from_gvk(&GroupVersionKind::try_from(&types)?);
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("cannot create a drain benchmark {}", types.kind))?;
    Ok(())
}

fn node_spec(name: &str, group: &str, prefix: &str) -> SimNodeSpec {
    let mut spec = SimNodeSpec::new(name);
    spec.labels
        .insert(SCENARIO_LABEL.to_owned(), prefix.to_owned());
    spec.labels.insert(GROUP_LABEL.to_owned(), group.to_owned());
    spec.taints.push(Taint {
        key: SCENARIO_LABEL.to_owned(),
        value: Some(prefix.to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    });
    spec.extra_capacity
        .insert("pods".to_owned(), Quantity("2000".to_owned()));
    spec
}

async fn set_unschedulable(client: &Client, node: &str, unschedulable: bool) -> Result<()> {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "unschedulable": unschedulable } })),
        )
        .await
        .with_context(|| format!("cannot (un)cordon {node}"))?;
    Ok(())
}

impl DrainNode {
    /// Registers `<prefix>-<group>` and its spare `<prefix>-<group>-spare`, fills the first with
    /// `pods` Running and Ready pods, then opens the spare for replacements.
    pub async fn populate(client: &Client, prefix: &str, group: &str, pods: usize) -> Result<Self> {
        let node = format!("{prefix}-{group}");
        let spare = format!("{node}-spare");
        let namespace = prefix.to_owned();
        let config = KubeletConfig {
            image_map: ImageMap::new().with(APP_IMAGE, "/bin/sleep"),
            time_scale: TimeScale::REAL,
            ..KubeletConfig::default()
        };
        let kubelet = SimKubelet::start(
            client.clone(),
            config,
            vec![
                node_spec(&node, group, prefix),
                node_spec(&spare, group, prefix),
            ],
        )
        .await
        .context("cannot start the simulated kubelet")?;
        set_unschedulable(client, &spare, true).await?;

        let count = |role: &str| (0..pods).filter(|i| role_of(*i) == role).count();
        let toleration =
            json!([{ "key": SCENARIO_LABEL, "operator": "Exists", "effect": "NoSchedule" }]);
        let app = |role: &str, volumes: Value| {
            json!({
                "metadata": { "labels": { ROLE_LABEL: role } },
                "spec": {
                    "nodeSelector": { GROUP_LABEL: group }, "tolerations": toleration,
                    "terminationGracePeriodSeconds": 1, "volumes": volumes,
                    "containers": [{ "name": "main", "image": APP_IMAGE, "args": ["3600"],
                        "readinessProbe": { "httpGet": { "port": 80 }, "initialDelaySeconds": 2, "periodSeconds": 1 } }],
                },
            })
        };
        for (role, volumes, kind) in [
            ("web", json!([]), "Deployment"),
            ("api", json!([]), "ReplicaSet"),
            (
                "scratch",
                json!([{ "name": "scratch", "emptyDir": {} }]),
                "ReplicaSet",
            ),
        ] {
            let name = format!("{node}-{role}");
            let mut template = app(role, volumes);
            template["metadata"]["labels"]["app"] = json!(name);
            if role == "web" {
                template["metadata"]["labels"]["budget"] = json!(node);
            }
            create(client, &namespace, json!({
                "apiVersion": "apps/v1", "kind": kind, "metadata": { "name": name, "namespace": namespace },
                "spec": { "replicas": count(role), "selector": { "matchLabels": { "app": name } }, "template": template },
            })).await?;
        }
        let logs = format!("{node}-logs");
        create(client, &namespace, json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": { "name": logs, "namespace": namespace },
            "spec": { "selector": { "matchLabels": { "app": logs } },
                "template": { "metadata": { "labels": { "app": logs, ROLE_LABEL: "logs" } },
                    "spec": { "nodeSelector": { "kubernetes.io/hostname": node }, "tolerations": toleration,
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{ "name": "main", "image": "busybox" }] } } },
        })).await?;
        let budget = format!("{node}-budget");
        create(client, &namespace, json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": { "name": budget, "namespace": namespace },
            "spec": { "maxUnavailable": "50%", "selector": { "matchLabels": { "budget": node } } },
        })).await?;
        for i in 0..count("bare") {
            create(client, &namespace, json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": format!("{node}-bare-{i:04}"), "namespace": namespace, "labels": { ROLE_LABEL: "bare" } },
                "spec": { "nodeName": node, "tolerations": toleration, "terminationGracePeriodSeconds": 1,
                    "containers": [{ "name": "main", "image": "busybox" }] },
            })).await?;
        }
        // The DaemonSet makes one pod per node: the `logs` share of the node's pods is one pod.
        let expected = pods - count("logs") + 1;
        let started = Instant::now();
        loop {
            let on_node = pods_on(client, &node).await?;
            let ready = on_node.iter().filter(|p| pod_is_ready(p)).count();
            if on_node.len() == expected && ready == expected {
                break;
            }
            if started.elapsed() > SETUP_TIMEOUT {
                bail!("only {ready} of {expected} pods Ready on {node} after {SETUP_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The budget's status must count them all before the drain starts.
        let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &namespace);
        loop {
            let pdb = budgets.get(&budget).await?;
            let status = pdb.status.unwrap_or_default();
            let in_budget = count("web");
            if status.observed_generation == pdb.metadata.generation
                && usize::try_from(status.current_healthy).unwrap_or(0) == in_budget
            {
                break;
            }
            if started.elapsed() > SETUP_TIMEOUT {
                bail!("the disruption controller never counted the pods of {budget}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        set_unschedulable(client, &spare, false).await?;
        Ok(Self {
            node,
            budget,
            namespace,
            kubelet,
        })
    }

    /// Stops the kubelet (the scratch space deletes the nodes and namespace).
    pub async fn shutdown(self) {
        let _ = self.kubelet.shutdown_and_unregister().await;
    }
}

/// Pods on `node` (any phase, terminating included).
async fn pods_on(client: &Client, node: &str) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .with_context(|| format!("cannot list the pods on {node}"))?;
    Ok(list.items)
}

/// How many pods of each role are on `node`.
pub async fn roles_on(client: &Client, node: &str) -> Result<BTreeMap<String, usize>> {
    let mut roles = BTreeMap::new();
    for pod in pods_on(client, node).await? {
        let role = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ROLE_LABEL))
            .cloned()
            .unwrap_or_default();
        *roles.entry(role).or_insert(0) += 1;
    }
    Ok(roles)
}

/// Creates `<prefix>-<group>` with one Ready pod that budget `minAvailable: 1` protects: every
/// eviction is refused (429).
pub async fn populate_blocked(client: &Client, prefix: &str, group: &str) -> Result<DrainNode> {
    let node = DrainNode::populate(client, prefix, group, 0).await?;
    let app = format!("{}-db", node.node);
    let budget = format!("{app}-budget");
    create(client, &node.namespace, json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": { "name": budget, "namespace": node.namespace },
        "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": app } } },
    })).await?;
    create(client, &node.namespace, json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": { "name": app, "namespace": node.namespace },
        "spec": { "replicas": 1, "selector": { "matchLabels": { "app": app } },
            "template": { "metadata": { "labels": { "app": app, ROLE_LABEL: "db" } },
                "spec": { "nodeSelector": { "kubernetes.io/hostname": node.node },
                    "tolerations": [{ "key": SCENARIO_LABEL, "operator": "Exists", "effect": "NoSchedule" }],
                    "containers": [{ "name": "main", "image": "busybox" }] } } },
    })).await?;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &node.namespace);
    let started = Instant::now();
    loop {
        let pdb = budgets.get(&budget).await?;
        if pdb.status.is_some_and(|s| s.current_healthy == 1) {
            return Ok(node);
        }
        if started.elapsed() > SETUP_TIMEOUT {
            bail!("the blocked pod of {} never turned Ready", node.node);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
