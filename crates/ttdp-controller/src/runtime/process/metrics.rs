//! Prometheus metrics (prometheus-client), served on `/metrics` by [`crate::runtime::process::server`].
//!
//! - `ttdp_nodes{policy,state,version}`: matched nodes by state and loaded version
//! - `ttdp_node_transitions_total{policy,from,to}`: state changes
//! - `ttdp_phase_duration_seconds{phase}`: time spent in Cordoning, Draining, Upgrading,
//!   Uncordoning, and `total` for a whole node upgrade
//! - `ttdp_drain_evictions_total`, `ttdp_drain_pdb_blocks_total`: from ttdp-drain
//! - `ttdp_reconciles_total{result}`, `ttdp_reconcile_errors_total{reason}`,
//!   `ttdp_reconcile_duration_seconds`
//! - `ttdp_leader`: 1 while this replica runs the controller (holds the lease), else 0
//! - `ttdp_rollout_halted{policy}`: 1 while the policy's rollout is halted
//! - `ttdp_step_oldest_start_timestamp_seconds{policy,state}`: when the longest-waiting node in
//!   each in-flight state entered it, so an alert can tell a node stuck in a step
//! - `ttdp_nodes_kernel_not_ready{policy,state}`: nodes with an installed kernel whose module
//!   is not ready (would boot without the driver): `Failed` when one of its kernels failed,
//!   else `Pending`
//! - `ttdp_agent_start_ready_seconds{cache}`: time from an agent's start to Ready, by whether
//!   its module was in the cache (`hit`) or not (`miss`), each start observed once

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};
use ttdp_api::{NodeState, TenstorrentDriverPolicyStatus};

use ttdp_api::driver::v1alpha1::{NextKernelState, NodeStartLoad};

use crate::pure::next_kernels::nodes_not_ready;
use crate::pure::status::{NodeEntries, StateChange, node_counts, reasons};

/// Labels of `ttdp_nodes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// The policy.
    pub policy: String,
    /// The node state.
    pub state: String,
    /// The loaded version (`none` when no module is loaded).
    pub version: String,
}

/// Labels of `ttdp_node_transitions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    /// The policy.
    pub policy: String,
    /// The previous state (`New` for a node seen for the first time).
    pub from: String,
    /// The new state.
    pub to: String,
}

/// Labels with one `policy`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    /// The policy.
    pub policy: String,
}

/// Labels of `ttdp_step_oldest_start_timestamp_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// The policy.
    pub policy: String,
    /// An in-flight state: Cordoning, Draining, Upgrading or Uncordoning.
    pub state: String,
}

/// Labels of `ttdp_nodes_kernel_not_ready`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KernelLabels {
    /// The policy.
    pub policy: String,
    /// `Failed` (a kernel's module could not be made) or `Pending` (being prepared).
    pub state: String,
}

/// Labels of `ttdp_agent_start_ready_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `hit`: the module waited in the cache; `miss`: it was built or downloaded.
    pub cache: String,
}

/// What the agents report about the kernels they prepare and the loads at their start.
#[derive(Debug)]
struct KernelMetrics {
    not_ready: Family<KernelLabels, Gauge>,
    start_ready: HistogramFamily<CacheLabels>,
}

impl KernelMetrics {
    fn register(registry: &mut NamedRegistry) -> Self {
        let metrics = Self {
            not_ready: Family::default(),
            start_ready: HistogramFamily::<CacheLabels>::new_with_constructor(
                phase_histogram as fn() -> Histogram,
            ),
        };
        registry.register(
            "nodes_kernel_not_ready",
            "Nodes with an installed kernel whose module is not ready (they would boot without the driver): state Failed when one of its kernels failed, else Pending",
            metrics.not_ready.clone(),
        );
        registry.register(
            "agent_start_ready_seconds",
            "Time from an agent's start to Ready, by whether its module was in the cache (cache=hit) or built or downloaded (cache=miss)",
            metrics.start_ready.clone(),
        );
        metrics
    }

    /// The gauge's series of `policy` for its node `entries`: both states, zero when none.
    fn set(&self, policy: &str, entries: &NodeEntries) {
        let (failed, pending) = nodes_not_ready(entries);
        for (state, n) in [
            (NextKernelState::Failed, failed),
            (NextKernelState::Pending, pending),
        ] {
            self.not_ready
                .get_or_create(&kernel_labels(policy, state))
                .set(n);
        }
    }

    fn forget(&self, policy: &str) {
        for state in [NextKernelState::Failed, NextKernelState::Pending] {
            self.not_ready.remove(&kernel_labels(policy, state));
        }
    }
}

fn kernel_labels(policy: &str, state: NextKernelState) -> KernelLabels {
    KernelLabels {
        policy: policy.to_owned(),
        state: state.as_str().to_owned(),
    }
}

/// The series a policy owns, dropped when its counts change or it is deleted.
#[derive(Debug, Default)]
struct PolicySeries {
    nodes: Vec<NodeLabels>,
    steps: Vec<StepLabels>,
}

/// The registry, and the name of every series it can expose.
#[derive(Debug)]
struct NamedRegistry {
    registry: Registry,
    series_names: Vec<String>,
}

impl NamedRegistry {
    /// Registers `metric` as `ttdp_<name>`, noting the series names its type exposes.
    fn register(&mut self, name: &str, help: &str, metric: impl Metric) {
        let suffixes: &[&str] = match metric.metric_type() {
            MetricType::Counter => &["_total"],
            MetricType::Histogram => &["_bucket", "_count", "_sum"],
            _ => &[""],
        };
        (self.series_names).extend(suffixes.iter().map(|s| format!("ttdp_{name}{s}")));
        self.registry.register(name, help, metric);
    }
}

/// The gauges alerts read: who leads, halted rollouts, nodes stuck in a step.
#[derive(Debug)]
struct RolloutGauges {
    leader: Gauge,
    rollout_halted: Family<PolicyLabels, Gauge>,
    step_started: Family<StepLabels, Gauge<f64, AtomicU64>>,
}

impl RolloutGauges {
    fn register(registry: &mut NamedRegistry) -> Self {
        let gauges = Self {
            leader: Gauge::default(),
            rollout_halted: Family::default(),
            step_started: Family::default(),
        };
        registry.register(
            "leader",
            "1 while this replica runs the controller (holds the leader lease), else 0",
            gauges.leader.clone(),
        );
        registry.register(
            "rollout_halted",
            "1 while the policy's rollout is halted (by its canary or by more failures than maxUnavailable)",
            gauges.rollout_halted.clone(),
        );
        registry.register(
            "step_oldest_start_timestamp_seconds",
            "When the longest-waiting node in each in-flight state entered it (Unix seconds)",
            gauges.step_started.clone(),
        );
        gauges
    }
}

/// Labels with one `phase`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// Cordoning, Draining, Upgrading, Uncordoning or total.
    pub phase: String,
}

/// Labels with one `result` (`ok` or `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error`.
    pub result: String,
}

/// Labels with one error `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// [`crate::Error::reason`].
    pub reason: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn phase_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.5, 2.0, 14))
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// Every metric of the controller.
#[derive(Debug)]
pub struct Metrics {
    registry: NamedRegistry,
    nodes: Family<NodeLabels, Gauge>,
    policy_series: Mutex<BTreeMap<String, PolicySeries>>,
    rollout: RolloutGauges,
    kernels: KernelMetrics,
    transitions: Family<TransitionLabels, Counter>,
    phase_duration: HistogramFamily<PhaseLabels>,
    drain_evictions: Counter<u64, AtomicU64>,
    drain_pdb_blocks: Counter<u64, AtomicU64>,
    reconciles: Family<ResultLabels, Counter>,
    reconcile_errors: Family<ReasonLabels, Counter>,
    reconcile_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = NamedRegistry {
            registry: Registry::with_prefix("ttdp"),
            series_names: Vec::new(),
        };
        let nodes = Family::<NodeLabels, Gauge>::default();
        let transitions = Family::<TransitionLabels, Counter>::default();
        let phase_duration = HistogramFamily::<PhaseLabels>::new_with_constructor(
            phase_histogram as fn() -> Histogram,
        );
        let drain_evictions = Counter::<u64, AtomicU64>::default();
        let drain_pdb_blocks = Counter::<u64, AtomicU64>::default();
        let reconciles = Family::<ResultLabels, Counter>::default();
        let reconcile_errors = Family::<ReasonLabels, Counter>::default();
        let reconcile_duration = reconcile_histogram();
        let rollout = RolloutGauges::register(&mut registry);
        let kernels = KernelMetrics::register(&mut registry);
        registry.register(
            "nodes",
            "Matched nodes by policy, state and loaded version",
            nodes.clone(),
        );
        registry.register(
            "node_transitions",
            "Node state changes",
            transitions.clone(),
        );
        registry.register(
            "phase_duration_seconds",
            "Time nodes spent in each upgrade phase, and in a whole upgrade (phase=total)",
            phase_duration.clone(),
        );
        registry.register(
            "drain_evictions",
            "Pods evicted by node drains",
            drain_evictions.clone(),
        );
        registry.register(
            "drain_pdb_blocks",
            "Evictions refused by a PodDisruptionBudget (retried with back-off)",
            drain_pdb_blocks.clone(),
        );
        registry.register(
            "reconciles",
            "Policy reconciles by result",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by reason",
            reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of policy reconciles",
            reconcile_duration.clone(),
        );
        Self {
            registry,
            nodes,
            policy_series: Mutex::default(),
            rollout,
            kernels,
            transitions,
            phase_duration,
            drain_evictions,
            drain_pdb_blocks,
            reconciles,
            reconcile_errors,
            reconcile_duration,
        }
    }
}

impl Metrics {
    /// A shared instance.
    pub fn shared() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The name of every series the controller can expose (`ttdp_nodes`,
    /// `ttdp_reconciles_total`, `ttdp_phase_duration_seconds_bucket`, ...), whether or not it has
    /// a sample yet: what dashboards and alerts may read.
    pub fn series_names(&self) -> &[String] {
        &self.registry.series_names
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry.registry);
        out
    }

    /// Says whether this replica runs the controller.
    pub fn set_leading(&self, leading: bool) {
        self.rollout.leader.set(i64::from(leading));
    }

    /// Replaces the gauges of `policy` (nodes by state, halted, oldest step starts) with what
    /// its written status and node entries say.
    pub fn set_policy(
        &self,
        policy: &str,
        status: &TenstorrentDriverPolicyStatus,
        entries: &NodeEntries,
    ) {
        self.forget_policy(policy);
        let mut series = PolicySeries::default();
        for ((state, version), n) in node_counts(entries) {
            let labels = NodeLabels {
                policy: policy.to_owned(),
                state: state.as_str().to_owned(),
                version,
            };
            self.nodes.get_or_create(&labels).set(n);
            series.nodes.push(labels);
        }
        for (state, started) in oldest_step_starts(entries) {
            let labels = StepLabels {
                policy: policy.to_owned(),
                state: state.as_str().to_owned(),
            };
            self.rollout
                .step_started
                .get_or_create(&labels)
                .set(started);
            series.steps.push(labels);
        }
        self.rollout
            .rollout_halted
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .set(i64::from(is_rollout_halted(status)));
        self.kernels.set(policy, entries);
        self.policy_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(policy.to_owned(), series);
    }

    /// Forgets every gauge of a deleted policy.
    pub fn forget_policy(&self, policy: &str) {
        let old = self
            .policy_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(policy)
            .unwrap_or_default();
        for labels in &old.nodes {
            self.nodes.remove(labels);
        }
        for labels in &old.steps {
            self.rollout.step_started.remove(labels);
        }
        self.rollout.rollout_halted.remove(&PolicyLabels {
            policy: policy.to_owned(),
        });
        self.kernels.forget(policy);
    }

    /// Sets `policy`'s gauge of nodes with a kernel not ready from its node `entries` (also set
    /// by [`Metrics::set_policy`]).
    pub fn set_kernels_not_ready(&self, policy: &str, entries: &NodeEntries) {
        self.kernels.set(policy, entries);
    }

    /// Observes one agent's start load (the reconcile passes each start once, when its node's
    /// entry first shows it).
    pub fn observe_start_load(&self, load: NodeStartLoad) {
        let cache = if load.cache_hit { "hit" } else { "miss" };
        let seconds = load.ready_after_ms.max(0) as f64 / 1000.0;
        self.kernels
            .start_ready
            .get_or_create(&CacheLabels {
                cache: cache.to_owned(),
            })
            .observe(seconds);
    }

    /// Records state changes: transition counts and phase durations.
    pub fn record_changes(&self, policy: &str, changes: &[StateChange]) {
        for c in changes {
            self.transitions
                .get_or_create(&TransitionLabels {
                    policy: policy.to_owned(),
                    from: c.from.map_or("New", NodeState::as_str).to_owned(),
                    to: c.to.as_str().to_owned(),
                })
                .inc();
            if let (Some(from), Some(d)) = (c.from, c.time_in_previous)
                && from.is_in_flight()
            {
                self.observe_phase(from.as_str(), d.as_secs_f64());
            }
            if let Some(total) = c.upgrade_total {
                self.observe_phase("total", total.as_secs_f64());
            }
        }
    }

    fn observe_phase(&self, phase: &str, seconds: f64) {
        self.phase_duration
            .get_or_create(&PhaseLabels {
                phase: phase.to_owned(),
            })
            .observe(seconds.max(0.0));
    }

    /// Counts drain evictions and PDB blocks.
    pub fn record_drain(&self, evictions: u64, pdb_blocks: u64) {
        self.drain_evictions.inc_by(evictions);
        self.drain_pdb_blocks.inc_by(pdb_blocks);
    }

    /// Records one reconcile.
    pub fn record_reconcile(&self, duration: Duration, error: Option<&'static str>) {
        self.reconcile_duration.observe(duration.as_secs_f64());
        let result = if error.is_some() { "error" } else { "ok" };
        self.reconciles
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
        if let Some(reason) = error {
            self.reconcile_errors
                .get_or_create(&ReasonLabels {
                    reason: reason.to_owned(),
                })
                .inc();
        }
    }
}

/// Whether the status says the rollout is halted: its Degraded condition is True with reason
/// `RolloutHalted`, for a canary halt and a failure-budget halt alike.
fn is_rollout_halted(status: &TenstorrentDriverPolicyStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == "Degraded" && c.status == "True" && c.reason == reasons::ROLLOUT_HALTED)
}

/// For each in-flight state, when its longest-waiting node entered it (Unix seconds). A
/// timestamp rather than an age: it stays right between reconciles, while nothing changes.
fn oldest_step_starts(entries: &NodeEntries) -> BTreeMap<NodeState, f64> {
    let mut oldest = BTreeMap::new();
    for n in entries.values().filter(|n| n.state.is_in_flight()) {
        let Some(entered) = &n.last_transition_time else {
            continue;
        };
        // Exact to the millisecond for the next 285,000 years.
        let seconds = entered.0.as_millisecond() as f64 / 1000.0;
        oldest
            .entry(n.state)
            .and_modify(|t: &mut f64| *t = t.min(seconds))
            .or_insert(seconds);
    }
    oldest
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use ttdp_api::NodeStatus;

    /// Node `name` in `state`, on 2.8.0 when Done, entered at `entered` (Unix milliseconds).
    fn node(name: &str, state: NodeState, entered: Option<i64>) -> NodeStatus {
        let mut n = NodeStatus::new(name, state);
        n.current_version = (state == NodeState::Done).then(|| "2.8.0".to_owned());
        n.last_transition_time = entered.map(|ms| Time(Timestamp::from_millisecond(ms).unwrap()));
        n
    }

    fn entries(nodes: impl IntoIterator<Item = NodeStatus>) -> NodeEntries {
        nodes
            .into_iter()
            .map(|n| (n.name.as_str().into(), Arc::new(n)))
            .collect()
    }

    /// A status whose Degraded condition is True with `reason`, or False without one.
    fn status(reason: Option<&str>) -> TenstorrentDriverPolicyStatus {
        TenstorrentDriverPolicyStatus {
            conditions: vec![Condition {
                type_: "Degraded".into(),
                status: if reason.is_some() { "True" } else { "False" }.into(),
                reason: reason.unwrap_or("NoFailures").into(),
                message: String::new(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..TenstorrentDriverPolicyStatus::default()
        }
    }

    #[test]
    fn series_names_are_exactly_what_the_exposition_shows_once_every_metric_has_a_sample() {
        let m = Metrics::default();
        let draining = node("a", NodeState::Draining, Some(1_000));
        m.set_policy(
            "fleet",
            &status(Some("RolloutHalted")),
            &entries([draining]),
        );
        m.set_leading(true);
        m.record_changes(
            "fleet",
            &[StateChange {
                node: "a".into(),
                from: Some(NodeState::Cordoning),
                to: NodeState::Draining,
                reason: None,
                message: None,
                time_in_previous: Some(SignedDuration::from_secs(1)),
                upgrade_total: None,
            }],
        );
        m.record_drain(1, 1);
        m.record_reconcile(Duration::from_millis(1), Some("KubeApiError"));
        m.observe_start_load(NodeStartLoad {
            cache_hit: true,
            ready_after_ms: 2300,
        });
        let text = m.encode();
        let shown: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let named: std::collections::BTreeSet<&str> =
            m.series_names().iter().map(String::as_str).collect();
        assert_eq!(shown, named, "{text}");
    }

    #[test]
    fn leader_gauge_follows_leadership() {
        let m = Metrics::default();
        assert!(m.encode().contains("\nttdp_leader 0\n"), "{}", m.encode());
        m.set_leading(true);
        assert!(m.encode().contains("\nttdp_leader 1\n"), "{}", m.encode());
        m.set_leading(false);
        assert!(m.encode().contains("\nttdp_leader 0\n"), "{}", m.encode());
    }

    #[test]
    fn halted_rollouts_and_oldest_step_starts_are_exposed_then_forgotten() {
        let m = Metrics::default();
        let nodes = entries([
            node("a", NodeState::Draining, Some(100_500)),
            node("b", NodeState::Draining, Some(40_250)),
            node("c", NodeState::Upgrading, Some(70_000)),
            // No time known: it cannot say how long the step has taken.
            node("d", NodeState::Cordoning, None),
            node("e", NodeState::Failed, Some(1_000)),
            node("f", NodeState::Done, Some(2_000)),
        ]);
        m.set_policy("fleet", &status(Some("RolloutHalted")), &nodes);
        let text = m.encode();
        let step = |state: &str, at: &str| {
            format!(
                r#"ttdp_step_oldest_start_timestamp_seconds{{policy="fleet",state="{state}"}} {at}"#
            )
        };
        assert!(text.contains(&step("Draining", "40.25")), "{text}");
        assert!(text.contains(&step("Upgrading", "70.0")), "{text}");
        let steps = text
            .lines()
            .filter(|l| l.starts_with("ttdp_step_oldest_start_timestamp_seconds{"))
            .count();
        assert_eq!(steps, 2, "only in-flight states with a known time: {text}");
        assert!(
            text.contains(r#"ttdp_rollout_halted{policy="fleet"} 1"#),
            "{text}"
        );
        m.set_policy("fleet", &status(Some("NodesFailed")), &entries([]));
        let text = m.encode();
        assert!(
            text.contains(r#"ttdp_rollout_halted{policy="fleet"} 0"#),
            "{text}"
        );
        assert!(
            !text.contains("ttdp_step_oldest_start_timestamp_seconds{"),
            "{text}"
        );
        m.set_policy("fleet", &status(Some("RolloutHalted")), &nodes);
        m.forget_policy("fleet");
        let text = m.encode();
        assert!(!text.contains(r#"policy="fleet""#), "{text}");
    }

    #[test]
    fn exposes_nodes_transitions_and_phase_durations() {
        let m = Metrics::default();
        let done = (0..3).map(|i| node(&format!("n{i}"), NodeState::Done, None));
        m.set_policy("fleet", &status(None), &entries(done));
        m.record_changes(
            "fleet",
            &[StateChange {
                node: "n1".into(),
                from: Some(NodeState::Draining),
                to: NodeState::Upgrading,
                reason: None,
                message: None,
                time_in_previous: Some(SignedDuration::from_secs(12)),
                upgrade_total: None,
            }],
        );
        m.record_drain(2, 1);
        m.record_reconcile(Duration::from_millis(3), Some("KubeApiError"));
        let text = m.encode();
        assert!(
            text.contains(r#"ttdp_nodes{policy="fleet",state="Done",version="2.8.0"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"ttdp_node_transitions_total{policy="fleet",from="Draining",to="Upgrading"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"ttdp_phase_duration_seconds_count{phase="Draining"} 1"#),
            "{text}"
        );
        assert!(text.contains("ttdp_drain_evictions_total 2"), "{text}");
        assert!(text.contains("ttdp_drain_pdb_blocks_total 1"), "{text}");
        assert!(
            text.contains(r#"ttdp_reconcile_errors_total{reason="KubeApiError"} 1"#),
            "{text}"
        );
        let pending = node("n1", NodeState::Pending, None);
        m.set_policy("fleet", &status(None), &entries([pending]));
        let text = m.encode();
        assert!(
            !text.contains(r#"state="Done""#),
            "old series dropped: {text}"
        );
    }

    #[test]
    fn nodes_with_a_kernel_not_ready_and_start_loads_are_exposed() {
        use ttdp_api::agent_report::{KernelModuleState, KernelReadiness};
        use ttdp_api::driver::v1alpha1::NextKernels;
        let with_kernel = |name: &str, state| NodeStatus {
            next_kernels: NextKernels::of_report(&[KernelReadiness {
                release: "6.1.0-58-amd64".into(),
                state,
                reason: None,
                message: None,
            }]),
            ..node(name, NodeState::Done, None)
        };
        let m = Metrics::default();
        let nodes = entries([
            with_kernel("a", KernelModuleState::Failed),
            with_kernel("b", KernelModuleState::Failed),
            with_kernel("c", KernelModuleState::Pending),
            with_kernel("d", KernelModuleState::Ready),
            node("e", NodeState::Done, None),
        ]);
        m.set_policy("fleet", &status(None), &nodes);
        for (load, ms) in [(true, 2300), (true, 1700), (false, 95_000)] {
            m.observe_start_load(NodeStartLoad {
                cache_hit: load,
                ready_after_ms: ms,
            });
        }
        let text = m.encode();
        for line in [
            r#"ttdp_nodes_kernel_not_ready{policy="fleet",state="Failed"} 2"#,
            r#"ttdp_nodes_kernel_not_ready{policy="fleet",state="Pending"} 1"#,
            r#"ttdp_agent_start_ready_seconds_count{cache="hit"} 2"#,
            r#"ttdp_agent_start_ready_seconds_sum{cache="hit"} 4.0"#,
            r#"ttdp_agent_start_ready_seconds_count{cache="miss"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in {text}");
        }
        m.set_policy(
            "fleet",
            &status(None),
            &entries([node("e", NodeState::Done, None)]),
        );
        let text = m.encode();
        assert!(
            text.contains(r#"ttdp_nodes_kernel_not_ready{policy="fleet",state="Failed"} 0"#),
            "{text}"
        );
        m.forget_policy("fleet");
        assert!(
            !m.encode().contains("ttdp_nodes_kernel_not_ready{"),
            "{}",
            m.encode()
        );
    }
}
