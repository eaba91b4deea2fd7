//! The DaemonSet controller stand-in for the demo's fallback on the in-process imitation API
//! server, which has no controllers (on a real control plane kube-controller-manager runs
//! DaemonSets and this stays off). Every DaemonSet there is ttdp's agent DaemonSet
//! (`updateStrategy: OnDelete`), so it does only what that needs, from plain lists every
//! [`POLL`] (the imitation answers from memory in the same process, so each pass sees the
//! writes of the one before):
//! - one pod per eligible node, made from the template, bound (`spec.nodeName`: there is no
//!   scheduler), owned (controller owner reference) and labelled `pod-template-generation`;
//! - a pod of an older template stays until something deletes it (`OnDelete`);
//! - a deleted, terminating or finished pod is replaced; a pod on a node no longer eligible (or
//!   gone) is deleted;
//! - status: `desiredNumberScheduled`, `currentNumberScheduled`, `numberReady` and
//!   `updatedNumberScheduled` (what `kubectl tt driver describe` shows).
//!
//! Eligible: `nodeSelector` and required node affinity match. Taints are ignored: the agent
//! tolerates every `NoSchedule` and `NoExecute` taint, cordons included. Not done:
//! ControllerRevisions (`controller-revision-hash`), `RollingUpdate`, `minReadySeconds`, creation
//! back-off, `observedGeneration`.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodTemplateSpec};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use tokio::task::JoinHandle;
use tracing::{info, warn};
use ttdp_api::node_selection::affinity_matches;

use super::error::{SimError, allow_status};
use super::pod_status::{pod_is_finished, pod_is_ready};

/// How often the stand-in lists DaemonSets, nodes and pods.
pub const POLL: Duration = Duration::from_millis(150);
/// Pod label holding the DaemonSet generation the pod was made at, as the real controller sets
/// it: a pod is up to date when it matches the DaemonSet's current generation.
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";

/// The running stand-in; stopped by [`DaemonSetStandIn::shutdown`] or by dropping it.
#[derive(Debug)]
pub struct DaemonSetStandIn(JoinHandle<()>);

impl DaemonSetStandIn {
    /// Starts polling through `client` (which must reach the imitation, never a real cluster).
    pub fn start(client: Client) -> Self {
        Self(tokio::spawn(run(client)))
    }

    /// Stops the stand-in and waits until it has.
    pub async fn shutdown(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for DaemonSetStandIn {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn run(client: Client) {
    info!("daemonset stand-in started");
    loop {
        if let Err(err) = sync_all(&client).await {
            warn!(error = %err, "daemonset stand-in pass failed; retrying");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One pass over every DaemonSet; a failing one does not hold up the others.
async fn sync_all(client: &Client) -> Result<(), SimError> {
    let daemonsets = list(Api::<DaemonSet>::all(client.clone()), "daemonsets").await?;
    let nodes = list(Api::<Node>::all(client.clone()), "nodes").await?;
    for ds in daemonsets
        .iter()
        .filter(|d| d.meta().deletion_timestamp.is_none())
    {
        if let Err(err) = sync(client, ds, &nodes).await {
            warn!(daemonset = %ds.name_any(), error = %err, "daemonset sync failed; retrying");
        }
    }
    Ok(())
}

async fn list<K>(api: Api<K>, what: &str) -> Result<Vec<K>, SimError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let listed = api.list(&ListParams::default()).await;
    Ok(listed
        .map_err(|e| SimError::api(format!("list {what}"), e))?
        .items)
}

/// Brings one DaemonSet's pods and status in line with its eligible nodes.
async fn sync(client: &Client, ds: &DaemonSet, nodes: &[Node]) -> Result<(), SimError> {
    let (Some(uid), Some(spec)) = (ds.uid(), ds.spec.as_ref()) else {
        return Ok(());
    };
    let namespace = ds.namespace().unwrap_or_default();
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pods = list(pod_api.clone(), &format!("pods in {namespace}")).await?;
    let owned: Vec<Pod> = pods
        .into_iter()
        .filter(|p| controlled_by(p, &uid) && p.metadata.deletion_timestamp.is_none())
        .collect();
    let template_spec = spec.template.spec.clone().unwrap_or_default();
    let eligible: BTreeSet<String> = nodes
        .iter()
        .filter(|n| is_eligible(&template_spec, n))
        .map(ResourceExt::name_any)
        .collect();
    let plan = plan(&eligible, &owned);
    for pod in &plan.delete {
        delete_pod(&pod_api, pod).await?;
    }
    for node in &plan.create_on {
        let pod = daemon_pod(ds, &spec.template, node);
        let created = pod_api
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| SimError::api(format!("create the daemon pod on node {node}"), e))?;
        info!(daemonset = %ds.name_any(), node = %node, pod = %created.name_any(), "daemon pod created");
    }
    write_status(client, ds, status(ds, &eligible, &plan.kept)).await
}

/// What one pass does for one DaemonSet.
#[derive(Debug, Default)]
struct Plan<'a> {
    /// Eligible nodes without a pod that counts.
    create_on: Vec<String>,
    /// Finished pods, second pods on a node, and pods on nodes that are not eligible.
    delete: Vec<&'a Pod>,
    /// The pods that stay, one per eligible node that has one.
    kept: Vec<&'a Pod>,
}

/// Decides from the eligible nodes and the DaemonSet's pods that are not being deleted.
fn plan<'a>(eligible: &BTreeSet<String>, pods: &'a [Pod]) -> Plan<'a> {
    let mut plan = Plan::default();
    let mut covered: BTreeSet<&str> = BTreeSet::new();
    for pod in pods {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        match node.filter(|n| eligible.contains(*n)) {
            Some(node) if !pod_is_finished(pod) && covered.insert(node) => plan.kept.push(pod),
            _ => plan.delete.push(pod),
        }
    }
    let uncovered = eligible.iter().filter(|n| !covered.contains(n.as_str()));
    plan.create_on = uncovered.cloned().collect();
    plan
}

/// `nodeSelector` and required node affinity, with the scheduler's semantics.
fn is_eligible(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let selected = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let mut affinity = spec
        .affinity
        .iter()
        .filter_map(|a| a.node_affinity.as_ref());
    selected && affinity.all(|a| affinity_matches(a, name, &labels))
}

/// The pod `template` makes for `node`: bound there, owned by `ds`.
fn daemon_pod(ds: &DaemonSet, template: &PodTemplateSpec, node: &str) -> Pod {
    let template = template.clone();
    let meta = template.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    let generation = ds.metadata.generation.unwrap_or(1).to_string();
    labels.insert(TEMPLATE_GENERATION_LABEL.to_owned(), generation);
    let mut spec = template.spec.unwrap_or_default();
    spec.node_name = Some(node.to_owned());
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", ds.name_any())),
            namespace: ds.namespace(),
            labels: Some(labels),
            annotations: meta.annotations,
            owner_references: ds.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

async fn delete_pod(pod_api: &Api<Pod>, pod: &Pod) -> Result<(), SimError> {
    let name = pod.name_any();
    let deleted = pod_api.delete(&name, &DeleteParams::default()).await;
    info!(pod = %name, "deleting daemon pod: finished, a twin, or on an ineligible node");
    allow_status(deleted, 404, || format!("delete daemon pod {name}"))
}

/// The counts the DaemonSet's status reports, the rest of it as it is.
fn status(ds: &DaemonSet, eligible: &BTreeSet<String>, kept: &[&Pod]) -> DaemonSetStatus {
    let generation = ds.metadata.generation.unwrap_or(1).to_string();
    let updated = kept
        .iter()
        .filter(|p| p.labels().get(TEMPLATE_GENERATION_LABEL) == Some(&generation))
        .count();
    DaemonSetStatus {
        desired_number_scheduled: count(eligible.len()),
        current_number_scheduled: count(kept.len()),
        number_ready: count(kept.iter().filter(|p| pod_is_ready(p)).count()),
        updated_number_scheduled: Some(count(updated)),
        ..ds.status.clone().unwrap_or_default()
    }
}

/// Writes `wanted` unless the DaemonSet already shows it (an unchanged status is not rewritten:
/// every write wakes the controller's DaemonSet watch).
async fn write_status(
    client: &Client,
    ds: &DaemonSet,
    wanted: DaemonSetStatus,
) -> Result<(), SimError> {
    if ds.status.as_ref() == Some(&wanted) {
        return Ok(());
    }
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), &ds.namespace().unwrap_or_default());
    let patch = Patch::Merge(serde_json::json!({ "status": wanted }));
    let name = ds.name_any();
    let written = api
        .patch_status(&name, &PatchParams::default(), &patch)
        .await;
    allow_status(written, 404, || format!("write daemonset {name} status"))
}

fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn agent_ds(generation: i64) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "ttdrv-default", "namespace": "ttdp", "uid": "uid",
                "generation": generation},
            "spec": {"selector": {}, "template": {
                "metadata": {"labels": {"app": "agent"}, "annotations": {"hash": "h1"}},
            }},
        }))
        .unwrap()
    }

    fn pod_on(name: &str, node: &str, generation: i64, phase: &str, ready: &str) -> Pod {
        let ds = agent_ds(generation);
        let mut pod = daemon_pod(&ds, &ds.spec.clone().unwrap().template, node);
        pod.metadata.name = Some(name.to_owned());
        let status = json!({"phase": phase, "conditions": [{"type": "Ready", "status": ready}]});
        pod.status = serde_json::from_value(status).unwrap();
        pod
    }

    #[test]
    fn each_eligible_node_gets_one_pod_and_old_templates_stay() {
        let eligible = BTreeSet::from(["a".to_owned(), "b".to_owned(), "c".to_owned()]);
        let pods = [
            pod_on("old-a", "a", 1, "Running", "True"),
            pod_on("twin-a", "a", 2, "Running", "True"),
            pod_on("new-b", "b", 2, "Running", "False"),
            pod_on("failed-c", "c", 2, "Failed", "False"),
            pod_on("off-d", "d", 2, "Running", "True"),
        ];
        let plan = plan(&eligible, &pods);
        let names = |pods: &[&Pod]| pods.iter().map(|p| p.name_any()).collect::<Vec<_>>();
        // OnDelete: old-a stays; failed-c's node gets a new pod.
        assert_eq!(names(&plan.kept), ["old-a", "new-b"]);
        assert_eq!(names(&plan.delete), ["twin-a", "failed-c", "off-d"]);
        assert_eq!(plan.create_on, ["c"]);
        let status = status(&agent_ds(2), &eligible, &plan.kept);
        assert_eq!(status.desired_number_scheduled, 3);
        assert_eq!(status.current_number_scheduled, 2);
        assert_eq!(status.number_ready, 1);
        assert_eq!(status.updated_number_scheduled, Some(1));
    }

    #[test]
    fn eligibility_is_node_selector_and_required_affinity_not_taints() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"tt": "yes"}},
            "spec": {"unschedulable": true, "taints": [{"key": "gpu", "effect": "NoExecute"}]},
        }))
        .unwrap();
        let eligible = |spec| is_eligible(&serde_json::from_value(spec).unwrap(), &node);
        let term = json!({"matchExpressions": [{"key": "tt", "operator": "DoesNotExist"}]});
        let required = json!({"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [term]}});
        let selecting = |value: &str| json!({"containers": [], "nodeSelector": {"tt": value}});
        assert!(eligible(json!({"containers": []})));
        assert!(eligible(selecting("yes")));
        assert!(!eligible(selecting("no")));
        let excluded = json!({"containers": [], "affinity": {"nodeAffinity": required}});
        assert!(!eligible(excluded));
    }

    #[test]
    fn the_daemon_pod_is_the_template_bound_owned_and_labelled() {
        let pod = pod_on("p", "n1", 3, "Pending", "False");
        let expected = json!({
            "name": "p", "generateName": "ttdrv-default-", "namespace": "ttdp",
            "labels": {"app": "agent", TEMPLATE_GENERATION_LABEL: "3"},
            "annotations": {"hash": "h1"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                "name": "ttdrv-default", "uid": "uid", "controller": true}],
        });
        assert_eq!(serde_json::to_value(&pod.metadata).unwrap(), expected);
        assert_eq!(pod.spec.and_then(|s| s.node_name).as_deref(), Some("n1"));
    }
}
