//! What holds nodes back beside `maxUnavailable`: the maintenance windows
//! (`upgradePolicy.schedule`) and the canary (`upgradePolicy.canary`, see [`canary`]).
//!
//! Both only keep nodes from *starting*: a node in flight finishes its step, and a first
//! install (nothing loaded, nothing of ours on the node) is never held, since it disrupts
//! nothing. A retry an admin asks for passes a canary halt, as it passes the failure budget's.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use ttdp_api::TenstorrentDriverPolicySpec;
use ttdp_api::driver::rollout_guards::canary_count;
use ttdp_api::driver::v1alpha1::{RolloutStatus, WindowState};

use crate::pure::canary::{self, CanaryGate, CanaryNode, CanaryRules, CanaryVerdict};
use crate::pure::transition::{
    AgentCondition, AgentPod, NodeObservation, NodeTransition, RetryGate, StartGate,
};

/// The guards of a policy's reconcile at `now`: `rollout_target` is `spec.version` (the
/// policy may be rolling back to another), `previous` the recorded `status.rollout`, `managed`
/// the nodes the canary's percentage counts.
pub fn guards_of(
    spec: &TenstorrentDriverPolicySpec,
    rollout_target: &str,
    previous: Option<&RolloutStatus>,
    managed: usize,
    now: Timestamp,
) -> Guards {
    let policy = &spec.upgrade_policy;
    let canary = policy.canary.as_ref().map(|c| CanaryRules {
        count: canary_count(&c.nodes, managed).unwrap_or(1),
        soak: Duration::from_secs(u64::try_from(c.soak_seconds).unwrap_or(0)),
        auto_rollback: c.auto_rollback,
    });
    Guards {
        target: rollout_target.to_owned(),
        // A schedule that does not resolve is refused before a pass (InvalidSpec).
        window: policy.schedule.as_ref().and_then(|s| s.state_at(now).ok()),
        canary,
        previous: previous.cloned(),
        now: Some(now),
    }
}

/// The guards of one reconcile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Guards {
    /// `spec.version` (the rollout's target even while rolling back).
    pub target: String,
    /// The schedule's state at the reconcile's time (None: no schedule).
    pub window: Option<WindowState>,
    /// The canary's rules (None: no canary).
    pub canary: Option<CanaryRules>,
    /// `status.rollout` as last recorded.
    pub previous: Option<RolloutStatus>,
    /// The reconcile's time.
    pub now: Option<Timestamp>,
}

impl Guards {
    /// Whether any guard is set.
    pub fn any(&self) -> bool {
        self.window.is_some() || self.canary.is_some()
    }

    /// Where the canary stands, judged from every node's closed-gate transition (None: no
    /// canary).
    pub fn judge(
        &self,
        nodes: &[(String, NodeObservation)],
        closed: &[NodeTransition],
    ) -> Option<CanaryVerdict> {
        let rules = self.canary.as_ref()?;
        let mut view: Vec<CanaryNode> = nodes
            .iter()
            .zip(closed)
            .filter(|((_, obs), _)| obs.conflict_with.is_none() && !obs.host_managed)
            .map(|((name, obs), t)| CanaryNode {
                name: name.clone(),
                state: t.state,
                loaded: obs.loaded_version.clone(),
                agent_ready: obs.agent == AgentPod::Current(AgentCondition::Ready),
                node_ready: obs.node_not_ready.is_none(),
                retry_requested: obs.retry == RetryGate::Requested,
                why: agent_failure(&obs.agent).or_else(|| why(t)),
            })
            .collect();
        view.sort_by(|a, b| a.name.cmp(&b.name));
        let now = self.now.unwrap_or(Timestamp::UNIX_EPOCH);
        Some(canary::advance(
            self.previous.as_ref(),
            &self.target,
            rules,
            &view,
            now,
        ))
    }

    /// The gate that holds node `name`, which could start now (None: not held).
    pub fn hold(
        &self,
        verdict: Option<&CanaryVerdict>,
        name: &str,
        obs: &NodeObservation,
    ) -> Option<StartGate> {
        if obs.is_fresh_install() {
            return None;
        }
        if let Some(WindowState::Closed { opens }) = self.window {
            return Some(StartGate::OutsideWindow(opens));
        }
        match &verdict?.gate {
            CanaryGate::Anyone => None,
            CanaryGate::CanariesOnly => {
                let canaries = &verdict?.status.canary_nodes;
                (!canaries.iter().any(|c| c == name)).then_some(StartGate::WaitingForCanary)
            }
            CanaryGate::Soaking(until) => Some(StartGate::Soaking(*until)),
            CanaryGate::Halted => {
                (obs.retry != RetryGate::Requested).then_some(StartGate::CanaryHalted)
            }
        }
    }

    /// `status.rollout` to record: the canary's state and, outside every window, when the next
    /// one opens (None without guards).
    pub fn rollout_status(&self, verdict: Option<&CanaryVerdict>) -> Option<RolloutStatus> {
        if !self.any() {
            return None;
        }
        let mut status = match verdict {
            Some(v) => v.status.clone(),
            None => RolloutStatus {
                target_version: self.target.clone(),
                ..RolloutStatus::default()
            },
        };
        status.next_window = match self.window {
            Some(WindowState::Closed { opens }) => Some(Time(opens)),
            _ => None,
        };
        Some(status)
    }

    /// How long until a guard may let nodes start or must stop them: the soak's end, the next
    /// window's opening or the open window's closing.
    pub fn changes_in(&self, verdict: Option<&CanaryVerdict>) -> Option<Duration> {
        let now = self.now?;
        let soak_end = verdict.and_then(|v| match v.gate {
            CanaryGate::Soaking(until) => Some(until),
            _ => None,
        });
        let window_change = self.window.map(|w| match w {
            WindowState::Open { closes } => closes,
            WindowState::Closed { opens } => opens,
        });
        [soak_end, window_change]
            .into_iter()
            .flatten()
            .map(|at| Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO))
            .min()
    }
}

/// What the agent reports when it failed (its readiness probe, a failed validation).
fn agent_failure(agent: &AgentPod) -> Option<String> {
    match agent {
        AgentPod::Current(AgentCondition::Failed { reason, message }) => {
            Some(format!("{reason}: {message}"))
        }
        _ => None,
    }
}

/// A transition's reason and message, for saying why a canary node halted the rollout.
fn why(t: &NodeTransition) -> Option<String> {
    match (&t.reason, &t.message) {
        (Some(r), Some(m)) => Some(format!("{r}: {m}")),
        (Some(r), None) => Some(r.clone()),
        (None, Some(m)) => Some(m.clone()),
        (None, None) => None,
    }
}
