//! [`TwoPassDrain`]: a device pass, then an optional full-node pass, under one deadline.
//!
//! Pass 1 ([`Pass::Device`]) removes the pods that use a device (see [`DevicePredicate`]) and
//! waits until they are gone, so the device is free as early as possible. Pass 2
//! ([`Pass::FullNode`]) is kubectl-drain semantics restricted by a pod selector, for what pass 1
//! cannot see (e.g. privileged containers that get the device without a `hostPath`). When pass
//! 1 removes nothing, the node is as it found it, and pass 2 plans from pass 1's listing: the
//! node's pods and their DaemonSets are then read once, as `kubectl drain` reads them.
//!
//! Both passes skip DaemonSet pods (a DaemonSet pod would come straight back; callers that need
//! DaemonSet pods gone steer them away with node labels instead). `force` applies to both
//! passes: with it, pods without a controller (and pods whose DaemonSet is gone) are evicted;
//! without it they are skipped and the drain goes on ([`PodRules::skip_unmanaged`]), unlike
//! `kubectl drain`, which refuses them. [`TwoPassReport::skipped_without_force`] names them.
//! `delete_emptydir_data` applies to both passes too: without it, a pod with `emptyDir` volumes
//! is refused in whichever pass finds it (a device user in pass 1), and a refused pass removes
//! nothing, as `kubectl drain` without `--delete-emptydir-data`. Freeing the device never
//! outranks the caller's word that such data must not be lost.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;
use ttdp_selector::Selector;

use crate::classify::PodRules;
use crate::device::DevicePredicate;
use crate::drainer::{DrainOptions, Drainer};
use crate::error::DrainError;
use crate::event::{DrainEventKind, Pass};
use crate::pod_ref::PodRef;
use crate::report::DrainReport;

/// A two-pass drain.
#[derive(Clone, Debug)]
pub struct TwoPassDrain {
    /// Which pods use the device (pass 1).
    pub device: DevicePredicate,
    /// Whether pass 2 runs.
    pub full_node: bool,
    /// Restricts pass 2 to matching pods; the empty selector sweeps every pod.
    pub pod_selector: Selector,
    /// Evict pods without a controller (both passes); without it they are skipped.
    pub force: bool,
    /// Remove pods with `emptyDir` volumes (both passes); without it they are refused.
    pub delete_emptydir_data: bool,
    /// Everything else: `timeout` is the deadline for both passes together; `rules.extra` and
    /// `rules.skip_wait_for_delete_timeout` apply to both passes; the other fields of `rules`
    /// are replaced by the ones above.
    pub options: DrainOptions,
}

/// What a finished two-pass drain did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TwoPassReport {
    /// Pass 1.
    pub device: DrainReport,
    /// Pass 2, if it ran.
    pub full_node: Option<DrainReport>,
}

impl TwoPassReport {
    /// The pods left on the node only because force is off, over both passes, each once, in
    /// the order the passes found them. Pass 1's ([`DrainReport::skipped_without_force`] of
    /// [`device`](Self::device)) declare that they use the device, so they will still hold it.
    pub fn skipped_without_force(&self) -> Vec<PodRef> {
        let mut seen = BTreeSet::new();
        let passes = std::iter::once(&self.device).chain(&self.full_node);
        passes
            .flat_map(|r| &r.skipped_without_force)
            .filter(|p| seen.insert(*p))
            .cloned()
            .collect()
    }
}

impl TwoPassDrain {
    /// The passes that run, in order.
    pub fn passes(&self) -> Vec<Pass> {
        if self.full_node {
            vec![Pass::Device, Pass::FullNode]
        } else {
            vec![Pass::Device]
        }
    }

    /// The options of one pass.
    pub fn pass_options(&self, pass: Pass) -> DrainOptions {
        let base = &self.options.rules;
        let rules = match pass {
            Pass::Device => PodRules {
                ignore_daemonsets: true,
                delete_emptydir_data: self.delete_emptydir_data,
                force: self.force,
                skip_unmanaged: true,
                selector: Selector::default(),
                device: Some(self.device.clone()),
                skip_wait_for_delete_timeout: base.skip_wait_for_delete_timeout,
                extra: base.extra.clone(),
            },
            Pass::FullNode => PodRules {
                ignore_daemonsets: true,
                delete_emptydir_data: self.delete_emptydir_data,
                force: self.force,
                skip_unmanaged: true,
                selector: self.pod_selector.clone(),
                device: None,
                skip_wait_for_delete_timeout: base.skip_wait_for_delete_timeout,
                extra: base.extra.clone(),
            },
        };
        DrainOptions {
            rules,
            ..self.options.clone()
        }
    }
}

impl Drainer {
    /// Run `plan`'s passes on `node` one after the other, under one deadline
    /// (`plan.options.timeout`). Emits [`DrainEventKind::PassStarted`] before each pass.
    pub async fn drain_two_pass(
        &self,
        node: &str,
        plan: &TwoPassDrain,
    ) -> Result<TwoPassReport, DrainError> {
        let deadline: Option<(Instant, Duration)> =
            plan.options.timeout.map(|t| (Instant::now() + t, t));
        // Pass 1's listing, when it removed nothing: pass 2 plans from it.
        let mut listing = None;
        let mut run = async |pass: Pass| {
            self.emit(node, DrainEventKind::PassStarted { pass });
            let options = plan.pass_options(pass);
            self.drain_until(node, &options, deadline, Some(pass), &mut listing)
                .await
        };
        let device = run(Pass::Device).await?;
        let full_node = if plan.full_node {
            Some(run(Pass::FullNode).await?)
        } else {
            None
        };
        Ok(TwoPassReport { device, full_node })
    }
}
