//! The policy's status as a pure function of the node transitions of one reconcile and the
//! previous status: per-node entries, summary counts and conditions.
//!
//! Size at fleet scale: node entries carry no defaults and nothing the state already says
//! (`installMode` only when `host`; `targetVersion` only while a node is in flight or Failed;
//! Pending nodes waiting for a slot carry only that reason). Up to
//! [`listing::COMPACT_THRESHOLD`] matched nodes every node is listed. Past it, Done nodes and
//! Pending nodes waiting for a slot are left out: what is listed is what is happening or needs
//! attention (in flight, Failed, paused or halted, host-managed, conflicting). At any size the
//! entries listed take at most [`listing::NODE_ENTRIES_BYTES`] (a message is at most
//! [`ttdp_api::driver::v1alpha1::MAX_NODE_MESSAGE_CHARS`] characters): past that, Failed nodes
//! come first, then those in flight, then the rest. `summary` still counts every node and
//! `summary.nodesOmitted` says how many are not listed. `kubectl tt driver nodes` shows every
//! node, from the node labels (`driver.tenstorrent.com/kmd-version`).
//!
//! Why a limit: every write stores the whole object in etcd and sends it to every watcher, and
//! the controller spaces its writes by the entries listed (`WRITE_SPACING_PER_ENTRY` in the
//! status writer), so listing every node of a large fleet makes each write large and the
//! hand-off from one node to the next slow; listing only the nodes in flight keeps each write
//! small (`docs/benchmarks.md` has the figures).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::SignedDuration;
use ttdp_api::condition::{condition, set_condition};
use ttdp_api::driver::v1alpha1::{NextKernels, NodeStartLoad, Summary, condition as cond};
use ttdp_api::names::install_mode;
use ttdp_api::{NodeState, NodeStatus, TenstorrentDriverPolicyStatus};

use crate::pure::next_kernels::kernels_ready;
use crate::pure::transition::NodeTransition;

mod listing;

use listing::{bounded_message, compact, listed_entries};

/// One matched node's outcome of this reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport {
    /// The node.
    pub name: String,
    /// Where it goes.
    pub transition: NodeTransition,
    /// The loaded version the node reports (its `kmd-version` label).
    pub current_version: Option<String>,
    /// The loaded module's parameters its agent reports (sysfs), if any.
    pub loaded_parameters: Option<String>,
    /// The commit the loaded module was built from, as its agent reports, if known.
    pub source_commit: Option<String>,
    /// The udev rule file on the node, as its agent reports, if any.
    pub udev_rule: Option<String>,
    /// The node's other installed kernels, as its agent prepared them, if it reports any.
    pub next_kernels: Option<NextKernels>,
    /// Who signed the loaded module, as its agent reports, if signed.
    pub module_signer: Option<String>,
    /// How the module came up at the agent's start, as it reports, if it says.
    pub start_load: Option<NodeStartLoad>,
    /// `container` or `host`, as the node's agent labelled it.
    pub install_mode: Option<String>,
}

/// A node that changed state in this reconcile (for Events and metrics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateChange {
    /// The node.
    pub node: String,
    /// The previous state (`None`: new node).
    pub from: Option<NodeState>,
    /// The new state.
    pub to: NodeState,
    /// The new state's reason.
    pub reason: Option<String>,
    /// The new state's message.
    pub message: Option<String>,
    /// How long the node spent in `from`, when known.
    pub time_in_previous: Option<SignedDuration>,
    /// When reaching Done: how long the whole upgrade took.
    pub upgrade_total: Option<SignedDuration>,
}

/// Policy-level facts for the conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyFacts {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `spec.version`.
    pub target_version: String,
    /// `spec.paused`.
    pub paused: bool,
    /// Why the spec cannot be acted on, if so.
    pub invalid_spec: Option<String>,
    /// The effective `maxUnavailable`.
    pub max_unavailable: usize,
    /// What kept the controller from reconciling the policy (applying its DaemonSet, reaching
    /// an object it needs), if anything, until a reconcile succeeds again.
    pub failure: Option<ReconcileFailure>,
    /// The canary halted the rollout: which node and why (`status.rollout.haltedBy`).
    pub canary_halt: Option<String>,
}

/// A failure to reconcile a policy, as its `Reconciled` condition and Event show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcileFailure {
    /// UpperCamelCase reason ([`crate::Error::reason`]).
    pub reason: String,
    /// What failed, in the API server's words ([`crate::Error::user_message`]).
    pub message: String,
}

impl ReconcileFailure {
    /// The failure `err` reports.
    pub fn of(err: &crate::Error) -> Self {
        Self {
            reason: err.reason().to_owned(),
            message: err.user_message(),
        }
    }
}

/// Every node entry by name: the controller's memory of recorded states. Names and entries are
/// shared, so a pass copies the map, not the entries.
pub type NodeEntries = BTreeMap<Arc<str>, Arc<NodeStatus>>;

/// The built status and the state changes in it.
#[derive(Clone, Debug, PartialEq)]
pub struct BuiltStatus {
    /// The status to write, without its node entries (see [`BuiltStatus::listed`]).
    pub status: TenstorrentDriverPolicyStatus,
    /// Every node entry, uncompacted.
    pub all_nodes: NodeEntries,
    /// Nodes whose state changed.
    pub changes: Vec<StateChange>,
    /// The nodes whose entry differs from the recorded one (new nodes included), in name order.
    pub changed: Vec<Arc<str>>,
    /// Whether the entries are for the recorded nodes: none joined, none left.
    pub same_nodes: bool,
}

impl BuiltStatus {
    /// The node entries `status.nodes` lists (see [`listing::COMPACT_THRESHOLD`]).
    pub fn listed(&self) -> Vec<NodeStatus> {
        compact(&self.all_nodes)
    }

    /// The status with its node entries.
    pub fn whole(&self) -> TenstorrentDriverPolicyStatus {
        TenstorrentDriverPolicyStatus {
            nodes: self.listed(),
            ..self.status.clone()
        }
    }
}

/// Condition reasons.
pub mod reasons {
    /// Every matched node is Done or HostManaged.
    pub const ALL_NODES_READY: &str = "AllNodesReady";
    /// Nodes are still being installed or upgraded.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// Every matched node is owned by an older policy: this one manages none.
    pub const ALL_NODES_IN_CONFLICT: &str = "AllNodesInConflict";
    /// Nothing left to do.
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    /// Nodes failed.
    pub const NODES_FAILED: &str = "NodesFailed";
    /// More nodes failed than `maxUnavailable`: no new node starts.
    pub const ROLLOUT_HALTED: &str = "RolloutHalted";
    /// No node failed.
    pub const NO_FAILURES: &str = "NoFailures";
    /// `spec.paused` is true.
    pub const PAUSED: &str = "PausedBySpec";
    /// `spec.paused` is false.
    pub const NOT_PAUSED: &str = "NotPaused";
    /// The spec cannot be acted on.
    pub const SPEC_INVALID: &str = "SpecInvalid";
    /// The spec is valid.
    pub const SPEC_VALID: &str = "SpecValid";
    /// The last reconcile applied the DaemonSet and reached every object it needed.
    pub const RECONCILED: &str = "Reconciled";
}

/// Whether more nodes failed than `maxUnavailable` allows: no new node starts.
pub fn is_halted(failed: usize, max_unavailable: usize) -> bool {
    failed > max_unavailable
}

/// Builds the status from the reports of every matched node (any order) and the previous
/// status and entries: the nodes not reported leave it.
pub fn build_status(
    facts: &PolicyFacts,
    previous: &TenstorrentDriverPolicyStatus,
    recorded: &NodeEntries,
    mut reports: Vec<NodeReport>,
    now: &Time,
) -> BuiltStatus {
    // In name order: the state changes are reported in that order.
    if !reports.is_sorted_by(|a, b| a.name <= b.name) {
        reports.sort_by(|a, b| a.name.cmp(&b.name));
    }
    let kept: NodeEntries = reports
        .iter()
        .filter_map(|r| recorded.get_key_value(r.name.as_str()))
        .map(|(name, entry)| (name.clone(), entry.clone()))
        .collect();
    let left = kept.len() != recorded.len();
    let mut built = update_status(facts, previous, &kept, reports, now);
    built.same_nodes &= !left;
    built
}

/// The status after this pass's reports, for the nodes that may have changed: the other
/// entries stay as `recorded`.
pub fn update_status(
    facts: &PolicyFacts,
    previous: &TenstorrentDriverPolicyStatus,
    recorded: &NodeEntries,
    reports: Vec<NodeReport>,
    now: &Time,
) -> BuiltStatus {
    let mut all_nodes = recorded.clone();
    let mut changes = Vec::new();
    let mut changed = Vec::new();
    let mut same_nodes = true;
    for report in reports {
        let prev = all_nodes.get_key_value(report.name.as_str());
        let (entry, change) =
            node_entry(prev.map(|(_, e)| &**e), report, &facts.target_version, now);
        let key = match prev {
            Some((_, e)) if **e == entry => continue,
            Some((key, _)) => key.clone(),
            None => {
                same_nodes = false;
                Arc::from(entry.name.as_str())
            }
        };
        changes.extend(change);
        changed.push(key.clone());
        all_nodes.insert(key, Arc::new(entry));
    }
    changed.sort_unstable();
    let summary = summarize(&all_nodes);
    let mut conditions = previous.conditions.clone();
    for c in conditions_for(facts, &summary, &all_nodes, now) {
        set_condition(&mut conditions, c);
    }
    BuiltStatus {
        status: TenstorrentDriverPolicyStatus {
            observed_generation: facts.generation,
            conditions,
            summary: Some(summary),
            nodes: Vec::new(),
            rollout: previous.rollout.clone(),
        },
        all_nodes,
        changes,
        changed,
        same_nodes,
    }
}

fn node_entry(
    prev: Option<&NodeStatus>,
    report: NodeReport,
    target: &str,
    now: &Time,
) -> (NodeStatus, Option<StateChange>) {
    let t = report.transition;
    let prev_state = prev.map(|p| p.state);
    let changed = prev_state != Some(t.state);
    // A Failed node keeps the reason it failed with until something new is known.
    let (reason, message) = match (t.reason, prev) {
        (None, Some(p)) if !changed && t.state == NodeState::Failed => {
            (p.reason.clone(), p.message.clone())
        }
        (reason, _) => (reason, t.message),
    };
    let last_transition_time = match prev {
        Some(p) if !changed => p.last_transition_time.clone(),
        _ => Some(now.clone()),
    };
    let was_in_flight = prev_state.is_some_and(NodeState::is_in_flight);
    let phase_start_time = if t.state.is_in_flight() {
        match prev {
            Some(p) if was_in_flight => p.phase_start_time.clone().or_else(|| Some(now.clone())),
            _ => Some(now.clone()),
        }
    } else {
        None
    };
    let prev_attempts = prev.and_then(|p| p.attempts).unwrap_or(0);
    let attempts = match t.state {
        NodeState::Failed if changed => Some(prev_attempts + 1),
        NodeState::Done | NodeState::HostManaged | NodeState::Conflict => None,
        _ => (prev_attempts > 0).then_some(prev_attempts),
    };
    let entry = NodeStatus {
        name: report.name,
        state: t.state,
        current_version: report.current_version,
        target_version: (t.state.is_in_flight() || t.state == NodeState::Failed)
            .then(|| target.to_owned()),
        install_mode: report
            .install_mode
            .filter(|m| m.as_str() != install_mode::CONTAINER),
        reason,
        message: message.map(bounded_message),
        last_transition_time,
        phase_start_time,
        attempts,
        loaded_parameters: report.loaded_parameters,
        source_commit: report.source_commit,
        udev_rule: report.udev_rule,
        next_kernels: report.next_kernels,
        module_signer: report.module_signer,
        start_load: report.start_load,
    };
    let change = changed.then(|| StateChange {
        node: entry.name.clone(),
        from: prev_state,
        to: entry.state,
        reason: entry.reason.clone(),
        message: entry.message.clone(),
        time_in_previous: prev
            .and_then(|p| p.last_transition_time.as_ref())
            .map(|since| now.0.duration_since(since.0)),
        upgrade_total: (entry.state == NodeState::Done)
            .then(|| prev.and_then(|p| p.phase_start_time.as_ref()))
            .flatten()
            .map(|since| now.0.duration_since(since.0)),
    });
    (entry, change)
}

/// Counts of `nodes` by state, and how many `status.nodes` leaves out (see [`compact`]).
fn summarize(nodes: &NodeEntries) -> Summary {
    let mut s = Summary {
        matched: count(nodes.len()),
        ..Summary::default()
    };
    for n in nodes.values() {
        match n.state {
            NodeState::Done => s.up_to_date += 1,
            NodeState::Pending => s.pending += 1,
            NodeState::Failed => s.failed += 1,
            NodeState::HostManaged => s.host_managed += 1,
            NodeState::Conflict => s.conflicts += 1,
            NodeState::Cordoning
            | NodeState::Draining
            | NodeState::Upgrading
            | NodeState::Uncordoning => s.in_progress += 1,
        }
    }
    s.nodes_omitted = count(nodes.len() - listed_entries(nodes).len());
    s
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The policy's conditions: each from the facts and the summary, stamped with the generation
/// and `now` (a condition's time moves only when its status does, see [`set_condition`]).
fn conditions_for(
    facts: &PolicyFacts,
    s: &Summary,
    nodes: &NodeEntries,
    now: &Time,
) -> Vec<Condition> {
    let rollup = Rollup::of(facts, s, nodes);
    [
        (cond::INVALID_SPEC, rollup.invalid_spec()),
        (cond::RECONCILED, rollup.reconciled()),
        (cond::READY, rollup.ready()),
        (cond::PROGRESSING, rollup.progressing()),
        (cond::DEGRADED, rollup.degraded()),
        (cond::PAUSED, rollup.paused()),
        (cond::KERNELS_READY, {
            let (status, reason, message) = kernels_ready(&facts.target_version, nodes);
            verdict(status, reason, message)
        }),
    ]
    .into_iter()
    .map(|(type_, (status, reason, message))| {
        condition(
            type_,
            status,
            &reason,
            message,
            facts.generation,
            now.clone(),
        )
    })
    .collect()
}

/// A condition's status, reason and message.
type Verdict = (bool, String, String);

fn verdict(status: bool, reason: &str, message: impl Into<String>) -> Verdict {
    (status, reason.to_owned(), message.into())
}

/// What the conditions are decided from.
struct Rollup<'a> {
    facts: &'a PolicyFacts,
    s: &'a Summary,
    /// "n/m nodes on V (or host-managed), ..." for the messages.
    progress: String,
    halted: bool,
    all_ready: bool,
    /// The first few Failed nodes, with their reasons.
    failed_names: Vec<String>,
}

impl<'a> Rollup<'a> {
    fn of(facts: &'a PolicyFacts, s: &'a Summary, nodes: &NodeEntries) -> Self {
        let managed = s.matched - s.conflicts;
        let ready_nodes = s.up_to_date + s.host_managed;
        let progress = format!(
            "{ready_nodes}/{managed} nodes on {} (or host-managed), {} in progress, {} pending, {} failed",
            facts.target_version, s.in_progress, s.pending, s.failed
        );
        let failed_names = nodes
            .values()
            .filter(|n| n.state == NodeState::Failed)
            .take(5)
            .map(|n| match &n.reason {
                Some(r) => format!("{} ({r})", n.name),
                None => n.name.clone(),
            })
            .collect();
        Self {
            facts,
            s,
            progress,
            halted: is_halted(
                usize::try_from(s.failed).unwrap_or(0),
                facts.max_unavailable,
            ),
            all_ready: ready_nodes == managed,
            failed_names,
        }
    }

    fn invalid_spec(&self) -> Verdict {
        match &self.facts.invalid_spec {
            Some(msg) => verdict(true, reasons::SPEC_INVALID, msg.clone()),
            None => verdict(false, reasons::SPEC_VALID, ""),
        }
    }

    fn reconciled(&self) -> Verdict {
        match &self.facts.failure {
            Some(f) => verdict(false, &f.reason, f.message.clone()),
            None => verdict(true, reasons::RECONCILED, ""),
        }
    }

    fn ready(&self) -> Verdict {
        let (facts, progress) = (self.facts, &self.progress);
        if facts.invalid_spec.is_some() {
            verdict(
                false,
                reasons::SPEC_INVALID,
                "the spec is invalid; see the InvalidSpec condition",
            )
        } else if let Some(f) = &facts.failure {
            verdict(
                false,
                &f.reason,
                format!("{progress}; see the Reconciled condition"),
            )
        } else if let Some(halt) = &facts.canary_halt {
            verdict(
                false,
                reasons::ROLLOUT_HALTED,
                format!("{progress}; halted by the canary: {halt}"),
            )
        } else if self.s.conflicts > 0 && self.s.matched == self.s.conflicts {
            verdict(
                false,
                reasons::ALL_NODES_IN_CONFLICT,
                format!(
                    "all {} matched nodes are managed by older policies (see status.nodes); this policy manages none: make the selectors disjoint",
                    self.s.conflicts
                ),
            )
        } else if self.all_ready {
            verdict(true, reasons::ALL_NODES_READY, progress.clone())
        } else if self.s.failed > 0 {
            verdict(false, reasons::NODES_FAILED, progress.clone())
        } else {
            verdict(false, reasons::ROLLING_OUT, progress.clone())
        }
    }

    fn progressing(&self) -> Verdict {
        let (facts, s) = (self.facts, self.s);
        let work_left = s.pending + s.in_progress > 0;
        let halted = self.halted || facts.canary_halt.is_some();
        let may_start = !facts.paused && !halted && facts.invalid_spec.is_none();
        if s.in_progress > 0 || (work_left && may_start) {
            verdict(true, reasons::ROLLING_OUT, self.progress.clone())
        } else if work_left && facts.paused {
            verdict(
                false,
                reasons::PAUSED,
                "paused; set spec.paused=false to continue",
            )
        } else if work_left && halted {
            verdict(false, reasons::ROLLOUT_HALTED, self.progress.clone())
        } else {
            verdict(false, reasons::ROLLOUT_COMPLETE, self.progress.clone())
        }
    }

    fn degraded(&self) -> Verdict {
        let (failed, names) = (self.s.failed, self.failed_names.join(", "));
        if let Some(halt) = &self.facts.canary_halt {
            verdict(
                true,
                reasons::ROLLOUT_HALTED,
                format!(
                    "halted by the canary: {halt}; retry or skip that node (kubectl tt driver retry|skip), or change spec.version"
                ),
            )
        } else if failed == 0 {
            verdict(false, reasons::NO_FAILURES, "")
        } else if self.halted {
            let max = self.facts.max_unavailable;
            verdict(
                true,
                reasons::ROLLOUT_HALTED,
                format!(
                    "{failed} nodes failed, more than maxUnavailable {max}: no new node starts until they recover or kubectl tt driver retry; failed: {names}"
                ),
            )
        } else {
            verdict(
                true,
                reasons::NODES_FAILED,
                format!("{failed} nodes failed and are retried with back-off: {names}"),
            )
        }
    }

    fn paused(&self) -> Verdict {
        if self.facts.paused {
            verdict(
                true,
                reasons::PAUSED,
                "spec.paused is true: no node starts a new step",
            )
        } else {
            verdict(false, reasons::NOT_PAUSED, "")
        }
    }
}

/// How many node entries are in each state at each loaded version ("none" when none is), for
/// the `ttdp_nodes` gauge.
pub fn node_counts(all: &NodeEntries) -> BTreeMap<(NodeState, String), i64> {
    let mut counts = BTreeMap::new();
    for n in all.values() {
        let version = n.current_version.clone().unwrap_or_else(|| "none".into());
        *counts.entry((n.state, version)).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::listing::{COMPACT_THRESHOLD, entry_bytes};
    use super::*;
    use crate::pure::transition::reasons as tr;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + secs).unwrap())
    }

    fn facts() -> PolicyFacts {
        PolicyFacts {
            generation: Some(3),
            target_version: "2.8.0".into(),
            paused: false,
            invalid_spec: None,
            max_unavailable: 1,
            failure: None,
            canary_halt: None,
        }
    }

    fn report(name: &str, state: NodeState, version: Option<&str>) -> NodeReport {
        NodeReport {
            name: name.into(),
            transition: NodeTransition {
                state,
                reason: None,
                message: None,
                actions: vec![],
            },
            current_version: version.map(str::to_owned),
            install_mode: Some("container".into()),
            loaded_parameters: None,
            source_commit: None,
            udev_rule: None,
            next_kernels: None,
            module_signer: None,
            start_load: None,
        }
    }

    /// The status built after `previous` (None: the first).
    fn build(reports: Vec<NodeReport>, previous: Option<&BuiltStatus>, now: i64) -> BuiltStatus {
        match previous {
            Some(p) => build_status(&facts(), &p.status, &p.all_nodes, reports, &at(now)),
            None => build_status(
                &facts(),
                &Default::default(),
                &NodeEntries::new(),
                reports,
                &at(now),
            ),
        }
    }

    fn cond<'a>(s: &'a TenstorrentDriverPolicyStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    /// What the agents report of their other kernels, start loads and signers lands in the
    /// node entries, and `KernelsReady` follows the kernels: False naming the one without a
    /// module, True once it has one (the move a status transition, with its time).
    #[test]
    fn node_kernels_reach_the_entries_and_the_kernels_ready_condition() {
        use ttdp_api::agent_report::{KernelModuleState, KernelReadiness};
        let kernels = |state| {
            NextKernels::of_report(&[KernelReadiness {
                release: "6.1.0-58-amd64".into(),
                state,
                reason: Some("HeadersMissing".into()),
                message: None,
            }])
        };
        let mut failing = report("n1", NodeState::Done, Some("2.8.0"));
        failing.next_kernels = kernels(KernelModuleState::Failed);
        failing.module_signer = Some("ttdp signing key".into());
        failing.start_load = Some(NodeStartLoad {
            cache_hit: true,
            ready_after_ms: 2300,
        });
        let b1 = build(vec![failing.clone()], None, 0);
        let c = cond(&b1.status, "KernelsReady");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "NextKernelWithoutDriver")
        );
        assert_eq!(
            c.message,
            "1 node would boot without tt-kmd 2.8.0: kernel 6.1.0-58-amd64 on n1 (HeadersMissing)"
        );
        let n1 = &b1.listed()[0];
        assert_eq!(n1.next_kernels, kernels(KernelModuleState::Failed));
        assert_eq!(n1.module_signer.as_deref(), Some("ttdp signing key"));
        assert_eq!(n1.start_load.map(|l| l.ready_after_ms), Some(2300));
        failing.next_kernels = kernels(KernelModuleState::Ready);
        let b2 = build(vec![failing], Some(&b1), 60);
        let c = cond(&b2.status, "KernelsReady");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "NextKernelsReady")
        );
        assert_eq!(c.last_transition_time, at(60));
        assert_eq!(b2.changed.len(), 1, "the entry changed with its kernels");
    }

    #[test]
    fn summary_counts_and_ready_when_all_done_or_host_managed() {
        let b = build(
            vec![
                report("n1", NodeState::Done, Some("2.8.0")),
                report("n2", NodeState::HostManaged, Some("2.6.0")),
                report("n3", NodeState::Conflict, None),
            ],
            None,
            0,
        );
        let s = b.status.summary.clone().unwrap();
        assert_eq!(
            (s.matched, s.up_to_date, s.host_managed, s.conflicts),
            (3, 1, 1, 1)
        );
        assert_eq!(cond(&b.status, "Ready").status, "True");
        assert_eq!(cond(&b.status, "Progressing").status, "False");
        assert_eq!(cond(&b.status, "Degraded").status, "False");
        assert_eq!(cond(&b.status, "Paused").status, "False");
        assert_eq!(cond(&b.status, "InvalidSpec").status, "False");
        assert_eq!(b.status.observed_generation, Some(3));
        let n1 = &b.listed()[0];
        assert_eq!(n1.current_version.as_deref(), Some("2.8.0"));
        assert_eq!(
            n1.install_mode, None,
            "container is the default and left out"
        );
        assert_eq!(
            n1.target_version, None,
            "a Done node's target is spec.version"
        );
    }

    #[test]
    fn transition_time_moves_only_on_state_change_and_conditions_do_not_flap() {
        let b1 = build(
            vec![
                report("n1", NodeState::Pending, Some("2.7.0")),
                report("n2", NodeState::Pending, Some("2.7.0")),
            ],
            None,
            0,
        );
        let b2 = build(
            vec![
                report("n1", NodeState::Cordoning, Some("2.7.0")),
                report("n2", NodeState::Pending, Some("2.7.0")),
            ],
            Some(&b1),
            10,
        );
        let n1 = &b2.listed()[0];
        let n2 = &b2.listed()[1];
        assert_eq!(n1.last_transition_time, Some(at(10)));
        assert_eq!(n1.phase_start_time, Some(at(10)));
        assert_eq!(n1.target_version.as_deref(), Some("2.8.0"));
        assert_eq!(n2.last_transition_time, Some(at(0)));
        assert_eq!(b2.changes.len(), 1);
        assert_eq!(b2.changes[0].from, Some(NodeState::Pending));
        assert_eq!(
            b2.changes[0].time_in_previous,
            Some(SignedDuration::from_secs(10))
        );
        let progressing = cond(&b2.status, "Progressing");
        assert_eq!(progressing.status, "True");
        let since = progressing.last_transition_time.clone();
        let b3 = build(
            vec![
                report("n1", NodeState::Draining, Some("2.7.0")),
                report("n2", NodeState::Pending, Some("2.7.0")),
            ],
            Some(&b2),
            20,
        );
        assert_eq!(
            b3.listed()[0].phase_start_time,
            Some(at(10)),
            "upgrade start kept"
        );
        assert_eq!(
            cond(&b3.status, "Progressing").last_transition_time,
            since,
            "no flapping"
        );
        let b4 = build(
            vec![
                report("n1", NodeState::Done, Some("2.8.0")),
                report("n2", NodeState::Pending, Some("2.7.0")),
            ],
            Some(&b3),
            50,
        );
        assert_eq!(
            b4.changes[0].upgrade_total,
            Some(SignedDuration::from_secs(40))
        );
        assert_eq!(b4.listed()[0].phase_start_time, None);
        assert_eq!(cond(&b4.status, "Ready").status, "False");
        assert_eq!(cond(&b4.status, "Progressing").status, "True");
    }

    #[test]
    fn each_report_finds_its_recorded_entry_whatever_the_order_and_gaps() {
        let first = build(
            vec![
                report("n1", NodeState::Done, Some("2.8.0")),
                report("n3", NodeState::Draining, Some("2.7.0")),
                report("n4", NodeState::Pending, Some("2.7.0")),
            ],
            None,
            0,
        );
        // n1 left, n2 and n5 joined; given out of name order.
        let reports = vec![
            report("n5", NodeState::Pending, Some("2.7.0")),
            report("n3", NodeState::Draining, Some("2.7.0")),
            report("n2", NodeState::Pending, Some("2.7.0")),
            report("n4", NodeState::Cordoning, Some("2.7.0")),
        ];
        let empty = TenstorrentDriverPolicyStatus::default();
        let b = build_status(&facts(), &empty, &first.all_nodes, reports, &at(10));
        let listed = b.listed();
        let names: Vec<&str> = listed.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["n2", "n3", "n4", "n5"]);
        let since = |n: &str| b.all_nodes[n].last_transition_time.clone();
        assert_eq!(since("n3"), Some(at(0)), "n3 kept its state");
        assert_eq!(
            (since("n2"), since("n4"), since("n5")),
            (Some(at(10)), Some(at(10)), Some(at(10)))
        );
        let changed: Vec<(&str, Option<NodeState>)> = b
            .changes
            .iter()
            .map(|c| (c.node.as_str(), c.from))
            .collect();
        assert_eq!(
            changed,
            [("n2", None), ("n4", Some(NodeState::Pending)), ("n5", None)]
        );
    }

    #[test]
    fn failures_count_attempts_keep_their_reason_and_degrade_then_halt() {
        let mut failing = report("n1", NodeState::Failed, Some("2.7.0"));
        failing.transition.reason = Some("DrainTimeout".into());
        failing.transition.message =
            Some("default/web-0 blocked by PodDisruptionBudget default/web".into());
        let b1 = build(
            vec![failing, report("n2", NodeState::Pending, Some("2.7.0"))],
            None,
            0,
        );
        let n1 = &b1.listed()[0];
        assert_eq!(n1.attempts, Some(1));
        assert_eq!(n1.target_version.as_deref(), Some("2.8.0"));
        let degraded = cond(&b1.status, "Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", reasons::NODES_FAILED)
        );
        assert!(
            degraded.message.contains("n1 (DrainTimeout)"),
            "{}",
            degraded.message
        );
        // Still Failed without a new reason: the old one stays.
        let b2 = build(
            vec![
                report("n1", NodeState::Failed, Some("2.7.0")),
                report("n2", NodeState::Failed, Some("2.7.0")),
            ],
            Some(&b1),
            10,
        );
        assert_eq!(b2.listed()[0].reason.as_deref(), Some("DrainTimeout"));
        assert_eq!(b2.listed()[0].attempts, Some(1));
        let degraded = cond(&b2.status, "Degraded");
        assert_eq!(degraded.reason, reasons::ROLLOUT_HALTED);
        // A retry keeps counting attempts; Done clears them.
        let b3 = build(
            vec![report("n1", NodeState::Cordoning, Some("2.7.0"))],
            Some(&b2),
            20,
        );
        assert_eq!(b3.listed()[0].attempts, Some(1));
        let b4 = build(
            vec![report("n1", NodeState::Failed, Some("2.7.0"))],
            Some(&b3),
            30,
        );
        assert_eq!(b4.listed()[0].attempts, Some(2));
        let b5 = build(
            vec![report("n1", NodeState::Done, Some("2.8.0"))],
            Some(&b4),
            40,
        );
        assert_eq!(b5.listed()[0].attempts, None);
    }

    #[test]
    fn a_policy_whose_every_node_is_in_conflict_is_not_ready() {
        let b = build_status(
            &facts(),
            &Default::default(),
            &NodeEntries::new(),
            vec![
                report("n1", NodeState::Conflict, Some("2.7.0")),
                report("n2", NodeState::Conflict, Some("2.7.0")),
            ],
            &at(0),
        );
        let ready = cond(&b.status, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", reasons::ALL_NODES_IN_CONFLICT)
        );
        assert!(ready.message.contains("make the selectors disjoint"));
    }

    #[test]
    fn paused_and_invalid_specs_show_in_conditions() {
        let mut f = facts();
        f.paused = true;
        let b = build_status(
            &f,
            &Default::default(),
            &NodeEntries::new(),
            vec![report("n1", NodeState::Pending, Some("2.7.0"))],
            &at(0),
        );
        assert_eq!(cond(&b.status, "Paused").status, "True");
        assert_eq!(cond(&b.status, "Progressing").reason, reasons::PAUSED);
        let mut f = facts();
        f.invalid_spec = Some("spec.upgradePolicy.drain.podSelectorLabel: bad".into());
        let b = build_status(
            &f,
            &Default::default(),
            &NodeEntries::new(),
            vec![report("n1", NodeState::Done, Some("2.8.0"))],
            &at(0),
        );
        let invalid = cond(&b.status, "InvalidSpec");
        assert_eq!(invalid.status, "True");
        assert!(invalid.message.contains("podSelectorLabel"));
        assert_eq!(cond(&b.status, "Ready").status, "False");
    }

    #[test]
    fn a_reconcile_failure_shows_in_the_reconciled_condition_and_holds_ready_back() {
        let done = vec![report("n1", NodeState::Done, Some("2.8.0"))];
        let b = build_status(
            &facts(),
            &Default::default(),
            &NodeEntries::new(),
            done.clone(),
            &at(0),
        );
        assert_eq!(cond(&b.status, "Reconciled").status, "True");
        assert_eq!(cond(&b.status, "Ready").status, "True");
        let mut f = facts();
        f.failure = Some(ReconcileFailure {
            reason: "DaemonSetApplyFailed".into(),
            message:
                "apply daemonset ttdp-system/ttdrv-fleet failed: it is invalid (HTTP 422 Invalid)"
                    .into(),
        });
        let failing = build_status(&f, &b.status, &b.all_nodes, done.clone(), &at(5));
        let reconciled = cond(&failing.status, "Reconciled");
        assert_eq!(
            (reconciled.status.as_str(), reconciled.reason.as_str()),
            ("False", "DaemonSetApplyFailed")
        );
        assert!(reconciled.message.contains("HTTP 422"), "{reconciled:?}");
        let ready = cond(&failing.status, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "DaemonSetApplyFailed")
        );
        assert!(ready.message.contains("see the Reconciled condition"));
        let recovered = build_status(&facts(), &failing.status, &failing.all_nodes, done, &at(9));
        assert_eq!(cond(&recovered.status, "Reconciled").status, "True");
        assert_eq!(cond(&recovered.status, "Ready").status, "True");
    }

    fn fleet(n: usize, done: usize) -> Vec<NodeReport> {
        (0..n)
            .map(|i| {
                let name = format!("tt-node-{i:05}");
                if i < done {
                    report(&name, NodeState::Done, Some("2.8.0"))
                } else if i == done {
                    let mut r = report(&name, NodeState::Upgrading, Some("2.7.0"));
                    r.transition.reason = Some(tr::DEVICE_HELD.into());
                    r.transition.message = Some("held by pid 1234 (python3), pid 1240 (tt-smi); stop those processes, drain them (upgradePolicy.drain.fullNode), or set upgradePolicy.forceUnload".into());
                    r
                } else {
                    let mut r = report(&name, NodeState::Pending, Some("2.7.0"));
                    r.transition.reason = Some(tr::WAITING_FOR_SLOT.into());
                    r
                }
            })
            .collect()
    }

    #[test]
    fn every_node_is_listed_up_to_the_threshold() {
        for done in [0, 500, 999] {
            let b = build(fleet(COMPACT_THRESHOLD, done), None, 0);
            assert_eq!(b.listed().len(), COMPACT_THRESHOLD, "{done} done");
            assert_eq!(b.status.summary.as_ref().unwrap().nodes_omitted, 0);
            let bytes = serde_json::to_vec(&b.whole()).unwrap().len();
            assert!(bytes < 256 * 1024, "{done} done: {bytes} bytes");
        }
    }

    #[test]
    fn past_the_threshold_done_and_waiting_nodes_are_omitted_but_counted() {
        for reason in [
            tr::WAITING_FOR_SLOT,
            tr::PAUSED,
            tr::OUTSIDE_WINDOW,
            tr::WAITING_FOR_CANARY,
            tr::CANARY_SOAKING,
            tr::ROLLOUT_HALTED,
        ] {
            assert!(
                ttdp_api::driver::v1alpha1::WAITING_TO_START.contains(&reason),
                "{reason} is a reason to wait for the rollout's sake"
            );
        }
        let mut reports = fleet(5_000, 2_500);
        let mut failed = report("tt-node-04000", NodeState::Failed, Some("2.7.0"));
        failed.transition.reason = Some(tr::DEVICE_HELD.into());
        let mut paused = report("tt-node-04001", NodeState::Pending, Some("2.7.0"));
        paused.transition.reason = Some(tr::PAUSED.into());
        let mut down = report("tt-node-04002", NodeState::Pending, Some("2.7.0"));
        down.transition.reason = Some(tr::NODE_NOT_READY.into());
        reports[4_000] = failed;
        reports[4_001] = paused;
        reports[4_002] = down;
        let b = build(reports, None, 0);
        let s = b.status.summary.clone().unwrap();
        assert_eq!(s.matched, 5_000);
        assert_eq!(s.up_to_date, 2_500);
        assert_eq!(s.pending, 2_498);
        let listed: Vec<(String, NodeState)> =
            b.listed().into_iter().map(|n| (n.name, n.state)).collect();
        assert_eq!(
            listed,
            [
                ("tt-node-02500".to_owned(), NodeState::Upgrading),
                ("tt-node-04000".to_owned(), NodeState::Failed),
                ("tt-node-04002".to_owned(), NodeState::Pending),
            ],
            "in flight, failed and not-Ready nodes are listed; Done nodes and nodes waiting \
             for a slot or for the pause are not"
        );
        assert_eq!(s.nodes_omitted, 4_997);
        assert_eq!(
            b.all_nodes.len(),
            5_000,
            "the controller still remembers every node"
        );
        // However many nodes are in flight, the entry count is capped, Failed and in flight first.
        let mut reports = fleet(50_000, 0);
        for r in &mut reports[..6_000] {
            *r = report(&r.name, NodeState::Draining, Some("2.7.0"));
        }
        reports[40_000] = report("tt-node-40000", NodeState::Failed, Some("2.7.0"));
        let b = build(reports, None, 0);
        let listed = b.listed();
        assert!(listed.iter().any(|n| n.state == NodeState::Failed));
        assert!(listed.iter().all(|n| n.state != NodeState::Pending));
        assert!(
            listed.len() > 500 && listed.len() < 6_000,
            "{}",
            listed.len()
        );
        assert_eq!(
            b.status.summary.as_ref().unwrap().nodes_omitted,
            count(50_000 - listed.len())
        );
        let bytes = serde_json::to_vec(&b.whole()).unwrap().len();
        assert!(bytes <= 256 * 1024, "{bytes} bytes");
    }

    #[test]
    fn long_messages_never_take_the_status_past_its_byte_cap() {
        // a small fleet in trouble, every message as long as allowed
        let long = "x".repeat(ttdp_api::driver::v1alpha1::MAX_NODE_MESSAGE_CHARS * 2);
        let mut reports = fleet(600, 0);
        for (i, r) in reports.iter_mut().enumerate() {
            let state = if i % 6 == 0 {
                NodeState::Failed
            } else {
                NodeState::Draining
            };
            *r = report(&r.name, state, Some("2.7.0"));
            r.transition.message = Some(long.clone());
        }
        let b = build(reports, None, 0);
        let whole = b.whole();
        let bytes = serde_json::to_vec(&whole).unwrap().len();
        assert!(bytes <= 256 * 1024, "{bytes} bytes");
        assert!(whole.nodes.iter().all(|n| {
            n.message.as_ref().is_some_and(|m| {
                m.chars().count() <= ttdp_api::driver::v1alpha1::MAX_NODE_MESSAGE_CHARS
                    && m.ends_with('…')
            })
        }));
        let failed_listed = whole
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Failed)
            .count();
        assert_eq!(
            failed_listed, 100,
            "every Failed node is listed before any in flight"
        );
        let s = whole.summary.unwrap();
        assert_eq!(s.nodes_omitted, count(600 - whole.nodes.len()));
        assert!(s.nodes_omitted > 0);
        for n in &whole.nodes {
            let real = serde_json::to_vec(n).unwrap().len();
            assert_eq!(entry_bytes(n), real + 1);
            assert!(
                entry_bytes(n) >= real,
                "{real} bytes estimated as {}",
                entry_bytes(n)
            );
        }
    }

    #[test]
    fn an_update_rebuilds_only_the_reported_entries_and_says_which_changed() {
        let first = build(
            vec![
                report("n1", NodeState::Upgrading, Some("2.7.0")),
                report("n2", NodeState::Pending, Some("2.7.0")),
                report("n3", NodeState::Done, Some("2.8.0")),
            ],
            None,
            0,
        );
        let up =
            |reports| update_status(&facts(), &first.status, &first.all_nodes, reports, &at(10));
        // n1 finished, n3 reported as it was: only n1 changed; n2, not reported, is kept.
        let b = up(vec![
            report("n1", NodeState::Done, Some("2.8.0")),
            report("n3", NodeState::Done, Some("2.8.0")),
        ]);
        assert_eq!(b.changed, [Arc::from("n1")]);
        assert!(b.same_nodes);
        assert!(Arc::ptr_eq(&b.all_nodes["n2"], &first.all_nodes["n2"]));
        assert!(Arc::ptr_eq(&b.all_nodes["n3"], &first.all_nodes["n3"]));
        assert_eq!(b.changes.len(), 1);
        assert_eq!(b.status.summary.as_ref().unwrap().up_to_date, 2);
        assert!(b.status.nodes.is_empty(), "entries are listed on demand");
        assert_eq!(b.listed().len(), 3);
        // A node the entries do not know joins: not the same nodes (a whole write).
        let joined = up(vec![report("n4", NodeState::Pending, Some("2.7.0"))]);
        assert!(!joined.same_nodes);
        assert_eq!(joined.changed, [Arc::from("n4")]);
        // The whole build drops the nodes not reported.
        let left = build(
            vec![report("n1", NodeState::Done, Some("2.8.0"))],
            Some(&b),
            20,
        );
        assert!(!left.same_nodes);
        assert_eq!(left.all_nodes.len(), 1);
    }
}
