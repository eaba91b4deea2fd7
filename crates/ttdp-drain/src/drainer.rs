//! [`Drainer`]: plans and runs drains of nodes, reporting progress as [`DrainEvent`]s.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::Api;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::budget::{budgets_of_evicted, guarded_first};
use crate::budget_watch::BudgetWatches;
use crate::classify::{
    ClassifyContext, DaemonSetLookup, Disposition, PodDecision, PodRules, classify,
    daemonset_to_look_up,
};
use crate::cordon::{
    CordonOutcome, CordonOwner, UncordonOutcome, cordon, cordon_with, cordon_with_cached, uncordon,
    uncordon_with,
};
use crate::counters::{Counter, CounterSnapshot, DrainCounters};
use crate::daemonsets_seen::DaemonSetsSeen;
use crate::error::DrainError;
use crate::event::{DrainEvent, DrainEventKind, EventSink, Pass, Removal};
use crate::node_patch::ExtrasFor;
use crate::node_pods::list_node_pods;
use crate::pod_ref::ObjectKey;
use crate::removal::{Removals, Settings};
use crate::report::{DrainReport, skipped_without_force};

/// What to do when some pods are refused ([`Disposition::Refuse`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnRefused {
    /// Remove nothing and fail with [`DrainError::Refused`] (what `kubectl drain` does).
    #[default]
    Fail,
    /// Leave the refused pods and remove the others.
    Skip,
}

/// How one drain runs. [`Default`] matches `kubectl drain` without flags, except that requests
/// are bounded to 16 at a time and 429s back off from 5 s to 10 s.
#[derive(Clone, Debug)]
pub struct DrainOptions {
    /// Which pods are removed.
    pub rules: PodRules,
    /// Give up after this long (`--timeout`); `None` waits forever.
    pub timeout: Option<Duration>,
    /// Delete pods instead of evicting them, bypassing PodDisruptionBudgets
    /// (`--disable-eviction`).
    pub disable_eviction: bool,
    /// Grace period for the pods' termination (`--grace-period`); `None` uses each pod's own.
    pub grace_period: Option<u32>,
    /// Only list and classify; remove nothing (`--dry-run=client`).
    pub dry_run: bool,
    /// What to do when some pods are refused.
    pub on_refused: OnRefused,
    /// At most this many eviction or deletion requests in flight at once (at least 1).
    pub concurrency: usize,
    /// Back-off between retries of a blocked or failed eviction.
    pub backoff: Backoff,
    /// How often the node's pods are listed while waiting for removed pods to go (a watch of
    /// them sees most deletions first).
    pub poll_interval: Duration,
}

impl Default for DrainOptions {
    fn default() -> Self {
        Self {
            rules: PodRules::default(),
            timeout: None,
            disable_eviction: false,
            grace_period: None,
            dry_run: false,
            on_refused: OnRefused::Fail,
            concurrency: 16,
            backoff: Backoff::default(),
            poll_interval: Duration::from_millis(500),
        }
    }
}

/// Drains nodes with one client. Cheap to clone; clones share the event sink and the counters.
///
/// Every method is cancellation-safe: dropping its future leaves the cluster in a state the next
/// call picks up from (a cordon is one atomic write; a drain lists the node's pods afresh, and
/// evicting an already terminating pod is harmless).
#[derive(Clone)]
pub struct Drainer {
    client: Client,
    events: Option<EventSink>,
    counters: Arc<DrainCounters>,
    daemonsets_seen: DaemonSetsSeen,
}

impl fmt::Debug for Drainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drainer")
            .field("events", &self.events)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Drainer {
    /// A drainer using `client`, without an event sink.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            events: None,
            counters: Arc::default(),
            daemonsets_seen: DaemonSetsSeen::fresh_for(Duration::ZERO),
        }
    }

    /// Deliver progress events to `sink`.
    pub fn with_events(mut self, sink: EventSink) -> Self {
        self.events = Some(sink);
        self
    }

    /// Share with other drainers the DaemonSets their drains found, so that a fleet's drains
    /// look each one up once in a while, not once per node. Without it every drain looks up
    /// the DaemonSets of its node's pods.
    pub fn with_daemonsets_seen(mut self, seen: DaemonSetsSeen) -> Self {
        self.daemonsets_seen = seen;
        self
    }

    /// The counters of every drain run by this drainer and its clones.
    pub fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// [`cordon()`](crate::cordon()) with this drainer's client.
    pub async fn cordon(
        &self,
        node: &str,
        owner: &CordonOwner,
    ) -> Result<CordonOutcome, DrainError> {
        cordon(&self.client, node, owner).await
    }

    /// [`uncordon()`](crate::uncordon()) with this drainer's client.
    pub async fn uncordon(
        &self,
        node: &str,
        owner: &CordonOwner,
    ) -> Result<UncordonOutcome, DrainError> {
        uncordon(&self.client, node, owner).await
    }

    /// [`cordon_with()`](crate::cordon_with()) with this drainer's client.
    pub async fn cordon_with(
        &self,
        node: &str,
        owner: &CordonOwner,
        extras: impl ExtrasFor,
    ) -> Result<CordonOutcome, DrainError> {
        cordon_with(&self.client, node, owner, extras).await
    }

    /// [`cordon_with_cached()`](crate::cordon_with_cached()) with this drainer's client.
    pub async fn cordon_with_cached(
        &self,
        node: &str,
        owner: &CordonOwner,
        extras: impl ExtrasFor,
        cached: Option<Node>,
    ) -> Result<CordonOutcome, DrainError> {
        cordon_with_cached(&self.client, node, owner, extras, cached).await
    }

    /// [`uncordon_with()`](crate::uncordon_with()) with this drainer's client.
    pub async fn uncordon_with(
        &self,
        node: &str,
        owner: &CordonOwner,
        extras: impl ExtrasFor,
        cached: Option<Node>,
    ) -> Result<UncordonOutcome, DrainError> {
        uncordon_with(&self.client, node, owner, extras, cached).await
    }

    pub(crate) fn emit(&self, node: &str, kind: DrainEventKind) {
        if let Some(sink) = &self.events {
            sink.emit(&DrainEvent {
                node: node.to_owned(),
                kind,
            });
        }
    }

    /// List the pods of `node` and classify each with `rules`, changing nothing.
    pub async fn plan(&self, node: &str, rules: &PodRules) -> Result<Vec<PodDecision>, DrainError> {
        let (planned, _) = self.plan_pods(node, rules, None).await?;
        Ok(planned.into_iter().map(|(_, d)| d).collect())
    }

    /// Classifies `node`'s pods with `rules`: the pods of `listed` when given, else read anew.
    /// Returns the DaemonSets looked up with the pods' decisions.
    async fn plan_pods(
        &self,
        node: &str,
        rules: &PodRules,
        listed: Option<Listing>,
    ) -> Result<(Vec<(Pod, PodDecision)>, KnownDaemonSets), DrainError> {
        let Listing {
            pods,
            mut daemonsets,
        } = match listed {
            Some(listing) => listing,
            None => Listing {
                pods: self.list_pods(node).await?,
                daemonsets: KnownDaemonSets::new(),
            },
        };
        let wanted: BTreeSet<_> = pods
            .iter()
            .filter_map(|p| daemonset_to_look_up(p, rules))
            .filter(|key| !daemonsets.contains_key(key))
            .collect();
        let mut failed = BTreeMap::new();
        for key in wanted {
            if self.daemonsets_seen.known(&key) {
                daemonsets.insert(key, true);
                continue;
            }
            let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &key.namespace);
            self.counters.bump(Counter::DaemonSetLookup);
            match api.get_opt(&key.name).await {
                Ok(found) => {
                    if found.is_some() {
                        self.daemonsets_seen.found(&key);
                    }
                    daemonsets.insert(key, found.is_some());
                }
                Err(e) => {
                    self.counters.bump(Counter::RequestError);
                    failed.insert(key, DaemonSetLookup::Failed(e.to_string()));
                }
            }
        }
        let missing = daemonsets.iter().filter(|(_, exists)| !**exists);
        let ctx = ClassifyContext {
            now: Timestamp::now(),
            daemonsets: missing
                .map(|(key, _)| (key.clone(), DaemonSetLookup::Missing))
                .chain(failed)
                .collect(),
        };
        let planned = pods
            .into_iter()
            .map(|pod| {
                let decision = classify(&pod, rules, &ctx);
                (pod, decision)
            })
            .collect();
        Ok((planned, daemonsets))
    }

    async fn list_pods(&self, node: &str) -> Result<Vec<Pod>, DrainError> {
        list_node_pods(&self.client, node).await.map_err(|source| {
            self.counters.bump(Counter::RequestError);
            DrainError::ListPods {
                node: node.to_owned(),
                source,
            }
        })
    }

    /// Drain `node`: list and classify its pods, then remove the removable ones and wait until
    /// they are gone. Does not cordon: call [`Drainer::cordon`] first, or evicted pods may come
    /// back to the node.
    pub async fn drain(
        &self,
        node: &str,
        options: &DrainOptions,
    ) -> Result<DrainReport, DrainError> {
        let deadline = options.timeout.map(|t| (Instant::now() + t, t));
        self.drain_until(node, options, deadline, None, &mut None)
            .await
    }

    /// Drain `node` with an absolute deadline shared by several passes. `listing`: the pods an
    /// earlier pass listed and left as they were; this pass plans from them instead of reading
    /// the node's pods again, and leaves its own there when it removes nothing.
    pub(crate) async fn drain_until(
        &self,
        node: &str,
        options: &DrainOptions,
        deadline: Option<(Instant, Duration)>,
        pass: Option<Pass>,
        listing: &mut Option<Listing>,
    ) -> Result<DrainReport, DrainError> {
        let started = Instant::now();
        let mut work = PassWork::default();
        let budgets = BudgetWatches::new(self.client.clone());
        let doing = self.plan_and_remove(node, options, pass, listing, &mut work, &budgets);
        let outcome = match deadline {
            Some((at, _)) => tokio::time::timeout_at(at, doing).await.ok(),
            None => Some(doing.await),
        };
        let finished = match (outcome, deadline) {
            (Some(result), _) => result,
            (None, timeout) => Err(DrainError::Timeout {
                node: node.to_owned(),
                pass,
                timeout: timeout.map(|(_, t)| t).unwrap_or_default(),
                remaining: work.removals.remaining(),
            }),
        };
        finished?;
        self.report(node, options, pass, work, started)
    }

    /// Plans the pass from the node's pods (or `listing`), then removes what the plan removes
    /// and waits until those pods are gone. A dry run, or a plan that removes nothing, leaves
    /// its listing in `listing` for the next pass.
    async fn plan_and_remove(
        &self,
        node: &str,
        options: &DrainOptions,
        pass: Option<Pass>,
        listing: &mut Option<Listing>,
        work: &mut PassWork,
        budgets: &BudgetWatches,
    ) -> Result<(), DrainError> {
        let (planned, daemonsets) = self.plan_pods(node, &options.rules, listing.take()).await?;
        work.decisions = planned.iter().map(|(_, d)| d.clone()).collect();
        self.emit(
            node,
            DrainEventKind::Planned {
                decisions: work.decisions.clone(),
            },
        );
        let refused: Vec<PodDecision> = work
            .decisions
            .iter()
            .filter(|d| d.disposition == Disposition::Refuse)
            .cloned()
            .collect();
        if !refused.is_empty() && options.on_refused == OnRefused::Fail {
            return Err(DrainError::Refused {
                node: node.to_owned(),
                pass,
                pods: refused,
            });
        }
        if options.dry_run
            || !planned
                .iter()
                .any(|(_, d)| removal_of(d, options).is_some())
        {
            *listing = Some(Listing {
                pods: planned.into_iter().map(|(pod, _)| pod).collect(),
                daemonsets,
            });
            return Ok(());
        }
        let removing: Vec<(Pod, Removal)> = planned
            .into_iter()
            .filter_map(|(pod, d)| removal_of(&d, options).map(|how| (pod, how)))
            .collect();
        let guards = budgets_of_evicted(&self.client, &removing).await;
        work.removals = Removals::new(guarded_first(removing, &guards));
        let settings = Settings {
            client: &self.client,
            counters: &self.counters,
            events: self.events.as_ref(),
            node,
            grace_period: options.grace_period,
            concurrency: options.concurrency,
            backoff: options.backoff,
            poll_interval: options.poll_interval,
            budgets,
        };
        work.removals.run(&settings).await;
        Ok(())
    }

    /// The report of a pass that ended in time: an error when a removal failed for good.
    fn report(
        &self,
        node: &str,
        options: &DrainOptions,
        pass: Option<Pass>,
        work: PassWork,
        started: Instant,
    ) -> Result<DrainReport, DrainError> {
        let failed = work.removals.failed();
        if !failed.is_empty() {
            return Err(DrainError::Failed {
                node: node.to_owned(),
                pass,
                failed,
            });
        }
        let (evicted, deleted) = work.removals.gone();
        if !options.dry_run {
            self.emit(
                node,
                DrainEventKind::Done {
                    evicted: evicted.len(),
                    deleted: deleted.len(),
                },
            );
        }
        Ok(DrainReport {
            node: node.to_owned(),
            skipped_without_force: skipped_without_force(&work.decisions),
            decisions: work.decisions,
            evicted,
            deleted,
            dry_run: options.dry_run,
            elapsed: started.elapsed(),
        })
    }
}

/// What one pass planned and is removing, kept outside the future that does the work: when a
/// timeout drops that future, the pass can still say what each pod was waiting for.
#[derive(Debug, Default)]
struct PassWork {
    decisions: Vec<PodDecision>,
    removals: Removals,
}

/// The DaemonSets looked up for a node's pods: whether each exists.
type KnownDaemonSets = BTreeMap<ObjectKey, bool>;

/// A node's pods as a pass listed them, and the DaemonSets looked up for them. A pass that
/// removes nothing leaves the node as it found it, so the next pass of a two-pass drain plans
/// from this instead of reading the node's pods again.
#[derive(Debug)]
pub(crate) struct Listing {
    pods: Vec<Pod>,
    daemonsets: KnownDaemonSets,
}

/// How the drain removes the pod of `decision`, if it does.
fn removal_of(decision: &PodDecision, options: &DrainOptions) -> Option<Removal> {
    match decision.disposition {
        Disposition::Evict if !options.disable_eviction => Some(Removal::Evicted),
        Disposition::Evict | Disposition::Delete => Some(Removal::Deleted),
        Disposition::Skip | Disposition::Refuse => None,
    }
}
