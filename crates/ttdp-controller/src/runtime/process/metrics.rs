//! Prometheus metrics (prometheus-client), served on `/metrics` by [`crate::runtime::process::server`].
//!
//! - `ttdp_nodes{policy,state,version}`: matched nodes by state and loaded version
//! - `ttdp_node_transitions_total{policy,from,to}`: state changes
//! - `ttdp_phase_duration_seconds{phase}`: time spent in Cordoning, Draining, Upgrading,
//!   Uncordoning, and `total` for a whole node upgrade
//! - `ttdp_drain_evictions_total`, `ttdp_drain_pdb_blocks_total`: from ttdp-drain
//! - `ttdp_reconciles_total{result}`, `ttdp_reconcile_errors_total{reason}`,
//!   `ttdp_reconcile_duration_seconds`

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use ttdp_api::NodeState;

use crate::pure::status::StateChange;

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
    registry: Registry,
    nodes: Family<NodeLabels, Gauge>,
    node_series: Mutex<BTreeMap<String, Vec<NodeLabels>>>,
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
        let mut registry = Registry::with_prefix("ttdp");
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
            node_series: Mutex::default(),
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

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Replaces the node gauges of `policy` with these counts.
    pub fn set_nodes(&self, policy: &str, counts: &BTreeMap<(NodeState, String), i64>) {
        self.forget_policy(policy);
        let mut series = Vec::new();
        for ((state, version), n) in counts {
            let labels = NodeLabels {
                policy: policy.to_owned(),
                state: state.as_str().to_owned(),
                version: version.clone(),
            };
            self.nodes.get_or_create(&labels).set(*n);
            series.push(labels);
        }
        self.node_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(policy.to_owned(), series);
    }

    /// Forgets every node gauge of a deleted policy.
    pub fn forget_policy(&self, policy: &str) {
        let old = self
            .node_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(policy);
        for labels in old.into_iter().flatten() {
            self.nodes.remove(&labels);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    #[test]
    fn exposes_nodes_transitions_and_phase_durations() {
        let m = Metrics::default();
        m.set_nodes(
            "fleet",
            &BTreeMap::from([((NodeState::Done, "2.8.0".to_owned()), 3)]),
        );
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
        m.set_nodes(
            "fleet",
            &BTreeMap::from([((NodeState::Pending, "2.7.0".to_owned()), 1)]),
        );
        let text = m.encode();
        assert!(
            !text.contains(r#"state="Done""#),
            "old series dropped: {text}"
        );
    }
}
