//! How a pass follows the fleet between rounds: it waits for the next change and observes
//! again only what changed, until a change it cannot follow node by node, a timer or its time
//! bound ends it; and when the next reconcile is due after it.

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::{FOLLOW_FOR, IDLE_RESYNC, IN_FLIGHT_RESYNC, MISSING_AGENT_RESYNC, Pass};
use crate::pure::transition::{AgentPod, DrainProgress, NodeObservation};
use crate::runtime::reconcile::follow::{self, FollowBasis};

impl Pass {
    /// Logs the state changes, queues their Events and counts them.
    /// Waits for the next write's turn, then observes again the nodes whose inputs changed.
    /// Returns false when nothing changed or the fleet changed too much to follow.
    pub(super) async fn follow(&mut self, changed_entries: Vec<usize>, released: usize) -> bool {
        let Some(mut changed) = self.changed_since() else {
            return false;
        };
        changed.extend(changed_entries);
        // Nothing to do: wait for the next change here, rather than end the pass and observe
        // the whole fleet again in the next reconcile.
        let waiting_since = std::time::Instant::now();
        while changed.is_empty() && released == 0 {
            let Some(left) = self.time_to_follow() else {
                return false;
            };
            // A timer (not a change) ends the pass: the next reconcile looks at everything. So
            // does a background action that failed: the next reconcile backs off, then retries.
            let woken = self.watched.changed_within(left).await;
            if !woken || self.watched.closed() || self.ctx.node_tasks.has_failures(&self.name) {
                return false;
            }
            let Some(now_changed) = self.changed_since() else {
                return false;
            };
            changed = now_changed;
        }
        tracing::debug!(
            waited_ms = waiting_since.elapsed().as_millis(),
            changed = changed.len(),
            "following"
        );
        self.observe_again(changed);
        true
    }

    /// Observes the `changed` nodes (indexes) again, now.
    pub(super) fn observe_again(&mut self, mut changed: Vec<usize>) {
        changed.sort_unstable();
        changed.dedup();
        self.now = Time(Timestamp::now());
        let mut drains = self.ctx.drains.progress_of(&self.name);
        for &i in &changed {
            let drain = drains.remove(self.matched[i].name());
            self.observations[i] = self.observe_node(i, drain);
        }
        self.reobserved = changed;
        self.apply_uncordoned();
    }

    /// How long this pass may still wait for a change: until it has followed the fleet for
    /// [`FOLLOW_FOR`], or a timer says to look again ([`Pass::look_again_within`]). None: no
    /// longer.
    fn time_to_follow(&self) -> Option<Duration> {
        let left = FOLLOW_FOR.checked_sub(self.following_since.elapsed())?;
        let left = self.look_again_within().map_or(left, |t| t.min(left));
        (!left.is_zero()).then_some(left)
    }

    /// The matched nodes whose node, agent pods or drain changed since the last look, or whose
    /// deferred work may start; None when the fleet changed too much to follow (the next
    /// reconcile observes it whole).
    pub(super) fn changed_since(&mut self) -> Option<Vec<usize>> {
        let basis = FollowBasis {
            policy: &self.name,
            selection: &self.basis.selection,
            older: &self.basis.older,
            conflicts: &self.basis.conflicts,
            policies: &self.basis.policies,
        };
        let found = follow::changed_nodes(
            &self.ctx,
            &basis,
            &self.watched,
            &mut self.matched,
            &mut self.agent_pods,
        );
        let mut changed = match found {
            Ok(changed) => changed,
            Err(restart) => {
                tracing::debug!(
                    ?restart,
                    "the fleet changed; the next reconcile observes it whole"
                );
                return None;
            }
        };
        let drains = self.ctx.drains.progress_of(&self.name);
        for (i, (node, obs)) in self.observations.iter().enumerate() {
            if drains.get(node).unwrap_or(&DrainProgress::NotStarted) != &obs.drain {
                changed.push(i);
            }
        }
        // A node left waiting for its last task: that task woke the pass when it ended.
        let tasks = &self.ctx.node_tasks;
        let free = (self.deferred.iter().copied())
            .filter(|&i| !tasks.busy(&self.name, self.matched[i].name()));
        changed.extend(free);
        Some(changed)
    }

    /// Notes whether `node`'s agent pod is missing (none, or the DaemonSet cannot make it), and
    /// since when this pass saw it so.
    pub(super) fn note_agent_missing(&mut self, (node, o): &(String, NodeObservation)) {
        let missing = o.conflict_with.is_none()
            && matches!(o.agent, AgentPod::Missing | AgentPod::NotCreated(_));
        if missing {
            (self.agents_missing_since)
                .entry(node.clone())
                .or_insert_with(Instant::now);
        } else {
            self.agents_missing_since.remove(node);
        }
    }

    /// When to reconcile again: soon while nodes are in flight, a retry gate is about to open or
    /// an agent pod is missing (no watch says why it does not appear), else after a while.
    pub(super) fn requeue_after(&self) -> Duration {
        let in_flight = self.planned.iter().any(|(state, _)| state.is_in_flight());
        let resync = if in_flight {
            IN_FLIGHT_RESYNC
        } else {
            IDLE_RESYNC
        };
        self.look_again_within().map_or(resync, |t| {
            resync.min(t.saturating_add(Duration::from_millis(50)))
        })
    }

    /// When a timer, not a watch, says to look at the fleet again: a retry gate opens, a wait
    /// on the device's holders or a step reaches its deadline, a maintenance window or a soak
    /// changes what may start, or (every few seconds) an agent pod is missing, since no watch
    /// says why the DaemonSet does not make it.
    ///
    /// Counted from the start of the pass, so that changes arriving all the time (nodes'
    /// heartbeats) do not put the timer off.
    fn look_again_within(&self) -> Option<Duration> {
        // Counted from when each pod went missing: the DaemonSet replaces a deleted agent pod
        // within a second or so, and a rollout always has one on its way, so a timer counted
        // from the pass would end it every few seconds and observe the whole fleet again.
        let pods = (self.agents_missing_since.values().min())
            .map(|since| since.saturating_duration_since(self.following_since))
            .map(|missing_from| missing_from + MISSING_AGENT_RESYNC);
        let guards = self.planner.guards().changes_in(self.planner.verdict());
        let soonest = [self.next_retry, pods, guards]
            .into_iter()
            .flatten()
            .min()?;
        Some(soonest.saturating_sub(self.following_since.elapsed()))
    }
}
