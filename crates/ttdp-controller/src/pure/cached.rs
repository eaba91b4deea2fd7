//! What the controller caches of watched nodes and agent pods: small types holding only the
//! fields it reads, so memory grows with the fleet by a few hundred bytes per node instead of a
//! full `Node` or `Pod` (whose Rust structs alone are kilobytes, before images, conditions and
//! managed fields). Watch events are converted ([`node_event`], [`agent_pod_event`]) before they
//! reach a reflector store; policies are decoded without their node entries
//! ([`WatchedPolicy`]); DaemonSets are few and are only trimmed ([`daemonset`]).
//!
//! Anything the reconciler, [`observe`](crate::pure::observe) or
//! [`node_actions`](crate::runtime::node_work::node_actions) reads must be kept here; the unit tests pin each field.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::Resource;
use kube::core::ObjectMeta;
use kube::runtime::watcher;
use serde::Deserialize;
use ttdp_api::agent_report::AgentReport;
use ttdp_api::driver::v1alpha1::{RolloutStatus, Summary};
use ttdp_api::names::{self, annotations, labels};
use ttdp_api::{
    TenstorrentDriverPolicy, TenstorrentDriverPolicySpec, TenstorrentDriverPolicyStatus,
};

/// Annotation keys of ttdp's own (`driver.tenstorrent.com/...`): the only annotations read.
fn is_ours(key: &str) -> bool {
    key.strip_prefix(names::GROUP)
        .is_some_and(|rest| rest.starts_with('/'))
}

fn our_annotations(all: Option<BTreeMap<String, String>>) -> Option<BTreeMap<String, String>> {
    all.map(|a| a.into_iter().filter(|(k, _)| is_ours(k)).collect())
        .filter(|a: &BTreeMap<String, String>| !a.is_empty())
}

/// A node as cached: name, resourceVersion, labels, ttdp's annotations, `spec.unschedulable`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct CachedNode {
    /// Name, resourceVersion, labels (none when no policy can select the node) and ttdp's
    /// annotations.
    pub metadata: ObjectMeta,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// The node's Ready condition when it is not True (e.g. `Ready=Unknown: NodeStatusUnknown:
    /// Kubelet stopped posting node status.`); `None` when Ready.
    #[serde(default)]
    pub not_ready: Option<String>,
    /// The watch event carrying it removes the node (it was deleted): its policies are woken
    /// whatever else changed, so a dead node an admin deletes leaves their status at once.
    #[serde(default)]
    pub deleted: bool,
}

/// The taint the node lifecycle controller puts on a node it cannot reach.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// The node's Ready condition as text when it is not True (a node without one is not Ready),
/// or the unreachable taint when the condition still says True (the lifecycle controller
/// changes the two one after the other).
fn not_ready(node: &Node) -> Option<String> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    let Some(c) = ready else {
        return Some("no Ready condition reported".to_owned());
    };
    if c.status == "True" {
        let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
        let unreachable = taints
            .into_iter()
            .flatten()
            .find(|t| t.key == UNREACHABLE_TAINT)?;
        return Some(format!(
            "tainted {UNREACHABLE_TAINT}:{}: the node lifecycle controller cannot reach it",
            unreachable.effect
        ));
    }
    let mut text = format!("Ready={}", c.status);
    for part in [&c.reason, &c.message].into_iter().flatten() {
        text.push_str(": ");
        text.push_str(part);
    }
    Some(text)
}

impl CachedNode {
    /// The node's name (borrowed; `ResourceExt::name_any` copies it).
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The node as far as cached (metadata and `spec.unschedulable`), for deciding how to
    /// release it; `None` when its labels were not kept (the deploy gates would look open).
    pub fn to_node(&self) -> Option<Node> {
        self.metadata.labels.as_ref()?;
        Some(Node {
            metadata: self.metadata.clone(),
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                unschedulable: Some(self.unschedulable),
                ..Default::default()
            }),
            status: None,
        })
    }

    /// What is kept of `node`. With `require_nfd`, a node without the NFD Tenstorrent label can
    /// match no policy, so its labels are dropped too (its annotations still say whether it
    /// holds a cordon of ours).
    pub fn of(node: Node, require_nfd: bool) -> Self {
        let not_ready = not_ready(&node);
        let meta = node.metadata;
        let selectable = !require_nfd
            || meta.labels.as_ref().is_some_and(|l| {
                l.get(labels::NFD_TENSTORRENT).map(String::as_str) == Some(labels::NFD_PRESENT)
            });
        Self {
            metadata: ObjectMeta {
                name: meta.name,
                resource_version: meta.resource_version,
                labels: if selectable { meta.labels } else { None },
                annotations: our_annotations(meta.annotations),
                ..ObjectMeta::default()
            },
            unschedulable: node.spec.and_then(|s| s.unschedulable).unwrap_or(false),
            not_ready,
            deleted: false,
        }
    }
}

impl Resource for CachedNode {
    type DynamicType = ();
    type Scope = ClusterResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Node".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "nodes".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The agent container's state, as far as failures are concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct AgentContainer {
    /// `state.waiting.reason`.
    pub waiting_reason: Option<String>,
    /// `state.waiting.message`.
    pub waiting_message: Option<String>,
    /// `restartCount`.
    pub restart_count: i32,
    /// `lastState.terminated`: exit code and message.
    pub last_exit: Option<(i32, Option<String>)>,
}

/// An agent pod as cached: identity, labels, ttdp's annotations (template hash, agent report),
/// deletion, node, image, readiness and the agent container's state.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct CachedPod {
    /// Name, namespace, uid, resourceVersion, labels, ttdp's annotations, deletionTimestamp.
    pub metadata: ObjectMeta,
    /// `spec.nodeName`, or before the pod is bound, the node the DaemonSet controller made it
    /// for (its node affinity's `metadata.name In [node]`).
    pub node_name: Option<String>,
    /// The `PodScheduled` condition's reason and message when it is False.
    #[serde(default)]
    pub unschedulable: Option<(String, String)>,
    /// The first container's image.
    pub image: Option<String>,
    /// The Ready condition is True.
    pub ready: bool,
    /// The agent container's status, once reported.
    pub agent: Option<AgentContainer>,
    /// The agent's report (its pod annotation, which is not kept in `metadata`), parsed once
    /// here rather than at every reconcile; absent when missing or unparseable.
    #[serde(skip)]
    pub report: Option<AgentReport>,
}

impl CachedPod {
    /// What is kept of `pod`.
    pub fn of(pod: Pod) -> Self {
        let meta = pod.metadata;
        let spec = pod.spec.unwrap_or_default();
        let status = pod.status.unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let agent = status
            .container_statuses
            .into_iter()
            .flatten()
            .find(|c| c.name == names::AGENT_CONTAINER)
            .map(|c| {
                let waiting = c.state.and_then(|s| s.waiting);
                AgentContainer {
                    waiting_reason: waiting.as_ref().and_then(|w| w.reason.clone()),
                    waiting_message: waiting.and_then(|w| w.message),
                    restart_count: c.restart_count,
                    last_exit: c
                        .last_state
                        .and_then(|s| s.terminated)
                        .map(|t| (t.exit_code, t.message)),
                }
            });
        let unschedulable = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .map(|c| {
                (
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default(),
                )
            });
        let node_name = spec.node_name.clone().or_else(|| daemon_pod_node(&spec));
        let mut ours = our_annotations(meta.annotations);
        let report = ours
            .as_mut()
            .and_then(|a| a.remove(annotations::AGENT_REPORT))
            .and_then(|raw| serde_json::from_str(&raw).ok());
        Self {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                resource_version: meta.resource_version,
                labels: meta.labels,
                annotations: ours.filter(|a| !a.is_empty()),
                deletion_timestamp: meta.deletion_timestamp,
                creation_timestamp: meta.creation_timestamp,
                ..ObjectMeta::default()
            },
            node_name,
            unschedulable,
            image: spec.containers.into_iter().next().and_then(|c| c.image),
            ready,
            agent,
            report,
        }
    }
}

/// The node a DaemonSet pod that is not bound yet was made for: the DaemonSet controller
/// requires `metadata.name In [node]` in every term of its node affinity.
fn daemon_pod_node(spec: &k8s_openapi::api::core::v1::PodSpec) -> Option<String> {
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|r| r.key == "metadata.name" && r.operator == "In")
        .and_then(|r| match r.values.as_deref() {
            Some([node]) => Some(node.clone()),
            _ => None,
        })
}

impl Resource for CachedPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A watch event with its object converted by `f`.
fn map_event<A, B>(event: watcher::Event<A>, f: impl Fn(A) -> B) -> watcher::Event<B> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(f(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(f(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(f(o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// A node watch event, converted to [`CachedNode`].
pub fn node_event(event: watcher::Event<Node>, require_nfd: bool) -> watcher::Event<CachedNode> {
    if let watcher::Event::Delete(n) = event {
        return watcher::Event::Delete(CachedNode {
            deleted: true,
            ..CachedNode::of(n, require_nfd)
        });
    }
    map_event(event, |n| CachedNode::of(n, require_nfd))
}

/// Whether a cached node matters to the controller: a policy may select it (with
/// `require_nfd`, only a node with the NFD label, whose labels [`CachedNode::of`] kept), or it
/// carries ttdp's annotations (a cordon of ours to release). Without `require_nfd` any node may
/// be selected.
pub fn node_matters(node: &CachedNode, require_nfd: bool) -> bool {
    !require_nfd || node.metadata.labels.is_some() || node.metadata.annotations.is_some()
}

/// A node watch event as the node store takes it: a node that does not
/// [matter](node_matters) is left out (a cluster may have thousands of plain nodes), and one that
/// stops mattering while `stored` (its NFD label was removed) is told as deleted, so that it
/// leaves its policies' status as a deleted node does.
pub fn node_store_event(
    event: watcher::Event<CachedNode>,
    require_nfd: bool,
    stored: impl Fn(&str) -> bool,
) -> Option<watcher::Event<CachedNode>> {
    match event {
        watcher::Event::Apply(n) if node_matters(&n, require_nfd) => Some(watcher::Event::Apply(n)),
        watcher::Event::Apply(n) => {
            stored(n.name()).then_some(watcher::Event::Delete(CachedNode { deleted: true, ..n }))
        }
        watcher::Event::InitApply(n) => {
            node_matters(&n, require_nfd).then_some(watcher::Event::InitApply(n))
        }
        watcher::Event::Delete(n) => stored(n.name()).then_some(watcher::Event::Delete(n)),
        other => Some(other),
    }
}

/// An agent pod watch event, converted to [`CachedPod`].
pub fn agent_pod_event(event: watcher::Event<Pod>) -> watcher::Event<CachedPod> {
    map_event(event, CachedPod::of)
}

/// A policy as watched: decoded without `status.nodes`, which would be thousands of entries
/// to decode at every status write and to hold in every cached version of the policy. The
/// controller keeps the node entries it last wrote itself
/// ([`Context::written`](crate::runtime::process::context::Context::written)) and reads them from the API only
/// when it has none. Converted to a [`TenstorrentDriverPolicy`] (with no node entries and no
/// managed fields) by [`policy_event`].
#[derive(Clone, Debug, Deserialize)]
pub struct WatchedPolicy {
    metadata: ObjectMeta,
    spec: TenstorrentDriverPolicySpec,
    #[serde(default)]
    status: Option<WatchedStatus>,
}

/// A policy's status without `nodes` (serde skips what is not named here).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchedStatus {
    #[serde(default)]
    observed_generation: Option<i64>,
    #[serde(default)]
    conditions: Vec<Condition>,
    #[serde(default)]
    summary: Option<Summary>,
    #[serde(default)]
    rollout: Option<RolloutStatus>,
}

impl Resource for WatchedPolicy {
    type DynamicType = ();
    type Scope = ClusterResourceScope;
    fn kind(dt: &()) -> Cow<'_, str> {
        TenstorrentDriverPolicy::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        TenstorrentDriverPolicy::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        TenstorrentDriverPolicy::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        TenstorrentDriverPolicy::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl WatchedPolicy {
    fn into_policy(self) -> TenstorrentDriverPolicy {
        let mut metadata = self.metadata;
        metadata.managed_fields = None;
        TenstorrentDriverPolicy {
            metadata,
            spec: self.spec,
            status: self.status.map(|s| TenstorrentDriverPolicyStatus {
                observed_generation: s.observed_generation,
                conditions: s.conditions,
                summary: s.summary,
                nodes: Vec::new(),
                rollout: s.rollout,
            }),
        }
    }
}

/// A policy watch event, converted to a [`TenstorrentDriverPolicy`] without node entries.
pub fn policy_event(
    event: watcher::Event<WatchedPolicy>,
) -> watcher::Event<TenstorrentDriverPolicy> {
    map_event(event, WatchedPolicy::into_policy)
}

/// Drops a DaemonSet's managed fields and status (the controller compares only its identity,
/// labels, owner, generation and template hash).
pub fn daemonset(ds: &mut DaemonSet) {
    ds.metadata.managed_fields = None;
    ds.status = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use serde_json::json;
    use ttdp_api::agent_report::AgentPhase;

    fn full_node(nfd: bool) -> Node {
        let mut labels = json!({"kubernetes.io/hostname": "n1", labels::KMD_VERSION: "2.0.0"});
        if nfd {
            labels[labels::NFD_TENSTORRENT] = json!(labels::NFD_PRESENT);
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": "n1", "uid": "u1", "resourceVersion": "7", "labels": labels,
                "annotations": {
                    annotations::CORDONED_BY: "ttdp/fleet",
                    annotations::DEPLOY_GATES: "g",
                    "node.alpha.kubernetes.io/ttl": "0",
                    "driver.tenstorrent.com.evil/x": "y",
                },
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "images": [{"names": ["a"], "sizeBytes": 1}]},
        }))
        .unwrap()
    }

    #[test]
    fn nodes_keep_labels_our_annotations_and_the_cordon() {
        let n = CachedNode::of(full_node(true), true);
        assert_eq!(n.metadata.name.as_deref(), Some("n1"));
        assert_eq!(n.metadata.resource_version.as_deref(), Some("7"));
        let l = n.metadata.labels.as_ref().unwrap();
        assert_eq!(
            l.get(labels::KMD_VERSION).map(String::as_str),
            Some("2.0.0")
        );
        assert_eq!(l.len(), 3);
        let a = n.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            a.keys().map(String::as_str).collect::<Vec<_>>(),
            [annotations::CORDONED_BY, annotations::DEPLOY_GATES]
        );
        assert!(n.metadata.managed_fields.is_none() && n.metadata.uid.is_none());
        assert!(n.unschedulable);
    }

    #[test]
    fn the_store_leaves_out_nodes_that_do_not_matter_and_tells_when_one_stops_mattering() {
        use watcher::Event::*;
        let plain: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
        let plain = CachedNode::of(plain, true);
        let tenstorrent = CachedNode::of(full_node(true), true);
        let ours_not_selectable = CachedNode::of(full_node(false), true);
        let kept = |e: Option<watcher::Event<CachedNode>>| match e {
            Some(Apply(n) | InitApply(n)) => Some((n.name().to_owned(), false)),
            Some(Delete(n)) => Some((n.name().to_owned(), n.deleted)),
            _ => None,
        };
        let nowhere = |_: &str| false;
        let stored = |name: &str| name == "n1";
        assert_eq!(
            kept(node_store_event(InitApply(plain.clone()), true, nowhere)),
            None
        );
        assert_eq!(
            kept(node_store_event(Apply(plain.clone()), true, nowhere)),
            None
        );
        assert_eq!(
            kept(node_store_event(Delete(plain.clone()), true, nowhere)),
            None
        );
        assert_eq!(
            kept(node_store_event(Apply(plain.clone()), true, stored)),
            Some(("n1".to_owned(), true)),
            "a stored node that lost its NFD label leaves like a deleted one"
        );
        assert_eq!(
            kept(node_store_event(Apply(tenstorrent), true, nowhere)),
            Some(("n1".to_owned(), false))
        );
        assert_eq!(
            kept(node_store_event(
                InitApply(ours_not_selectable),
                true,
                nowhere
            )),
            Some(("n1".to_owned(), false)),
            "a node holding a cordon of ours stays, NFD label or not"
        );
        assert_eq!(
            kept(node_store_event(Apply(plain), false, nowhere)),
            Some(("n1".to_owned(), false)),
            "without requireNfd any node may be selected"
        );
        assert!(matches!(
            node_store_event(InitDone, true, nowhere),
            Some(InitDone)
        ));
    }

    #[test]
    fn nodes_no_policy_can_select_keep_only_our_annotations() {
        let n = CachedNode::of(full_node(false), true);
        assert!(n.metadata.labels.is_none());
        assert_eq!(n.metadata.annotations.as_ref().unwrap().len(), 2);
        let n = CachedNode::of(full_node(false), false);
        assert_eq!(
            n.metadata.labels.as_ref().unwrap().len(),
            2,
            "every node is selectable"
        );
        let plain: Node = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        let plain = CachedNode::of(plain, true);
        assert_eq!(
            (plain.metadata.annotations, plain.unschedulable),
            (None, false)
        );
    }

    #[test]
    fn agent_pods_keep_what_observation_reads() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "ttdrv-fleet-x", "namespace": "ns", "uid": "u", "resourceVersion": "3",
                "labels": {labels::POLICY: "fleet"},
                "annotations": {annotations::TEMPLATE_HASH: "h", annotations::AGENT_REPORT: r#"{"phase":"Failed","targetVersion":"2.8.0","installMode":"container","reason":"BuildFailed"}"#, "other": "x"},
                "deletionTimestamp": "2026-11-29T18:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d"}],
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "agent", "image": "img", "env": [{"name": "A", "value": "b"}]}],
                     "volumes": [{"name": "v", "hostPath": {"path": "/sys"}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "agent", "image": "img", "imageID": "", "ready": false, "restartCount": 4,
                           "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "m"}},
                           "lastState": {"terminated": {"exitCode": 2, "message": "boom"}}}]},
        }))
        .unwrap();
        let p = CachedPod::of(pod);
        let m = &p.metadata;
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref(), m.uid.as_deref()),
            (Some("ttdrv-fleet-x"), Some("ns"), Some("u"))
        );
        assert!(m.deletion_timestamp.is_some() && m.owner_references.is_none());
        assert_eq!(m.labels.as_ref().unwrap()[labels::POLICY], "fleet");
        assert_eq!(m.annotations.as_ref().unwrap().len(), 1);
        let report = p.report.as_ref().unwrap();
        assert_eq!(
            (report.phase, report.reason.as_deref()),
            (AgentPhase::Failed, Some("BuildFailed"))
        );
        assert_eq!(p.node_name.as_deref(), Some("n1"));
        assert_eq!(p.image.as_deref(), Some("img"));
        assert!(p.ready);
        assert_eq!(
            p.agent,
            Some(AgentContainer {
                waiting_reason: Some("CrashLoopBackOff".into()),
                waiting_message: Some("m".into()),
                restart_count: 4,
                last_exit: Some((2, Some("boom".into()))),
            })
        );
        let bare = CachedPod::of(Pod::default());
        assert!(!bare.ready && bare.agent.is_none() && bare.image.is_none());
    }

    #[test]
    fn nodes_keep_their_ready_condition_only_when_not_ready() {
        assert_eq!(CachedNode::of(full_node(true), true).not_ready, None);
        let mut n = full_node(true);
        n.status =
            serde_json::from_value(json!({"conditions": [{"type": "Ready", "status": "Unknown",
            "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status."}]}))
            .unwrap();
        assert_eq!(
            CachedNode::of(n, true).not_ready.as_deref(),
            Some("Ready=Unknown: NodeStatusUnknown: Kubelet stopped posting node status.")
        );
        let plain: Node = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        assert!(CachedNode::of(plain, true).not_ready.is_some());
        let mut unreachable = full_node(true);
        unreachable.spec = serde_json::from_value(json!({"taints": [
            {"key": UNREACHABLE_TAINT, "effect": "NoExecute"}]}))
        .unwrap();
        assert_eq!(
            CachedNode::of(unreachable, true).not_ready.as_deref(),
            Some(
                "tainted node.kubernetes.io/unreachable:NoExecute: the node lifecycle controller cannot reach it"
            ),
            "Ready=True but unreachable"
        );
    }

    #[test]
    fn an_unbound_daemon_pod_is_on_its_target_node_with_the_schedulers_message() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "ttdrv-fleet-y", "namespace": "ns", "creationTimestamp": "2026-11-29T18:00:00Z"},
            "spec": {"containers": [{"name": "agent", "image": "img"}],
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}}},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/3 nodes are available: 1 Insufficient cpu."}]},
        }))
        .unwrap();
        let p = CachedPod::of(pod);
        assert_eq!(p.node_name.as_deref(), Some("n2"));
        assert_eq!(
            p.unschedulable,
            Some((
                "Unschedulable".into(),
                "0/3 nodes are available: 1 Insufficient cpu.".into()
            ))
        );
        assert!(p.metadata.creation_timestamp.is_some());
    }

    #[test]
    fn events_are_converted_and_keep_their_kind() {
        let n = full_node(true);
        assert!(matches!(
            node_event(watcher::Event::Delete(n), true),
            watcher::Event::Delete(c) if c.unschedulable && c.deleted
        ));
        assert!(matches!(
            node_event(watcher::Event::Apply(full_node(true)), true),
            watcher::Event::Apply(c) if !c.deleted
        ));
        assert!(matches!(
            agent_pod_event(watcher::Event::InitDone),
            watcher::Event::InitDone
        ));
    }

    #[test]
    fn policies_lose_managed_fields_and_node_entries_and_daemonsets_their_status() {
        let watched: WatchedPolicy = serde_json::from_value(json!({
            "apiVersion": "driver.tenstorrent.com/v1alpha1", "kind": "TenstorrentDriverPolicy",
            "metadata": {"name": "fleet", "finalizers": [names::FINALIZER],
                "managedFields": [{"manager": "m", "operation": "Update"}]},
            "spec": {"version": "2.0.0", "nodeAffinity": {}},
            "status": {"observedGeneration": 3, "nodes": [{"name": "n1", "state": "Done"}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "R", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "summary": {"matched": 1, "upToDate": 1}},
        }))
        .unwrap();
        let watcher::Event::Apply(p) = policy_event(watcher::Event::Apply(watched)) else {
            panic!("an Apply stays an Apply");
        };
        assert!(p.metadata.managed_fields.is_none());
        assert_eq!(p.metadata.finalizers.as_ref().unwrap().len(), 1);
        assert_eq!(p.spec.version, "2.0.0");
        let status = p.status.unwrap();
        assert!(status.nodes.is_empty());
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.conditions[0].type_, "Ready");
        assert_eq!(status.summary.unwrap().up_to_date, 1);
        let mut ds = DaemonSet::default();
        ds.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        ds.status = Some(Default::default());
        daemonset(&mut ds);
        assert!(ds.metadata.managed_fields.is_none() && ds.status.is_none());
    }
}
