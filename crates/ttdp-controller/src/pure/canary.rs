//! The canary of a rollout, as one pure function: [`advance`] takes where the rollout stood
//! (`status.rollout`), the fleet as it is now and the time, and returns where it stands now and
//! who may start.
//!
//! `Canary → Soaking → Rolling`; `Halted` from Canary or Soaking when a canary node fails or,
//! once Done, goes unready; with `autoRollback`, `Halted → RollingBack → RolledBack`.
//!
//! The canary nodes are chosen once, when the rollout to a version begins: the first `nodes`
//! Ready nodes in name order among those running another version (one that goes down before
//! its turn is replaced, see [`refill`]). `fromVersion`, where a rollback goes, is what those
//! nodes run, never the target of an earlier rollout. First installs (nothing loaded)
//! are not upgrades: they never make a canary, and a fleet of them rolls out at once. They are recorded in the status, so a
//! restart or a node joining does not change them. A canary node that leaves the selection
//! (deleted, or skipped with the skip label) is no longer waited for.
//!
//! A halt stays until the spec's version changes, or an admin acts on the node that caused it:
//! a retry (`kubectl tt driver retry`) starts the canary again, with a fresh soak; skipping the
//! node does too. Rolling back is a rollout of the previous version: the effective target
//! becomes `fromVersion`, which the nodes that never started already run, so only the canary
//! nodes go through cordon, drain, swap and uncordon again.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use ttdp_api::driver::v1alpha1::{RolloutStatus, rollout_phase as phase};
use ttdp_api::{NodeState, TenstorrentDriverPolicySpec};

/// `upgradePolicy.canary`, resolved against the fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryRules {
    /// How many canary nodes.
    pub count: usize,
    /// How long they soak once Done.
    pub soak: Duration,
    /// Go back to the previous version on a halt.
    pub auto_rollback: bool,
}

/// One managed node (not host-managed, not owned by another policy) as the canary sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryNode {
    /// Node name.
    pub name: String,
    /// Its state as planned this pass.
    pub state: NodeState,
    /// The loaded module's version, if known.
    pub loaded: Option<String>,
    /// Its agent pod is on the current template and Ready (the version and devices check out).
    pub agent_ready: bool,
    /// The node itself is Ready (kubelet up, not unreachable): it can take its turn now.
    pub node_ready: bool,
    /// An admin asked to retry it.
    pub retry_requested: bool,
    /// The state's reason and message, for saying why it halted the rollout.
    pub why: Option<String>,
}

/// Which nodes may take a slot, by the canary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CanaryGate {
    /// Any node.
    Anyone,
    /// Only the canary nodes; the others wait (`WaitingForCanary`).
    CanariesOnly,
    /// No node: the canary soaks until this instant.
    Soaking(Timestamp),
    /// No node but a retried one: the rollout is halted.
    Halted,
}

/// Where the rollout stands after [`advance`].
#[derive(Clone, Debug, PartialEq)]
pub struct CanaryVerdict {
    /// The new `status.rollout` (its `nextWindow` is left as it was).
    pub status: RolloutStatus,
    /// The version the nodes go to now: `target`, or `fromVersion` while rolling back.
    pub effective_target: String,
    /// Who may take a slot.
    pub gate: CanaryGate,
    /// The halt began in this pass (for the Event).
    pub halted_now: bool,
}

impl CanaryVerdict {
    /// Why the canary halted the rollout, while it is halted.
    pub fn halt(&self) -> Option<String> {
        is_halted(&self.status.phase).then(|| self.status.halted_by.clone().unwrap_or_default())
    }

    /// The news of a halt that began in this pass, for the policy's Event.
    pub fn halt_news(&self) -> Option<String> {
        if !self.halted_now {
            return None;
        }
        let why = self.status.halted_by.clone().unwrap_or_default();
        Some(match self.status.phase.as_str() {
            phase::ROLLING_BACK => format!(
                "{why}; rolling the canary nodes back to {}",
                self.effective_target
            ),
            _ => why,
        })
    }
}

/// Where a rollout to `target` guarded by `rules` stands now. `nodes` are the managed nodes in
/// name order; `previous` is `status.rollout` as last written.
pub fn advance(
    previous: Option<&RolloutStatus>,
    target: &str,
    rules: &CanaryRules,
    nodes: &[CanaryNode],
    now: Timestamp,
) -> CanaryVerdict {
    let mut status = match previous {
        Some(p) if p.target_version == target && !p.phase.is_empty() => p.clone(),
        _ => begin(previous, target, rules, nodes),
    };
    let was_halted = is_halted(&status.phase);
    // Each step may open the next (a zero soak goes straight on), at most once around.
    for _ in 0..4 {
        let before = status.phase.clone();
        step(&mut status, rules, nodes, now);
        if status.phase == before {
            break;
        }
    }
    let rolling_back = matches!(
        status.phase.as_str(),
        phase::ROLLING_BACK | phase::ROLLED_BACK
    );
    let effective_target = match (&status.from_version, rolling_back) {
        (Some(from), true) => from.clone(),
        _ => target.to_owned(),
    };
    CanaryVerdict {
        gate: gate_of(&status),
        halted_now: is_halted(&status.phase) && !was_halted,
        effective_target,
        status,
    }
}

/// The version the nodes of a policy acted on with `spec` go back to: `fromVersion` while the
/// recorded `rollout` is RollingBack or RolledBack for `spec.version`, else `None`. Never
/// while paused: the DaemonSet keeps the version it was applied with until the pause ends, and
/// the nodes must aim where their agents do, so a rollback decided during a pause waits for
/// its end like any other change.
pub fn rolling_back_to<'a>(
    rollout: Option<&'a RolloutStatus>,
    spec: &TenstorrentDriverPolicySpec,
) -> Option<&'a str> {
    let r = rollout.filter(|_| !spec.paused)?;
    let back = matches!(r.phase.as_str(), phase::ROLLING_BACK | phase::ROLLED_BACK);
    (back && r.target_version == spec.version)
        .then_some(r.from_version.as_deref())
        .flatten()
}

/// Whether a phase stops the rollout (Halted, RollingBack, RolledBack).
pub fn is_halted(p: &str) -> bool {
    matches!(p, phase::HALTED | phase::ROLLING_BACK | phase::ROLLED_BACK)
}

/// A rollout to `target` begins: the canary nodes are the first nodes not yet on it.
fn begin(
    previous: Option<&RolloutStatus>,
    target: &str,
    rules: &CanaryRules,
    nodes: &[CanaryNode],
) -> RolloutStatus {
    let behind: Vec<&CanaryNode> = nodes.iter().filter(|n| is_behind(n, target)).collect();
    // What the nodes run, not what the last rollout aimed at: that rollout may have failed and
    // been rolled back, and a rollback must never go to a version no node ran.
    let from_version = most_common_version(&behind);
    let mut status = RolloutStatus {
        target_version: target.to_owned(),
        from_version,
        phase: if behind.is_empty() {
            phase::ROLLING
        } else {
            phase::CANARY
        }
        .to_owned(),
        canary_nodes: Vec::new(),
        soak_until: None,
        halted_by: None,
        next_window: previous.and_then(|p| p.next_window.clone()),
    };
    refill(&mut status, rules, nodes);
    status
}

/// The node runs another version than `target`: a canary candidate.
fn is_behind(n: &CanaryNode, target: &str) -> bool {
    n.loaded.as_deref().is_some_and(|v| v != target)
}

/// Keeps the canary at `rules.count` nodes that can take their turn: a canary node that is not
/// Ready and has not started (a dead server chosen, or one that died before its turn) gives its
/// place to the next Ready node behind, in name order, so a dead node never stalls the fleet. A
/// canary node that started keeps its place (its failure halts the rollout), and one that left
/// the selection is not replaced.
fn refill(status: &mut RolloutStatus, rules: &CanaryRules, nodes: &[CanaryNode]) {
    let dead_before_start = |name: &String| {
        nodes
            .iter()
            .find(|n| &n.name == name)
            .is_some_and(|n| !n.node_ready && n.state == NodeState::Pending)
    };
    status.canary_nodes.retain(|c| !dead_before_start(c));
    let wanted = rules.count.saturating_sub(status.canary_nodes.len());
    let replacements: Vec<String> = nodes
        .iter()
        .filter(|n| is_behind(n, &status.target_version) && n.node_ready)
        .filter(|n| n.state != NodeState::Failed)
        .filter(|n| !status.canary_nodes.contains(&n.name))
        .take(wanted)
        .map(|n| n.name.clone())
        .collect();
    status.canary_nodes.extend(replacements);
}

fn most_common_version(nodes: &[&CanaryNode]) -> Option<String> {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for v in nodes.iter().filter_map(|n| n.loaded.as_deref()) {
        match counts.iter_mut().find(|(seen, _)| *seen == v) {
            Some((_, c)) => *c += 1,
            None => counts.push((v, 1)),
        }
    }
    counts
        .into_iter()
        .max_by_key(|(_, c)| *c)
        .map(|(v, _)| v.to_owned())
}

/// One step of the phase machine.
fn step(status: &mut RolloutStatus, rules: &CanaryRules, nodes: &[CanaryNode], now: Timestamp) {
    if status.phase == phase::CANARY {
        refill(status, rules, nodes);
    }
    let canaries: Vec<&CanaryNode> = nodes
        .iter()
        .filter(|n| status.canary_nodes.contains(&n.name))
        .collect();
    let target = status.target_version.clone();
    let settled = |n: &CanaryNode, version: &str| {
        n.state == NodeState::Done && n.agent_ready && n.loaded.as_deref() == Some(version)
    };
    match status.phase.as_str() {
        phase::CANARY if canaries.is_empty() => {
            // No node behind can be a canary yet (none is Ready): nobody starts until one is.
        }
        phase::CANARY => {
            if let Some(n) = canaries.iter().find(|n| n.state == NodeState::Failed) {
                halt(status, format!("canary node {} failed{}", n.name, why(n)));
            } else if canaries.iter().all(|n| settled(n, &target)) {
                status.phase = phase::SOAKING.to_owned();
                status.soak_until = Some(Time(add(now, rules.soak)));
            }
        }
        phase::SOAKING => {
            if let Some(n) = canaries.iter().find(|n| !settled(n, &target)) {
                let what = if n.state == NodeState::Failed {
                    "failed"
                } else {
                    "went unready"
                };
                halt(
                    status,
                    format!("canary node {} {what} during the soak{}", n.name, why(n)),
                );
            } else if status.soak_until.as_ref().is_none_or(|t| now >= t.0) {
                status.phase = phase::ROLLING.to_owned();
            }
        }
        phase::HALTED => {
            let culprit = culprit(status);
            let acted_on = culprit.as_ref().is_some_and(|c| {
                canaries
                    .iter()
                    .find(|n| &n.name == c)
                    .is_none_or(|n| n.retry_requested)
            });
            if rules.auto_rollback && status.from_version.is_some() {
                status.phase = phase::ROLLING_BACK.to_owned();
            } else if acted_on {
                status.phase = phase::CANARY.to_owned();
                status.halted_by = None;
                status.soak_until = None;
            }
        }
        phase::ROLLING_BACK => {
            let from = status.from_version.clone().unwrap_or_default();
            if canaries.iter().all(|n| settled(n, &from)) {
                status.phase = phase::ROLLED_BACK.to_owned();
            }
        }
        _ => {}
    }
}

fn halt(status: &mut RolloutStatus, message: String) {
    status.phase = phase::HALTED.to_owned();
    status.halted_by = Some(message);
    status.soak_until = None;
}

/// The canary node named in `halted_by` ("canary node NAME ...").
fn culprit(status: &RolloutStatus) -> Option<String> {
    let text = status.halted_by.as_deref()?.strip_prefix("canary node ")?;
    text.split_whitespace().next().map(str::to_owned)
}

fn why(n: &CanaryNode) -> String {
    n.why.as_ref().map(|w| format!(": {w}")).unwrap_or_default()
}

fn gate_of(status: &RolloutStatus) -> CanaryGate {
    match status.phase.as_str() {
        phase::CANARY | phase::ROLLING_BACK => CanaryGate::CanariesOnly,
        phase::SOAKING => CanaryGate::Soaking(
            status
                .soak_until
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        ),
        phase::HALTED | phase::ROLLED_BACK => CanaryGate::Halted,
        _ => CanaryGate::Anyone,
    }
}

fn add(now: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeState::*;

    fn rules(count: usize, soak_secs: u64, auto_rollback: bool) -> CanaryRules {
        CanaryRules {
            count,
            soak: Duration::from_secs(soak_secs),
            auto_rollback,
        }
    }

    fn node(name: &str, state: NodeState, loaded: &str, ready: bool) -> CanaryNode {
        CanaryNode {
            name: name.into(),
            state,
            loaded: Some(loaded.into()),
            agent_ready: ready,
            node_ready: true,
            retry_requested: false,
            why: None,
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    /// `n` nodes `n0..` on 2.7.0, all Done and Ready.
    fn fleet(n: usize) -> Vec<CanaryNode> {
        (0..n)
            .map(|i| node(&format!("n{i}"), Done, "2.7.0", true))
            .collect()
    }

    #[test]
    fn the_first_nodes_behind_are_the_canaries_and_only_they_start() {
        let mut nodes = fleet(4);
        nodes[0].loaded = Some("2.8.0".into());
        let v = advance(None, "2.8.0", &rules(2, 60, false), &nodes, at(0));
        assert_eq!(v.status.canary_nodes, ["n1", "n2"]);
        assert_eq!(v.status.phase, phase::CANARY);
        assert_eq!(v.status.from_version.as_deref(), Some("2.7.0"));
        assert_eq!(v.gate, CanaryGate::CanariesOnly);
        assert_eq!(v.effective_target, "2.8.0");
    }

    #[test]
    fn done_canaries_soak_then_the_rest_follow() {
        let mut nodes = fleet(3);
        let begun = advance(None, "2.8.0", &rules(1, 60, false), &nodes, at(0)).status;
        nodes[0] = node("n0", Done, "2.8.0", true);
        let soaking = advance(Some(&begun), "2.8.0", &rules(1, 60, false), &nodes, at(10));
        assert_eq!(soaking.status.phase, phase::SOAKING);
        assert_eq!(soaking.gate, CanaryGate::Soaking(at(70)));
        let still = advance(
            Some(&soaking.status),
            "2.8.0",
            &rules(1, 60, false),
            &nodes,
            at(69),
        );
        assert_eq!(still.status.phase, phase::SOAKING);
        let rolling = advance(
            Some(&still.status),
            "2.8.0",
            &rules(1, 60, false),
            &nodes,
            at(70),
        );
        assert_eq!(rolling.status.phase, phase::ROLLING);
        assert_eq!(rolling.gate, CanaryGate::Anyone);
    }

    #[test]
    fn a_canary_unready_during_the_soak_halts_and_the_halt_stays() {
        let mut nodes = fleet(3);
        nodes[0] = node("n0", Done, "2.8.0", true);
        let r = rules(1, 600, false);
        let soaking = advance(None, "2.8.0", &r, &fleet(3), at(0)).status;
        let soaking = advance(Some(&soaking), "2.8.0", &r, &nodes, at(1)).status;
        nodes[0].agent_ready = false;
        nodes[0].why = Some("2 of 4 devices bound".into());
        let halted = advance(Some(&soaking), "2.8.0", &r, &nodes, at(2));
        assert_eq!(halted.status.phase, phase::HALTED);
        assert!(halted.halted_now);
        assert_eq!(
            halted.status.halted_by.as_deref(),
            Some("canary node n0 went unready during the soak: 2 of 4 devices bound")
        );
        assert_eq!(halted.gate, CanaryGate::Halted);
        // Ready again by itself: still halted, until an admin retries the node.
        nodes[0].agent_ready = true;
        let stays = advance(Some(&halted.status), "2.8.0", &r, &nodes, at(3));
        assert_eq!(stays.status.phase, phase::HALTED);
        assert!(!stays.halted_now);
        nodes[0].retry_requested = true;
        let again = advance(Some(&stays.status), "2.8.0", &r, &nodes, at(4));
        assert_eq!(
            again.status.phase,
            phase::SOAKING,
            "the canary runs again, fresh soak"
        );
        assert_eq!(again.gate, CanaryGate::Soaking(at(604)));
    }

    #[test]
    fn a_failed_canary_with_auto_rollback_goes_back_to_the_previous_version() {
        let r = rules(1, 60, true);
        let begun = advance(None, "2.8.0", &r, &fleet(3), at(0)).status;
        let mut nodes = fleet(3);
        nodes[0] = node("n0", Failed, "2.8.0", false);
        let back = advance(Some(&begun), "2.8.0", &r, &nodes, at(5));
        assert_eq!(back.status.phase, phase::ROLLING_BACK);
        assert_eq!(back.effective_target, "2.7.0");
        assert_eq!(back.gate, CanaryGate::CanariesOnly);
        assert!(back.halted_now);
        nodes[0] = node("n0", Done, "2.7.0", true);
        let done = advance(Some(&back.status), "2.8.0", &r, &nodes, at(9));
        assert_eq!(done.status.phase, phase::ROLLED_BACK);
        assert_eq!(done.effective_target, "2.7.0");
        assert_eq!(done.gate, CanaryGate::Halted);
        assert!(
            done.status
                .halted_by
                .as_deref()
                .is_some_and(|h| h.starts_with("canary node n0 failed"))
        );
        // A new version begins a new rollout, from the version the fleet runs (not from 2.8.0,
        // the target that just failed).
        let next = advance(Some(&done.status), "2.9.0", &r, &nodes, at(20));
        assert_eq!(next.status.phase, phase::CANARY);
        assert_eq!(next.status.from_version.as_deref(), Some("2.7.0"));
    }

    #[test]
    fn a_second_failed_canary_rolls_back_to_what_the_fleet_runs() {
        let r = rules(1, 60, true);
        let fleet_on = |v: &str| -> Vec<CanaryNode> {
            (0..3)
                .map(|i| node(&format!("n{i}"), Done, v, true))
                .collect()
        };
        // 2.9.0 failed on its canary and was rolled back to 2.8.0.
        let mut nodes = fleet_on("2.8.0");
        let begun = advance(None, "2.9.0", &r, &nodes, at(0)).status;
        nodes[0] = node("n0", Failed, "2.9.0", false);
        let back = advance(Some(&begun), "2.9.0", &r, &nodes, at(1)).status;
        nodes[0] = node("n0", Done, "2.8.0", true);
        let rolled_back = advance(Some(&back), "2.9.0", &r, &nodes, at(2)).status;
        assert_eq!(rolled_back.phase, phase::ROLLED_BACK);
        // Then 2.9.1 fails on its canary too: back to 2.8.0, never to 2.9.0.
        let begun = advance(Some(&rolled_back), "2.9.1", &r, &nodes, at(3)).status;
        nodes[0] = node("n0", Failed, "2.9.1", false);
        let back = advance(Some(&begun), "2.9.1", &r, &nodes, at(4));
        assert_eq!(back.status.phase, phase::ROLLING_BACK);
        assert_eq!(back.effective_target, "2.8.0");
    }

    #[test]
    fn a_dead_node_is_never_the_canary_and_one_that_dies_before_its_turn_is_replaced() {
        let r = rules(1, 0, false);
        let mut nodes = fleet(3);
        nodes[0].node_ready = false;
        let begun = advance(None, "2.8.0", &r, &nodes, at(0));
        assert_eq!(begun.status.canary_nodes, ["n1"], "n0 is down");
        // n1 dies before it starts: n2 takes its place.
        nodes[1].node_ready = false;
        nodes[1].state = Pending;
        let replaced = advance(Some(&begun.status), "2.8.0", &r, &nodes, at(1));
        assert_eq!(replaced.status.canary_nodes, ["n2"]);
        assert_eq!(replaced.gate, CanaryGate::CanariesOnly);
        // Every node down: nobody is the canary and nobody starts until one is back.
        nodes[2].node_ready = false;
        nodes[2].state = Pending;
        let none = advance(Some(&replaced.status), "2.8.0", &r, &nodes, at(2));
        assert!(none.status.canary_nodes.is_empty());
        assert_eq!(none.status.phase, phase::CANARY);
        assert_eq!(none.gate, CanaryGate::CanariesOnly);
        // A canary that started keeps its place even if its node goes down.
        nodes[0].node_ready = true;
        let back = advance(Some(&none.status), "2.8.0", &r, &nodes, at(3));
        assert_eq!(back.status.canary_nodes, ["n0"]);
        nodes[0].state = Draining;
        nodes[0].node_ready = false;
        let kept = advance(Some(&back.status), "2.8.0", &r, &nodes, at(4));
        assert_eq!(kept.status.canary_nodes, ["n0"]);
    }

    #[test]
    fn a_skipped_culprit_lets_the_canary_go_on() {
        let r = rules(2, 0, false);
        let begun = advance(None, "2.8.0", &r, &fleet(4), at(0)).status;
        let mut nodes = fleet(4);
        nodes[0] = node("n0", Failed, "2.7.0", false);
        nodes[1] = node("n1", Done, "2.8.0", true);
        let halted = advance(Some(&begun), "2.8.0", &r, &nodes, at(1));
        assert_eq!(halted.status.phase, phase::HALTED);
        nodes.remove(0);
        let on = advance(Some(&halted.status), "2.8.0", &r, &nodes, at(2));
        assert_eq!(
            on.status.phase,
            phase::ROLLING,
            "n1 is Done and the soak is 0 s"
        );
    }

    #[test]
    fn first_installs_make_no_canary() {
        let mut nodes = fleet(3);
        for n in &mut nodes {
            n.loaded = None;
        }
        let v = advance(None, "2.7.0", &rules(1, 60, false), &nodes, at(0));
        assert_eq!(v.status.phase, phase::ROLLING);
        assert_eq!(v.gate, CanaryGate::Anyone);
    }

    #[test]
    fn a_fleet_already_on_the_target_needs_no_canary() {
        let nodes: Vec<CanaryNode> = (0..2)
            .map(|i| node(&format!("n{i}"), Done, "2.8.0", true))
            .collect();
        let v = advance(None, "2.8.0", &rules(1, 60, false), &nodes, at(0));
        assert_eq!(v.status.phase, phase::ROLLING);
        assert!(v.status.canary_nodes.is_empty());
    }
}
