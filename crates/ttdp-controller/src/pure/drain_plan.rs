//! How a node is drained, from the policy's `upgradePolicy.drain` and `waitForCompletion`: the
//! wait for the node's jobs to finish, the two-pass plan ttdp-drain runs after it, its timeout (counted from when the node entered Draining, so a restarted drain does not
//! start the clock again), and when a node waiting in Upgrading on the device's holders reaches
//! that timeout. Pure: the time is an argument.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use ttdp_api::driver::v1alpha1::{DrainPolicy, SpecError, TenstorrentDriverPolicySpec};
use ttdp_api::{NodeState, NodeStatus, names};
use ttdp_drain::{
    CompletionWait, DevicePredicate, DrainOptions, OnCompletionTimeout, TwoPassDrain,
};

use crate::pure::observe;
use crate::pure::transition::reasons;

/// `upgradePolicy.drain.timeoutSeconds` when the drain is enabled.
pub fn drain_timeout(spec: &TenstorrentDriverPolicySpec) -> Option<Duration> {
    let drain = &spec.upgrade_policy.drain;
    drain.enable.then(|| timeout_of(drain))
}

/// `timeoutSeconds` of `drain` as a duration (a negative value counts as one second).
fn timeout_of(drain: &DrainPolicy) -> Duration {
    Duration::from_secs(u64::try_from(drain.timeout_seconds).unwrap_or(1))
}

/// What a node's drain runs: the wait for its jobs, then the two passes.
#[derive(Clone, Debug)]
pub struct NodeDrain {
    /// The wait for the node's jobs (`waitForCompletion`), if any.
    pub jobs: Option<CompletionWait>,
    /// The two passes.
    pub passes: TwoPassDrain,
}

/// The drain of a node that entered Draining `elapsed` ago ([`jobs_wait`], [`two_pass_drain`]).
pub fn node_drain(
    spec: &TenstorrentDriverPolicySpec,
    elapsed: Duration,
) -> Result<NodeDrain, SpecError> {
    Ok(NodeDrain {
        jobs: jobs_wait(spec, elapsed)?,
        passes: two_pass_drain(spec, elapsed)?,
    })
}

/// How often the node's pods are listed while waiting for its jobs.
const COMPLETION_POLL: Duration = Duration::from_secs(2);

/// How long a Draining node may wait for its jobs first (`Duration::MAX`: no limit); None
/// without `waitForCompletion`.
pub fn completion_wait(spec: &TenstorrentDriverPolicySpec) -> Option<Duration> {
    let wait = spec.upgrade_policy.wait_for_completion.as_ref()?;
    Some(match u64::try_from(wait.timeout_seconds) {
        Ok(secs) if secs > 0 => Duration::from_secs(secs),
        _ => Duration::MAX,
    })
}

/// The wait for the jobs of a node that entered Draining `elapsed` ago: what remains of its
/// timeout (at least a second); None without `waitForCompletion`.
pub fn jobs_wait(
    spec: &TenstorrentDriverPolicySpec,
    elapsed: Duration,
) -> Result<Option<CompletionWait>, SpecError> {
    let (Some(wait), Some(selector)) = (
        spec.upgrade_policy.wait_for_completion.as_ref(),
        spec.wait_for_completion_selector()?,
    ) else {
        return Ok(None);
    };
    let timeout = completion_wait(spec)
        .filter(|t| *t != Duration::MAX)
        .map(|t| t.saturating_sub(elapsed).max(Duration::from_secs(1)));
    Ok(Some(CompletionWait {
        selector,
        timeout,
        on_timeout: match wait.on_timeout.as_str() {
            "Fail" => OnCompletionTimeout::Fail,
            _ => OnCompletionTimeout::Drain,
        },
        poll_interval: COMPLETION_POLL,
    }))
}

/// The drain of a node that entered Draining `elapsed` ago: what remains of the timeout (at
/// least a second; it starts after the wait for jobs, counted at its longest, or at once when
/// that wait has no limit), the device's pods in the first pass, the selected or all pods in
/// the second.
pub fn two_pass_drain(
    spec: &TenstorrentDriverPolicySpec,
    elapsed: Duration,
) -> Result<TwoPassDrain, SpecError> {
    let drain = &spec.upgrade_policy.drain;
    let after_wait = match completion_wait(spec) {
        Some(Duration::MAX) => Duration::ZERO,
        Some(wait) => elapsed.saturating_sub(wait),
        None => elapsed,
    };
    let timeout = timeout_of(drain)
        .saturating_sub(after_wait)
        .max(Duration::from_secs(1));
    Ok(TwoPassDrain {
        device: DevicePredicate {
            host_path_prefixes: vec![names::DEVICE_PATH.to_owned()],
            resource_prefixes: vec![names::DEVICE_RESOURCE_PREFIX.to_owned()],
        },
        full_node: drain.full_node,
        pod_selector: spec.pod_selector()?,
        force: drain.force,
        delete_emptydir_data: drain.delete_empty_dir,
        options: DrainOptions {
            timeout: Some(timeout),
            ..DrainOptions::default()
        },
    })
}

/// How long since `entered`, at `now` (zero when unknown or in the future).
pub fn elapsed_since(entered: Option<&Time>, now: &Time) -> Duration {
    entered
        .map(|t| now.0.duration_since(t.0))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default()
}

/// How long until a node waiting in Upgrading on the device's holders reaches its deadline
/// (`timeout` after it entered Upgrading), so the reconcile looks again then.
pub fn holders_deadline(
    entry: Option<&NodeStatus>,
    now: &Time,
    timeout: Option<Duration>,
) -> Option<Duration> {
    let entry = entry.filter(|e| {
        e.state == NodeState::Upgrading && e.reason.as_deref() == Some(reasons::DEVICE_HELD)
    })?;
    let waited = observe::in_state_for(Some(entry), now)?;
    Some(timeout?.saturating_sub(waited))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn spec(timeout_seconds: i64, enable: bool) -> TenstorrentDriverPolicySpec {
        let mut spec: TenstorrentDriverPolicySpec =
            serde_json::from_value(serde_json::json!({"version": "2.8.0"})).unwrap();
        spec.upgrade_policy.drain.timeout_seconds = timeout_seconds;
        spec.upgrade_policy.drain.enable = enable;
        spec
    }

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn the_drain_timeout_counts_from_entering_draining() {
        let plan = two_pass_drain(&spec(300, true), Duration::from_secs(120)).unwrap();
        assert_eq!(plan.options.timeout, Some(Duration::from_secs(180)));
        let late = two_pass_drain(&spec(300, true), Duration::from_secs(900)).unwrap();
        assert_eq!(late.options.timeout, Some(Duration::from_secs(1)));
        assert_eq!(plan.device.host_path_prefixes, vec![names::DEVICE_PATH]);
        assert_eq!(
            elapsed_since(Some(&at(100)), &at(160)),
            Duration::from_secs(60)
        );
        assert_eq!(elapsed_since(Some(&at(200)), &at(160)), Duration::ZERO);
        assert_eq!(elapsed_since(None, &at(160)), Duration::ZERO);
    }

    #[test]
    fn without_a_drain_there_is_no_drain_timeout() {
        assert_eq!(drain_timeout(&spec(60, false)), None);
        assert_eq!(
            drain_timeout(&spec(60, true)),
            Some(Duration::from_secs(60))
        );
        assert_eq!(drain_timeout(&spec(-5, true)), Some(Duration::from_secs(1)));
    }

    #[test]
    fn only_a_node_held_in_upgrading_has_a_holders_deadline() {
        let held = NodeStatus {
            reason: Some(reasons::DEVICE_HELD.into()),
            last_transition_time: Some(at(100)),
            ..NodeStatus::new("n", NodeState::Upgrading)
        };
        let timeout = Some(Duration::from_secs(60));
        assert_eq!(
            holders_deadline(Some(&held), &at(130), timeout),
            Some(Duration::from_secs(30))
        );
        assert_eq!(holders_deadline(Some(&held), &at(130), None), None);
        let draining = NodeStatus {
            state: NodeState::Draining,
            ..held.clone()
        };
        assert_eq!(holders_deadline(Some(&draining), &at(130), timeout), None);
    }
}
