//! The pod status a kubelet reports, computed from its containers' states.

use std::collections::HashMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::container_runtime::{ContainerSnapshot, RunState, Termination};

/// The pod's phase from its containers: `Pending` until one started, `Succeeded`/`Failed` once all
/// ended for good, `Running` otherwise.
pub(crate) fn pod_phase(containers: &[ContainerSnapshot]) -> &'static str {
    if !containers.is_empty() && containers.iter().all(|c| c.done) {
        let all_ok = containers
            .iter()
            .all(|c| matches!(&c.state, RunState::Terminated(t) if t.exit_code == 0));
        return if all_ok { "Succeeded" } else { "Failed" };
    }
    if containers.iter().any(|c| c.ever_started) {
        "Running"
    } else {
        "Pending"
    }
}

/// Everything about the pod that is not its containers.
#[derive(Debug, Clone)]
pub(crate) struct PodFacts<'a> {
    pub host_ip: &'a str,
    pub pod_ip: &'a str,
    pub start_time: Timestamp,
    /// The pod uid, for container ids.
    pub uid: &'a str,
}

/// When each kubelet condition last changed, as this kubelet saw it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConditionClock(HashMap<String, (bool, Timestamp)>);

impl ConditionClock {
    /// The transition time of condition `type_` now at `status`.
    fn since(&mut self, type_: &str, status: bool) -> Timestamp {
        let entry = self
            .0
            .entry(type_.to_owned())
            .or_insert((status, Timestamp::now()));
        if entry.0 != status {
            *entry = (status, Timestamp::now());
        }
        entry.1
    }
}

/// The full pod status; `previous` is the status last read from the API (its foreign conditions
/// and QoS class are kept).
pub(crate) fn pod_status(
    facts: &PodFacts<'_>,
    previous: Option<&PodStatus>,
    containers: &[ContainerSnapshot],
    clock: &mut ConditionClock,
) -> PodStatus {
    let phase = pod_phase(containers);
    let unready: Vec<&str> = containers
        .iter()
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    let ready = phase == "Running" && unready.is_empty();
    let mut condition =
        |type_: &str, status: bool, reason: Option<String>, message: Option<String>| {
            let since = Time(clock.since(type_, status));
            let status = if status { "True" } else { "False" }.to_owned();
            PodCondition {
                type_: type_.to_owned(),
                status,
                reason,
                message,
                last_transition_time: Some(since),
                last_probe_time: None,
                observed_generation: None,
            }
        };
    let reason = (!ready).then(|| "ContainersNotReady".to_owned());
    let message =
        (!ready).then(|| format!("containers with unready status: [{}]", unready.join(" ")));
    let mut conditions = vec![
        condition("PodReadyToStartContainers", true, None, None),
        condition("Initialized", true, None, None),
        condition("Ready", ready, reason.clone(), message.clone()),
        condition("ContainersReady", ready, reason, message),
        condition("PodScheduled", true, None, None),
    ];
    // Conditions the kubelet does not own (e.g. `DisruptionTarget`) are kept as they are.
    let foreign: Vec<PodCondition> = previous
        .and_then(|p| p.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| !conditions.iter().any(|k| k.type_ == c.type_))
        .cloned()
        .collect();
    conditions.extend(foreign);
    PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(conditions),
        host_ip: Some(facts.host_ip.to_owned()),
        host_ips: Some(vec![HostIP {
            ip: facts.host_ip.to_owned(),
        }]),
        pod_ip: Some(facts.pod_ip.to_owned()),
        pod_ips: Some(vec![PodIP {
            ip: facts.pod_ip.to_owned(),
        }]),
        start_time: Some(Time(facts.start_time)),
        qos_class: previous.and_then(|p| p.qos_class.clone()),
        container_statuses: Some(
            containers
                .iter()
                .map(|c| container_status(facts.uid, c))
                .collect(),
        ),
        ..PodStatus::default()
    }
}

fn container_status(uid: &str, c: &ContainerSnapshot) -> ContainerStatus {
    let running = matches!(c.state, RunState::Running { .. });
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: format!("sim://{}", c.image),
        container_id: c
            .ever_started
            .then(|| format!("sim://{uid}/{}/{}", c.name, c.restart_count)),
        ready: c.ready,
        started: Some(running),
        restart_count: c.restart_count,
        state: Some(container_state(&c.state)),
        last_state: c.last_termination.as_ref().map(|t| ContainerState {
            terminated: Some(terminated(t)),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }
}

fn container_state(state: &RunState) -> ContainerState {
    match state {
        RunState::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..ContainerState::default()
        },
        RunState::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started_at)),
            }),
            ..ContainerState::default()
        },
        RunState::Terminated(t) => ContainerState {
            terminated: Some(terminated(t)),
            ..ContainerState::default()
        },
    }
}

fn terminated(t: &Termination) -> ContainerStateTerminated {
    ContainerStateTerminated {
        exit_code: t.exit_code,
        reason: Some(t.reason.clone()),
        message: t.message.clone(),
        started_at: t.started_at.map(Time),
        finished_at: Some(Time(t.finished_at)),
        ..ContainerStateTerminated::default()
    }
}

/// Whether `pod` ended for good (phase `Succeeded` or `Failed`).
pub(crate) fn pod_is_finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// Whether `pod` has the Ready condition.
pub fn pod_is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(state: RunState, ready: bool, done: bool) -> ContainerSnapshot {
        ContainerSnapshot {
            name: "c".to_owned(),
            image: "img".to_owned(),
            ever_started: !matches!(state, RunState::Waiting { .. }) || done,
            state,
            last_termination: None,
            ready,
            restart_count: 0,
            done,
            instance: 0,
        }
    }

    fn ended(code: i32) -> RunState {
        RunState::Terminated(Termination {
            exit_code: code,
            reason: "Error".to_owned(),
            message: None,
            started_at: None,
            finished_at: Timestamp::now(),
        })
    }

    fn creating() -> RunState {
        RunState::Waiting {
            reason: "ContainerCreating".to_owned(),
            message: None,
        }
    }

    #[test]
    fn phase_follows_the_containers() {
        let running = RunState::Running {
            started_at: Timestamp::now(),
        };
        assert_eq!(pod_phase(&[container(creating(), false, false)]), "Pending");
        assert_eq!(
            pod_phase(&[container(running.clone(), true, false)]),
            "Running"
        );
        assert_eq!(
            pod_phase(&[
                container(ended(0), false, true),
                container(running, true, false)
            ]),
            "Running"
        );
        assert_eq!(pod_phase(&[container(ended(0), false, true)]), "Succeeded");
        assert_eq!(
            pod_phase(&[
                container(ended(0), false, true),
                container(ended(2), false, true)
            ]),
            "Failed"
        );
    }

    #[test]
    fn ready_needs_every_container_and_keeps_foreign_conditions() {
        let running = || RunState::Running {
            started_at: Timestamp::now(),
        };
        let previous = PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "DisruptionTarget".to_owned(),
                status: "True".to_owned(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        };
        let facts = PodFacts {
            host_ip: "10.0.0.2",
            pod_ip: "10.244.0.2",
            start_time: Timestamp::now(),
            uid: "u",
        };
        let mut clock = ConditionClock::default();
        let mut a = container(running(), true, false);
        a.name = "a".to_owned();
        let mut b = container(running(), false, false);
        b.name = "b".to_owned();
        let status = pod_status(&facts, Some(&previous), &[a.clone(), b.clone()], &mut clock);
        let conditions = status.conditions.unwrap();
        let ready = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [b]")
        );
        assert!(conditions.iter().any(|c| c.type_ == "DisruptionTarget"));
        let since = ready.last_transition_time.clone().unwrap();

        b.ready = true;
        let now_ready = pod_status(&facts, Some(&previous), &[a.clone(), b.clone()], &mut clock);
        let ready = now_ready
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
        let first_ready = status_ready_time(&now_ready);
        assert!(first_ready.clone().unwrap().0 >= since.0);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let again = status_ready_time(&pod_status(&facts, Some(&previous), &[a, b], &mut clock));
        assert_eq!(again, first_ready, "no transition, no new time");
    }

    fn status_ready_time(status: &PodStatus) -> Option<Time> {
        status
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Ready")?
            .last_transition_time
            .clone()
    }
}
