//! Deriving each node's [`NodeObservation`] from cluster state: the node's labels and
//! annotations, its agent pod (template hash, readiness, container state, the agent's
//! [`AgentReport`]), the recorded status entry, the drain tracker and the retry back-off.
//!
//! Pure functions over objects already read (from the reflector stores), so the rules are unit
//! tested without a cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use ttdp_api::agent_report::{AgentPhase, AgentReport};
use ttdp_api::driver::v1alpha1::{NextKernels, NodeStartLoad};
use ttdp_api::names::{self, annotations, install_mode, labels};
use ttdp_api::{NodeState, NodeStatus};

use crate::pure::agent_blocker::{Blocker, pod_blocker};
use crate::pure::cached::CachedPod;
use crate::pure::transition::{
    Action, AgentCondition, AgentPod, DrainProgress, NodeObservation, RetryGate, RolloutRules,
    StartGate, UpgradeGrant,
};
use ttdp_kmd_types::KmdVersion;
use ttdp_kmd_types::parameters::{parameter_pairs, parameters_at_target};

/// Container waiting reasons that mean the image cannot be pulled.
const IMAGE_PULL_REASONS: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

fn get<'a>(map: &'a Option<BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    map.as_ref()?.get(key).map(String::as_str)
}

/// The node's `kmd-version` label.
pub fn loaded_version(meta: &ObjectMeta) -> Option<String> {
    get(&meta.labels, labels::KMD_VERSION).map(str::to_owned)
}

/// The node's `install-mode` label.
pub fn install_mode_label(meta: &ObjectMeta) -> Option<String> {
    get(&meta.labels, labels::INSTALL_MODE).map(str::to_owned)
}

/// Whether a node holds something of `policy`'s: its cordon or upgrade grant, or deploy gates
/// it closed (gates closed without a recorded owner count when the node was the policy's,
/// `ours_before`).
pub fn holds_ours(meta: &ObjectMeta, policy: &str, ours_before: impl FnOnce() -> bool) -> bool {
    cordoned_by(meta, policy)
        || granted_by(meta, policy)
        || match gates_owner(meta) {
            GatesOwner::Policy(owner) => owner == policy,
            GatesOwner::Unrecorded => ours_before(),
            GatesOwner::NoGates => false,
        }
}

/// How many of `unmatched` (nodes that left `policy`'s selection) still hold something of
/// `policy`'s (`was_ours`: the node had an entry in its status): each keeps a slot until its
/// release lands.
pub fn held_outside(
    unmatched: &[std::sync::Arc<crate::pure::cached::CachedNode>],
    policy: &str,
    was_ours: impl Fn(&str) -> bool,
) -> usize {
    unmatched
        .iter()
        .filter(|n| holds_ours(&n.metadata, policy, || was_ours(n.name())))
        .count()
}

/// Whether the node carries `policy`'s cordon annotation.
pub fn cordoned_by(meta: &ObjectMeta, policy: &str) -> bool {
    get(&meta.annotations, annotations::CORDONED_BY)
        .and_then(|owner| owner.strip_prefix(names::CORDON_OWNER_PREFIX))
        == Some(policy)
}

/// `policy`'s upgrade grant on the node, relative to the `target` version.
pub fn upgrade_grant(meta: &ObjectMeta, policy: &str, target: &KmdVersion) -> UpgradeGrant {
    match get(&meta.annotations, annotations::UPGRADE_GRANT).and_then(names::parse_upgrade_grant) {
        Some((p, v)) if p == policy && v == target.as_str() => UpgradeGrant::Target,
        Some((p, _)) if p == policy => UpgradeGrant::OtherVersion,
        _ => UpgradeGrant::Absent,
    }
}

/// Whether the node carries an upgrade grant of `policy` (for any version).
pub fn granted_by(meta: &ObjectMeta, policy: &str) -> bool {
    get(&meta.annotations, annotations::UPGRADE_GRANT)
        .and_then(names::parse_upgrade_grant)
        .is_some_and(|(p, _)| p == policy)
}

/// Who closed a node's deploy gates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatesOwner<'a> {
    /// No gate is closed.
    NoGates,
    /// This policy closed them.
    Policy(&'a str),
    /// They were closed by a controller that did not record its policy.
    Unrecorded,
}

/// Who closed the node's deploy gates (from its annotation).
pub fn gates_owner(meta: &ObjectMeta) -> GatesOwner<'_> {
    let Some(value) = get(&meta.annotations, annotations::DEPLOY_GATES) else {
        return GatesOwner::NoGates;
    };
    let (owner, mut gates) = names::parse_deploy_gates(value);
    match (owner, gates.next()) {
        (_, None) => GatesOwner::NoGates,
        (Some(owner), Some(_)) => GatesOwner::Policy(owner),
        (None, Some(_)) => GatesOwner::Unrecorded,
    }
}

/// The deploy gates `policy` may reopen on this node: those it closed, or those closed
/// without a recorded owner; none that another policy closed.
pub fn closed_gates(meta: &ObjectMeta, policy: &str) -> Vec<String> {
    let Some(value) = get(&meta.annotations, annotations::DEPLOY_GATES) else {
        return Vec::new();
    };
    match names::parse_deploy_gates(value) {
        (Some(owner), _) if owner != policy => Vec::new(),
        (_, gates) => gates.map(str::to_owned).collect(),
    }
}

/// Whether `policy` closed deploy gates on this node (or a controller that did not record its
/// policy did).
pub fn gates_closed(meta: &ObjectMeta, policy: &str) -> bool {
    !closed_gates(meta, policy).is_empty()
}

/// Whether someone asked for a retry of this node.
pub fn retry_requested(meta: &ObjectMeta) -> bool {
    get(&meta.annotations, annotations::RETRY).is_some()
}

/// Whether the agent on `pod` reports the module loaded with other parameters than `wanted`
/// (the kernel's string): what sysfs shows lacks a wanted value, or ttdp had set a parameter
/// that `wanted` no longer has. False without a report: nothing is known to differ.
pub fn parameters_differ(pod: Option<&CachedPod>, wanted: &str) -> bool {
    pod.and_then(agent_report).is_some_and(|r| {
        let loaded: BTreeMap<String, String> =
            parameter_pairs(r.loaded_parameters.as_deref().unwrap_or_default())
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        !parameters_at_target(wanted, &loaded, r.applied_parameters.as_deref())
    })
}

/// The loaded parameters the node's agent reports (sysfs), if any.
pub fn loaded_parameters(pod: Option<&CachedPod>) -> Option<String> {
    pod.and_then(agent_report)
        .and_then(|r| r.loaded_parameters.clone())
        .filter(|p| !p.is_empty())
}

/// tt-kmd's udev rule file on the node, as its agent reports, if any.
pub fn udev_rule(pod: Option<&CachedPod>) -> Option<String> {
    pod.and_then(agent_report).and_then(|r| r.udev_rule.clone())
}

/// The node's other installed kernels and their modules, as its agent reports, if any.
pub fn next_kernels(pod: Option<&CachedPod>) -> Option<NextKernels> {
    pod.and_then(agent_report)
        .and_then(|r| NextKernels::of_report(&r.installed_kernels))
}

/// Who signed the loaded module, as the node's agent reports, if signed.
pub fn module_signer(pod: Option<&CachedPod>) -> Option<String> {
    pod.and_then(agent_report)
        .and_then(|r| r.module_signer.clone())
}

/// How the module came up at the agent's start, as it reports, if it says.
pub fn start_load(pod: Option<&CachedPod>) -> Option<NodeStartLoad> {
    pod.and_then(agent_report)
        .and_then(|r| r.start_load)
        .map(NodeStartLoad::from)
}

/// The commit the loaded module was built from, as the node's agent reports, if known.
pub fn loaded_commit(pod: Option<&CachedPod>) -> Option<String> {
    pod.and_then(agent_report)
        .and_then(|r| r.loaded_commit.clone())
}

/// The agent's report on its pod, if present and parseable.
pub fn agent_report(pod: &CachedPod) -> Option<&AgentReport> {
    pod.report.as_ref()
}

/// The template hash a pod was created from.
pub fn pod_template_hash(pod: &CachedPod) -> Option<&str> {
    get(&pod.metadata.annotations, annotations::TEMPLATE_HASH)
}

/// Picks the agent pod of a node among the pods found there: a live one over a terminating one.
pub fn pick_agent_pod<'a>(pods: impl IntoIterator<Item = &'a CachedPod>) -> Option<&'a CachedPod> {
    pods.into_iter()
        .min_by_key(|p| p.metadata.deletion_timestamp.is_some())
}

/// How the agent pod on a node is doing, relative to the DaemonSet's current template hash.
/// `node_not_ready`: the node's Ready condition when not True; `not_created`: why the
/// DaemonSet controller cannot create agent pods, if it says.
pub fn agent_pod(
    pod: Option<&CachedPod>,
    current_hash: &str,
    node_not_ready: Option<&str>,
    not_created: Option<&Blocker>,
) -> AgentPod {
    let Some(pod) = pod else {
        return not_created.map_or(AgentPod::Missing, |b| AgentPod::NotCreated(b.clone()));
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return AgentPod::Terminating;
    }
    if pod_template_hash(pod) != Some(current_hash) {
        return AgentPod::Stale;
    }
    AgentPod::Current(agent_condition(pod, node_not_ready))
}

fn agent_condition(pod: &CachedPod, node_not_ready: Option<&str>) -> AgentCondition {
    let status = pod.agent.as_ref();
    let image = pod.image.clone().unwrap_or_default();
    if let Some(status) = status
        && let Some(reason) = status.waiting_reason.as_deref()
    {
        let detail = status.waiting_message.clone().unwrap_or_default();
        if IMAGE_PULL_REASONS.contains(&reason) {
            return AgentCondition::Failed {
                reason: "ImagePullFailed".into(),
                message: format!(
                    "cannot pull the agent image {image} ({reason}: {detail}); check spec.installer.image and the node's pull secrets"
                ),
            };
        }
        if reason == "CrashLoopBackOff" {
            let restarts = status.restart_count;
            let last = status
                .last_exit
                .as_ref()
                .map(|(code, message)| {
                    let line = message
                        .as_deref()
                        .and_then(|m| m.lines().rev().find(|l| !l.trim().is_empty()))
                        .unwrap_or("no output");
                    format!("exit code {code}: {line}")
                })
                .unwrap_or_else(|| "no termination record".into());
            return AgentCondition::Failed {
                reason: "AgentCrashLoop".into(),
                message: format!(
                    "the agent keeps crashing ({restarts} restarts); last {last}; see kubectl logs -n {} {} --previous",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default()
                ),
            };
        }
    }
    if pod.ready {
        return AgentCondition::Ready;
    }
    match agent_report(pod) {
        Some(r) if r.phase == AgentPhase::Failed => AgentCondition::Failed {
            reason: r.reason.clone().unwrap_or_else(|| "AgentFailed".into()),
            message: r.message.clone().unwrap_or_else(|| {
                "the agent reported a failure without details; see its logs".into()
            }),
        },
        Some(r) if r.phase == AgentPhase::WaitingForGrant => AgentCondition::WaitingForGrant,
        Some(r) if r.phase == AgentPhase::WaitingForHolders => AgentCondition::WaitingForHolders {
            message: r
                .holders_text()
                .or_else(|| r.message.clone())
                .unwrap_or_else(|| "the device is held by processes".into()),
        },
        report => match pod_blocker(pod, node_not_ready) {
            Some(b) => AgentCondition::Stuck(b),
            None if report.is_none() => AgentCondition::Starting,
            None => AgentCondition::Working,
        },
    }
}

/// Whether the node is host-managed: labelled so by its agent, or reported so.
pub fn host_managed(meta: &ObjectMeta, pod: Option<&CachedPod>) -> bool {
    get(&meta.labels, labels::INSTALL_MODE) == Some(install_mode::HOST)
        || pod
            .and_then(agent_report)
            .is_some_and(|r| r.phase == AgentPhase::HostManaged)
}

/// The back-off before attempt `attempts + 1` of a Failed node: `base * 2^(attempts-1)`,
/// at most `max`.
pub fn retry_backoff(attempts: i32, base: Duration, max: Duration) -> Duration {
    let exp = u32::try_from(attempts.saturating_sub(1).clamp(0, 16)).unwrap_or(16);
    base.saturating_mul(2u32.saturating_pow(exp)).min(max)
}

/// Whether a Failed node may be retried now, and if not, how long until it may.
pub fn retry_gate(
    meta: &ObjectMeta,
    recorded: Option<&NodeStatus>,
    now: &Time,
    base: Duration,
    max: Duration,
) -> (RetryGate, Option<Duration>) {
    if retry_requested(meta) {
        return (RetryGate::Requested, None);
    }
    let Some(entry) = recorded.filter(|e| e.state == NodeState::Failed) else {
        return (RetryGate::NotYet, None);
    };
    let wait = retry_backoff(entry.attempts.unwrap_or(1), base, max);
    let since = entry
        .last_transition_time
        .as_ref()
        .map(|t| now.0.duration_since(t.0))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or(Duration::ZERO);
    if since >= wait {
        (RetryGate::Due, None)
    } else {
        (RetryGate::NotYet, Some(wait - since))
    }
}

/// Everything needed to observe one node.
#[derive(Debug)]
pub struct ObserveInput<'a> {
    /// The policy's name.
    pub policy: &'a str,
    /// The policy's target version (`spec.version`).
    pub target_version: &'a KmdVersion,
    /// The policy's module parameters as the kernel takes them (empty for none).
    pub target_parameters: &'a str,
    /// The node's metadata.
    pub meta: &'a ObjectMeta,
    /// `spec.unschedulable` when the full node was read.
    pub unschedulable: Option<bool>,
    /// The node's agent pod.
    pub pod: Option<&'a CachedPod>,
    /// The DaemonSet's current template hash.
    pub current_hash: &'a str,
    /// The node's recorded status entry.
    pub recorded: Option<&'a NodeStatus>,
    /// The older policy owning the node, if any.
    pub conflict_with: Option<String>,
    /// The node's drain.
    pub drain: DrainProgress,
    /// The retry gate.
    pub retry: RetryGate,
    /// The node's Ready condition when it is not True.
    pub node_not_ready: Option<&'a str>,
    /// Why the DaemonSet controller cannot create agent pods, if it says.
    pub not_created: Option<&'a Blocker>,
    /// The reconcile's clock reading.
    pub now: &'a Time,
}

/// How long the node has been in its recorded state, if the entry says when it entered it.
pub fn in_state_for(recorded: Option<&NodeStatus>, now: &Time) -> Option<Duration> {
    let entered = recorded?.last_transition_time.as_ref()?;
    Duration::try_from(now.0.duration_since(entered.0)).ok()
}

/// The node's observation (with the start gate still closed: the planner opens it).
pub fn observe(input: ObserveInput<'_>) -> NodeObservation {
    let cordoned_by_us = cordoned_by(input.meta, input.policy);
    NodeObservation {
        recorded: input.recorded.map(|r| r.state),
        conflict_with: input.conflict_with,
        host_managed: host_managed(input.meta, input.pod),
        // The node's label, else the agent's report: the two arrive by different watches, and a
        // node seen Working before its label is not a fresh install.
        loaded_version: loaded_version(input.meta).or_else(|| {
            input
                .pod
                .and_then(agent_report)
                .and_then(|r| r.loaded_version.clone())
        }),
        parameters_differ: parameters_differ(input.pod, input.target_parameters),
        agent: agent_pod(
            input.pod,
            input.current_hash,
            input.node_not_ready,
            input.not_created,
        ),
        cordoned_by_us,
        externally_cordoned: input.unschedulable == Some(true) && !cordoned_by_us,
        gates_closed_by_us: gates_closed(input.meta, input.policy),
        grant: upgrade_grant(input.meta, input.policy, input.target_version),
        drain: input.drain,
        retry: input.retry,
        start: StartGate::NoSlot,
        in_state_for: in_state_for(input.recorded, input.now),
        node_not_ready: input.node_not_ready.map(str::to_owned),
        lifted_unrecorded: false,
        unsupported_compiler: None,
        failed_for_other_target: input.recorded.is_some_and(|r| {
            r.state == NodeState::Failed
                && r.target_version
                    .as_deref()
                    .is_some_and(|v| v != input.target_version.as_str())
        }),
        held_for_jobs: input.recorded.is_some_and(|r| {
            r.state == NodeState::Failed
                && r.reason.as_deref()
                    == Some(crate::pure::transition::reasons::WAIT_FOR_COMPLETION_TIMEOUT)
        }),
    }
}

/// How long until the node's step reaches its deadline ([`RolloutRules::step_deadline`] after
/// the entry's `lastTransitionTime`), so the reconcile looks again then. `None` for a step
/// without one, and once it has passed (the decision at this `now` already saw it).
pub fn until_step_deadline(
    recorded: Option<&NodeStatus>,
    now: &Time,
    rules: &RolloutRules,
) -> Option<Duration> {
    let entry = recorded?;
    let limit = rules.step_deadline(entry.state)?;
    let waited = in_state_for(Some(entry), now)?;
    limit.checked_sub(waited).filter(|left| !left.is_zero())
}

/// The agent pod a `ReplaceAgent` among `todo` deletes, if any.
pub fn agent_to_replace(
    todo: &[Action],
    agent: &AgentPod,
    pods: &[Arc<CachedPod>],
) -> Option<CachedPod> {
    let replaces = todo.iter().any(|a| match a {
        Action::ReplaceAgent { even_current } => agent.replaced_by(*even_current),
        _ => false,
    });
    replaces
        .then(|| pick_agent_pod(pods.iter().map(|p| p.as_ref())).cloned())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
        PodCondition, PodStatus,
    };
    use k8s_openapi::jiff::Timestamp;
    use ttdp_api::agent_report::Holder;

    fn v(text: &str) -> KmdVersion {
        text.parse().unwrap()
    }

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        ObjectMeta {
            name: Some("n1".into()),
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        }
    }

    /// The classification of a full pod, through the cache's conversion.
    fn agent_pod(pod: Option<&Pod>, hash: &str) -> AgentPod {
        super::agent_pod(
            pod.map(|p| CachedPod::of(p.clone())).as_ref(),
            hash,
            None,
            None,
        )
    }

    fn pod(hash: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("ttdrv-fleet-abc".into()),
                namespace: Some("ns".into()),
                annotations: Some(BTreeMap::from([(
                    annotations::TEMPLATE_HASH.to_owned(),
                    hash.to_owned(),
                )])),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn with_report(mut p: Pod, r: &AgentReport) -> Pod {
        p.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                annotations::AGENT_REPORT.into(),
                serde_json::to_string(r).unwrap(),
            );
        p
    }

    fn report(phase: AgentPhase) -> AgentReport {
        AgentReport {
            phase,
            target_version: "2.8.0".into(),
            loaded_version: Some("2.7.0".into()),
            loaded_parameters: None,
            applied_parameters: None,
            loaded_commit: None,
            udev_rule: None,
            install_mode: "container".into(),
            holders: vec![],
            reason: None,
            message: None,
            kernel_compiler: None,
            installed_kernels: Vec::new(),
            start_load: None,
            module_signer: None,
        }
    }

    fn waiting(mut p: Pod, reason: &str, message: &str) -> Pod {
        let status = p.status.get_or_insert_with(Default::default);
        status.container_statuses = Some(vec![ContainerStatus {
            name: names::AGENT_CONTAINER.into(),
            restart_count: 4,
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: Some(message.into()),
                }),
                ..Default::default()
            }),
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 2,
                    message: Some("starting\nerror: TT_KMD_VERSION is not set\n".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        p
    }

    #[test]
    fn agent_pods_are_classified_against_the_current_template() {
        assert_eq!(agent_pod(None, "h2"), AgentPod::Missing);
        assert_eq!(agent_pod(Some(&pod("h1", true)), "h2"), AgentPod::Stale);
        assert_eq!(
            agent_pod(Some(&pod("h2", true)), "h2"),
            AgentPod::Current(AgentCondition::Ready)
        );
        assert_eq!(
            agent_pod(Some(&pod("h2", false)), "h2"),
            AgentPod::Current(AgentCondition::Starting),
            "not reported yet"
        );
        assert_eq!(
            agent_pod(
                Some(&with_report(
                    pod("h2", false),
                    &report(AgentPhase::Building)
                )),
                "h2"
            ),
            AgentPod::Current(AgentCondition::Working)
        );
        assert_eq!(
            agent_pod(
                Some(&with_report(
                    pod("h2", false),
                    &report(AgentPhase::WaitingForGrant)
                )),
                "h2"
            ),
            AgentPod::Current(AgentCondition::WaitingForGrant)
        );
        let mut deleting = pod("h2", true);
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(agent_pod(Some(&deleting), "h2"), AgentPod::Terminating);
        let cached = [CachedPod::of(deleting), CachedPod::of(pod("h2", false))];
        assert_eq!(
            pick_agent_pod(&cached).unwrap().metadata.deletion_timestamp,
            None
        );
    }

    #[test]
    fn agent_failures_say_what_failed() {
        let AgentPod::Current(AgentCondition::Failed { reason, message }) = agent_pod(
            Some(&waiting(pod("h", false), "ImagePullBackOff", "not found")),
            "h",
        ) else {
            panic!("image pull must fail the node")
        };
        assert_eq!(reason, "ImagePullFailed");
        assert!(message.contains("spec.installer.image"), "{message}");
        let AgentPod::Current(AgentCondition::Failed { reason, message }) = agent_pod(
            Some(&waiting(pod("h", false), "CrashLoopBackOff", "back-off")),
            "h",
        ) else {
            panic!("crash loop must fail the node")
        };
        assert_eq!(reason, "AgentCrashLoop");
        assert!(
            message.contains("error: TT_KMD_VERSION is not set"),
            "last log line: {message}"
        );
        assert!(message.contains("4 restarts"), "{message}");
        let mut failed = report(AgentPhase::Failed);
        failed.reason = Some("BuildFailed".into());
        failed.message = Some(
            "make modules failed: missing headers; install linux-headers-6.1.0-31-amd64".into(),
        );
        let p = with_report(pod("h", false), &failed);
        assert_eq!(
            agent_pod(Some(&p), "h"),
            AgentPod::Current(AgentCondition::Failed {
                reason: "BuildFailed".into(),
                message:
                    "make modules failed: missing headers; install linux-headers-6.1.0-31-amd64"
                        .into()
            })
        );
    }

    /// What Kubernetes says about an agent it does not run reaches the node's observation: the
    /// DaemonSet controller's FailedCreate for a node without a pod, the scheduler's message
    /// for a pod it cannot place, the node's Ready condition for a pod no kubelet starts.
    #[test]
    fn agents_kubernetes_does_not_run_say_why() {
        let failed_create = Blocker {
            reason: "FailedCreate".into(),
            message: "serviceaccount \"ttdp-agent\" not found".into(),
        };
        assert_eq!(
            super::agent_pod(None, "h", None, Some(&failed_create)),
            AgentPod::NotCreated(failed_create.clone())
        );
        let mut unschedulable = pod("h", false);
        unschedulable
            .status
            .get_or_insert_with(PodStatus::default)
            .conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/3 nodes are available: 1 Insufficient cpu.".into()),
            ..Default::default()
        }]);
        let AgentPod::Current(AgentCondition::Stuck(b)) = agent_pod(Some(&unschedulable), "h")
        else {
            panic!("an unschedulable pod is stuck")
        };
        assert_eq!(b.reason, "Unschedulable");
        assert!(b.message.contains("1 Insufficient cpu."), "{b:?}");
        let on_lost_node = CachedPod::of(pod("h", false));
        let AgentPod::Current(AgentCondition::Stuck(b)) = super::agent_pod(
            Some(&on_lost_node),
            "h",
            Some("Ready=Unknown: NodeStatusUnknown: Kubelet stopped posting node status."),
            None,
        ) else {
            panic!("a pod on a node that is not Ready is stuck")
        };
        assert_eq!(b.reason, "NodeNotReady");
        let AgentPod::Current(AgentCondition::Failed { reason, .. }) = agent_pod(
            Some(&waiting(
                pod("h", false),
                "ErrImagePull",
                "manifest unknown",
            )),
            "h",
        ) else {
            panic!("an image that cannot be pulled fails the node")
        };
        assert_eq!(reason, "ImagePullFailed");
    }

    #[test]
    fn holders_are_surfaced_while_waiting() {
        let mut r = report(AgentPhase::WaitingForHolders);
        r.holders = vec![Holder {
            pid: 1234,
            comm: "python3".into(),
        }];
        let p = with_report(pod("h", false), &r);
        assert_eq!(
            agent_pod(Some(&p), "h"),
            AgentPod::Current(AgentCondition::WaitingForHolders {
                message: "held by pid 1234 (python3)".into()
            })
        );
    }

    #[test]
    fn node_annotations_and_labels_are_read() {
        let m = meta(
            &[
                (labels::KMD_VERSION, "2.7.0"),
                (labels::INSTALL_MODE, "container"),
            ],
            &[
                (annotations::CORDONED_BY, "ttdp/fleet"),
                (annotations::DEPLOY_GATES, "a.example/x, b.example/y"),
                (annotations::RETRY, "2026-11-29T18:00:00Z"),
            ],
        );
        assert_eq!(loaded_version(&m).as_deref(), Some("2.7.0"));
        assert!(cordoned_by(&m, "fleet"));
        assert!(!cordoned_by(&m, "other"));
        assert_eq!(
            closed_gates(&m, "fleet"),
            vec!["a.example/x".to_string(), "b.example/y".to_string()]
        );
        let owned = meta(&[], &[(annotations::DEPLOY_GATES, "fleet:a.example/x")]);
        assert_eq!(
            closed_gates(&owned, "fleet"),
            vec!["a.example/x".to_string()]
        );
        assert!(closed_gates(&owned, "other").is_empty());
        assert!(holds_ours(&owned, "fleet", || false));
        assert!(
            !holds_ours(&owned, "other", || true),
            "gates another policy closed are never ours, even on a node we had"
        );
        assert!(retry_requested(&m));
        assert!(!host_managed(&m, None));
        let host = meta(&[(labels::INSTALL_MODE, "host")], &[]);
        assert!(host_managed(&host, None));
        let obs = observe(ObserveInput {
            policy: "fleet",
            target_version: &v("2.8.0"),
            target_parameters: "",
            meta: &meta(&[], &[(annotations::CORDONED_BY, "someone")]),
            unschedulable: Some(true),
            pod: None,
            current_hash: "h",
            recorded: None,
            conflict_with: None,
            drain: DrainProgress::NotStarted,
            retry: RetryGate::NotYet,
            node_not_ready: None,
            not_created: None,
            now: &Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        });
        assert!(obs.externally_cordoned && !obs.cordoned_by_us);
        assert_eq!(obs.grant, UpgradeGrant::Absent);
    }

    #[test]
    fn the_loaded_version_comes_from_the_report_until_the_label_is_seen() {
        let mut working = report(AgentPhase::Building);
        working.loaded_version = Some("2.7.0".into());
        let pod = CachedPod::of(with_report(pod("h", false), &working));
        let target = v("2.8.0");
        let input = |meta| ObserveInput {
            policy: "fleet",
            target_version: &target,
            target_parameters: "",
            meta,
            unschedulable: None,
            pod: Some(&pod),
            current_hash: "h",
            recorded: None,
            conflict_with: None,
            drain: DrainProgress::NotStarted,
            retry: RetryGate::NotYet,
            node_not_ready: None,
            not_created: None,
            now: &Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let unlabelled = meta(&[], &[]);
        assert_eq!(
            observe(input(&unlabelled)).loaded_version.as_deref(),
            Some("2.7.0"),
            "a node whose label is not seen yet is not taken for a fresh install"
        );
        let labelled = meta(&[(labels::KMD_VERSION, "2.6.0")], &[]);
        assert_eq!(
            observe(input(&labelled)).loaded_version.as_deref(),
            Some("2.6.0"),
            "the node's label wins"
        );
    }

    #[test]
    fn upgrade_grants_are_read_for_this_policy_and_target() {
        let granted = |value: &str| meta(&[], &[(annotations::UPGRADE_GRANT, value)]);
        assert_eq!(
            upgrade_grant(&granted("fleet/2.8.0"), "fleet", &v("2.8.0")),
            UpgradeGrant::Target
        );
        assert_eq!(
            upgrade_grant(&granted("fleet/2.7.0"), "fleet", &v("2.8.0")),
            UpgradeGrant::OtherVersion
        );
        for other in ["lab/2.8.0", "garbage", ""] {
            assert_eq!(
                upgrade_grant(&granted(other), "fleet", &v("2.8.0")),
                UpgradeGrant::Absent,
                "{other}"
            );
        }
        assert!(granted_by(&granted("fleet/2.7.0"), "fleet"));
        assert!(!granted_by(&granted("lab/2.7.0"), "fleet"));
        assert!(!granted_by(&meta(&[], &[]), "fleet"));
    }

    #[test]
    fn failed_nodes_back_off_exponentially_unless_a_retry_is_requested() {
        let base = Duration::from_secs(30);
        let max = Duration::from_secs(600);
        assert_eq!(retry_backoff(1, base, max), Duration::from_secs(30));
        assert_eq!(retry_backoff(3, base, max), Duration::from_secs(120));
        assert_eq!(retry_backoff(30, base, max), max);
        let t = |s: i64| Time(Timestamp::from_second(1_800_000_000 + s).unwrap());
        let entry = NodeStatus {
            name: "n1".into(),
            state: NodeState::Failed,
            current_version: None,
            target_version: None,
            install_mode: None,
            reason: None,
            message: None,
            last_transition_time: Some(t(0)),
            phase_start_time: None,
            attempts: Some(2),
            loaded_parameters: None,
            source_commit: None,
            udev_rule: None,
            next_kernels: None,
            module_signer: None,
            start_load: None,
        };
        let plain = meta(&[], &[]);
        assert_eq!(
            retry_gate(&plain, Some(&entry), &t(59), base, max),
            (RetryGate::NotYet, Some(Duration::from_secs(1)))
        );
        assert_eq!(
            retry_gate(&plain, Some(&entry), &t(60), base, max).0,
            RetryGate::Due
        );
        let asked = meta(&[], &[(annotations::RETRY, "now")]);
        assert_eq!(
            retry_gate(&asked, Some(&entry), &t(1), base, max).0,
            RetryGate::Requested
        );
    }

    /// The deadline counts from the recorded entry's `lastTransitionTime`, so a controller that
    /// restarts mid-step looks again when the node's time is up, not a whole timeout later.
    #[test]
    fn the_step_deadline_counts_from_the_recorded_transition() {
        let t = |s: i64| Time(Timestamp::from_second(1_800_000_000 + s).unwrap());
        let rules = RolloutRules {
            target_version: v("2.8.0"),
            target_parameters: String::new(),
            drain_enabled: true,
            gates_configured: true,
            drain_timeout: Some(Duration::from_secs(600)),
            node_timeout: Some(Duration::from_secs(1800)),
            completion_wait: None,
        };
        let entry = |state| NodeStatus {
            last_transition_time: Some(t(0)),
            ..NodeStatus::new("n1", state)
        };
        let upgrading = entry(NodeState::Upgrading);
        assert_eq!(
            until_step_deadline(Some(&upgrading), &t(1700), &rules),
            Some(Duration::from_secs(100))
        );
        assert_eq!(
            until_step_deadline(Some(&upgrading), &t(1800), &rules),
            None,
            "past it: already decided"
        );
        for settled in [NodeState::Pending, NodeState::Done, NodeState::Failed] {
            assert_eq!(
                until_step_deadline(Some(&entry(settled)), &t(1), &rules),
                None
            );
        }
        let no_timeout = RolloutRules {
            node_timeout: None,
            completion_wait: None,
            ..rules
        };
        assert_eq!(
            until_step_deadline(Some(&upgrading), &t(1), &no_timeout),
            None
        );
    }
}
