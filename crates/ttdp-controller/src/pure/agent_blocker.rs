//! Why Kubernetes does not run a node's agent, in Kubernetes' own words: the DaemonSet
//! controller cannot create agent pods (its `FailedCreate` Events, e.g. a missing
//! ServiceAccount), the scheduler cannot place one (the pod's `PodScheduled` condition is False,
//! e.g. not enough CPU on the node), a container cannot be created (a waiting reason such as
//! `CreateContainerConfigError`), or the pod's node is not Ready (no kubelet starts it).
//!
//! Image pull errors and crash loops fail the node outright (see
//! [`observe`](crate::pure::observe)); these blockers leave it waiting, since Kubernetes keeps
//! retrying, but with the message that says what to fix. Pure functions over what was read.

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::pure::cached::CachedPod;

/// The reason of the DaemonSet controller's Event when it cannot create a pod.
pub const FAILED_CREATE: &str = "FailedCreate";
/// The node reason when the agent's node is not Ready.
pub const NODE_NOT_READY: &str = "NodeNotReady";
/// The node reason when the scheduler cannot place the agent pod (unless the pod's condition
/// names another).
pub const UNSCHEDULABLE: &str = "Unschedulable";

/// Container waiting reasons of a container on its way to running (nothing to report).
const STARTING: [&str; 2] = ["ContainerCreating", "PodInitializing"];

/// What keeps a node's agent from running: an UpperCamelCase reason and a message naming the
/// object and quoting Kubernetes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// e.g. `FailedCreate`, `Unschedulable`, `NodeNotReady`.
    pub reason: String,
    /// What Kubernetes says, and where to look.
    pub message: String,
}

/// Why an agent pod on the current template is not running, if Kubernetes says: it cannot be
/// scheduled, its container cannot be created, or its node is not Ready (`node_not_ready`:
/// the node's Ready condition as [`crate::pure::cached::CachedNode::not_ready`] keeps it). A Ready
/// pod has no blocker.
pub fn pod_blocker(pod: &CachedPod, node_not_ready: Option<&str>) -> Option<Blocker> {
    if pod.ready {
        return None;
    }
    let name = pod_name(pod);
    if let Some((reason, message)) = &pod.unschedulable {
        return Some(Blocker {
            reason: if reason.is_empty() {
                UNSCHEDULABLE.to_owned()
            } else {
                reason.clone()
            },
            message: format!(
                "the scheduler cannot place agent pod {name} on this node: {message}; free resources on the node or remove what keeps the pod off it"
            ),
        });
    }
    if let Some(agent) = &pod.agent
        && let Some(reason) = agent.waiting_reason.as_deref()
        && !STARTING.contains(&reason)
    {
        let detail = agent.waiting_message.as_deref().unwrap_or("no message");
        return Some(Blocker {
            reason: reason.to_owned(),
            message: format!(
                "the agent container of pod {name} cannot start ({reason}: {detail}); see kubectl describe pod -n {name_ns}",
                name_ns = name.replacen('/', " ", 1)
            ),
        });
    }
    node_not_ready.map(|ready| Blocker {
        reason: NODE_NOT_READY.to_owned(),
        message: format!(
            "agent pod {name} is bound to this node, but the node is not Ready ({ready}): no kubelet runs the pod until the node is back"
        ),
    })
}

/// Why the DaemonSet `namespace/name` (uid `uid`, when known) has no agent pod on a node, from
/// its Events: the newest `FailedCreate` of this DaemonSet (not of an earlier one of the same
/// name), unless an agent pod was created after it (`newest_pod`: creation does work since).
pub fn failed_create(
    events: &[Event],
    daemonset: &str,
    uid: Option<&str>,
    newest_pod: Option<&Time>,
    now: &Time,
) -> Option<Blocker> {
    let (event, seen) = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(FAILED_CREATE))
        .filter(|e| uid.is_none_or(|u| e.involved_object.uid.as_deref() == Some(u)))
        .filter_map(|e| Some((e, last_seen(e)?)))
        .max_by_key(|(_, seen)| *seen)?;
    if newest_pod.is_some_and(|created| created.0 > seen) {
        return None;
    }
    let count = event
        .series
        .as_ref()
        .and_then(|s| s.count)
        .or(event.count)
        .unwrap_or(1);
    let ago = now.0.duration_since(seen).as_secs().max(0);
    let said = event.message.as_deref().unwrap_or("no message");
    Some(Blocker {
        reason: FAILED_CREATE.to_owned(),
        message: format!(
            "the DaemonSet controller cannot create the agent pod ({FAILED_CREATE}, {count} times, last {ago}s ago): {said}; see kubectl describe daemonset -n {}",
            daemonset.replacen('/', " ", 1)
        ),
    })
}

/// When an Event was last seen: its series' last observation, else its last timestamp, else
/// its event time.
fn last_seen(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
}

fn pod_name(pod: &CachedPod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pure::cached::AgentContainer;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + secs).unwrap())
    }

    fn pod() -> CachedPod {
        CachedPod {
            metadata: ObjectMeta {
                name: Some("ttdrv-fleet-abcde".into()),
                namespace: Some("ttdp-system".into()),
                ..ObjectMeta::default()
            },
            node_name: Some("n1".into()),
            ..CachedPod::default()
        }
    }

    #[test]
    fn an_unschedulable_pod_quotes_the_scheduler() {
        let mut p = pod();
        p.unschedulable = Some((
            "Unschedulable".into(),
            "0/4 nodes are available: 1 Insufficient cpu.".into(),
        ));
        let b = pod_blocker(&p, None).unwrap();
        assert_eq!(b.reason, "Unschedulable");
        assert!(
            b.message.contains("ttdp-system/ttdrv-fleet-abcde")
                && b.message
                    .contains("0/4 nodes are available: 1 Insufficient cpu."),
            "{b:?}"
        );
        p.unschedulable = Some((String::new(), "no reason given".into()));
        assert_eq!(pod_blocker(&p, None).unwrap().reason, UNSCHEDULABLE);
    }

    #[test]
    fn a_container_that_cannot_be_created_says_why_but_starting_is_not_a_blocker() {
        let mut p = pod();
        p.agent = Some(AgentContainer {
            waiting_reason: Some("CreateContainerConfigError".into()),
            waiting_message: Some("secret \"x\" not found".into()),
            ..AgentContainer::default()
        });
        let b = pod_blocker(&p, None).unwrap();
        assert_eq!(b.reason, "CreateContainerConfigError");
        assert!(b.message.contains("secret \"x\" not found"), "{b:?}");
        assert!(
            b.message
                .contains("kubectl describe pod -n ttdp-system ttdrv-fleet-abcde")
        );
        for starting in STARTING {
            p.agent = Some(AgentContainer {
                waiting_reason: Some(starting.into()),
                ..AgentContainer::default()
            });
            assert_eq!(pod_blocker(&p, None), None, "{starting}");
        }
    }

    #[test]
    fn a_pod_on_a_node_that_is_not_ready_says_so() {
        let p = pod();
        let b = pod_blocker(
            &p,
            Some("Ready=Unknown: NodeStatusUnknown: Kubelet stopped posting node status."),
        )
        .unwrap();
        assert_eq!(b.reason, NODE_NOT_READY);
        assert!(
            b.message.contains("Kubelet stopped posting node status."),
            "{b:?}"
        );
        assert_eq!(
            pod_blocker(&p, None),
            None,
            "a starting pod on a Ready node"
        );
        let mut ready = pod();
        ready.ready = true;
        assert_eq!(pod_blocker(&ready, Some("Ready=False")), None);
    }

    fn event(uid: &str, last: i64, count: i32, message: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": format!("ttdrv-fleet.{last}"), "namespace": "ttdp-system"},
            "involvedObject": {"kind": "DaemonSet", "name": "ttdrv-fleet", "namespace": "ttdp-system", "uid": uid},
            "reason": "FailedCreate",
            "type": "Warning",
            "message": message,
            "count": count,
            "lastTimestamp": at(last).0.to_string(),
        }))
        .unwrap()
    }

    const MISSING_SA: &str = "Error creating: pods \"ttdrv-fleet-\" is forbidden: error looking up service account ttdp-system/ttdp-agent: serviceaccount \"ttdp-agent\" not found";

    #[test]
    fn failed_create_quotes_the_newest_event_of_this_daemonset() {
        let events = vec![
            event(
                "old-uid",
                50,
                9,
                "from an earlier DaemonSet of the same name",
            ),
            event("ds-uid", 10, 1, "an older failure"),
            event("ds-uid", 40, 7, MISSING_SA),
        ];
        let b = failed_create(
            &events,
            "ttdp-system/ttdrv-fleet",
            Some("ds-uid"),
            None,
            &at(45),
        )
        .unwrap();
        assert_eq!(b.reason, FAILED_CREATE);
        assert!(b.message.contains(MISSING_SA), "{b:?}");
        assert!(b.message.contains("7 times, last 5s ago"), "{b:?}");
        assert!(
            b.message
                .contains("kubectl describe daemonset -n ttdp-system ttdrv-fleet")
        );
    }

    #[test]
    fn failed_create_is_over_once_a_pod_was_created_after_it() {
        let events = vec![event("ds-uid", 40, 7, MISSING_SA)];
        let ds = "ttdp-system/ttdrv-fleet";
        assert_eq!(
            failed_create(&events, ds, Some("ds-uid"), Some(&at(41)), &at(45)),
            None
        );
        assert!(failed_create(&events, ds, Some("ds-uid"), Some(&at(30)), &at(45)).is_some());
        assert_eq!(failed_create(&[], ds, Some("ds-uid"), None, &at(45)), None);
        assert_eq!(
            failed_create(&events, ds, Some("other"), None, &at(45)),
            None,
            "another DaemonSet's"
        );
    }
}
