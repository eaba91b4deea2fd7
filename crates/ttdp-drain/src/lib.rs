//! `kubectl drain` semantics for kube-rs operators: cordon with ownership, pod classification,
//! eviction with PodDisruptionBudget back-off, waiting until evicted pods are gone, timeouts that
//! say what blocked, and progress events.
//!
//! What it is for: any operator that must empty a node before changing something on it (a
//! kernel module, firmware, the OS). What it must not do: know about any particular device or
//! workload. Device awareness is a caller-configured [`DevicePredicate`]; extra policy is a
//! caller-supplied [`PodPredicate`].
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), ttdp_drain::DrainError> {
//! use std::time::Duration;
//! use ttdp_drain::{CordonOwner, DrainOptions, Drainer, EventSink, PodRules};
//!
//! let owner = CordonOwner {
//!     owner: "my-operator/upgrade".into(),
//!     owner_annotation: "example.com/cordoned-by".into(),
//!     time_annotation: "example.com/cordoned-at".into(),
//! };
//! let drainer = Drainer::new(client).with_events(EventSink::new(|e| println!("{e:?}")));
//! drainer.cordon("node-1", &owner).await?;
//! let options = DrainOptions {
//!     rules: PodRules { ignore_daemonsets: true, delete_emptydir_data: true, ..Default::default() },
//!     timeout: Some(Duration::from_secs(600)),
//!     ..Default::default()
//! };
//! let report = drainer.drain("node-1", &options).await?;
//! println!("evicted {} pods", report.evicted.len());
//! // ... change the node ...
//! drainer.uncordon("node-1", &owner).await?;
//! # Ok(()) }
//! ```
//!
//! # Pieces
//! - [`cordon()`] / [`uncordon()`]: ownership recorded in caller-named annotations; a node
//!   cordoned by someone else is reported ([`CordonOutcome::External`]) and never claimed or
//!   lifted. [`cordon_with()`] / [`uncordon_with()`] also write a caller's labels and annotations
//!   ([`NodePatchExtras`]) in the same patch, so they change together with the cordon.
//! - [`classify()`]: the pure per-pod decision ([`Disposition`] and [`Reason`]), in kubectl's
//!   order with kubectl's messages; see the [`classify`](mod@classify) module.
//! - [`Drainer::drain`]: list the node's pods (`spec.nodeName` field selector only), classify,
//!   refuse or remove, wait until gone by UID (seen on a watch of the node's pods, with a list
//!   every [`DrainOptions::poll_interval`] as the fallback), all under an optional timeout.
//! - [`TwoPassDrain`] / [`Drainer::drain_two_pass`]: device users first, then the full node.
//! - [`DrainEvent`]s through an [`EventSink`], and [`CounterSnapshot`] counters for metrics.
//! - [`Drainer::wait_for_completion`]: before a drain, let the node's selected pods (jobs)
//!   finish, with a timeout that either goes on to the drain or fails ([`CompletionWait`]).
//!
//! # Differences from `kubectl drain`
//! The set of pods removed is the same as `kubectl drain` with the same flags. How they are
//! removed differs in these places:
//! - **Selector**: `--pod-selector` is evaluated here, not by the API server, so unselected
//!   pods still appear in the result (as [`Reason::NotSelected`]) and a caller can show them.
//! - **Finished pods** (`Succeeded`/`Failed`) are deleted, not evicted. The Eviction API deletes
//!   them without consulting budgets anyway; deleting says so plainly (this needs `delete` on
//!   pods as well as `create` on `pods/eviction`).
//! - **Refused pods**: like kubectl, any refused pod stops the drain before anything is
//!   removed; [`OnRefused::Skip`] instead leaves refused pods and removes the rest.
//! - **Pods only force removes** (no controller, or a DaemonSet that is gone): kubectl without
//!   `--force` refuses them and drains nothing. With [`PodRules::skip_unmanaged`] they are
//!   skipped instead and the rest is drained; [`DrainReport::skipped_without_force`] names
//!   them. [`TwoPassDrain`] always sets it: there `force` means "evict bare pods instead of
//!   skipping them". Off by default, so [`PodRules::default`] stays kubectl.
//! - **Concurrency**: kubectl sends every eviction at once; here at most
//!   [`DrainOptions::concurrency`] requests are in flight (a pod waiting out a back-off does not
//!   hold a slot), which keeps a node with many pods from flooding the API server.
//! - **Order**: evictions a budget guards go first (one `list` of budgets per namespace of the
//!   pods evicted): they are the ones that may wait for replacements, and that wait then runs
//!   beside the other evictions. kubectl goes in list order.
//! - **Budget waits**: kubectl retries a 429 every 5 s; here a refused eviction waits on a watch
//!   of the blocking budget (one per budget per drain, shared by all its blocked pods) and is
//!   retried as soon as the budget's status allows a disruption, at most as many pods per
//!   status change as it allows. The back-off (doubling from [`Backoff::initial`] to
//!   [`Backoff::max`], jittered) is only the upper bound, so without `watch` permission on
//!   budgets a drain is as fast as a timer-driven one. Give the drainer a client built with
//!   `Config::default_retry = false`: kube's own retry would otherwise resend a refused
//!   eviction within milliseconds.
//! - **Granted but not carried out**: the API server's eviction handler records a pod in its
//!   budget's `status.disruptedPods` before deleting it; a request cut off in between (its
//!   client killed) leaves the pod running and counted as disrupted for 2 minutes
//!   ([`DISRUPTED_POD_TIMEOUT`]), so the budget allows one disruption fewer. When a pod this
//!   drain removes is such an entry (granted after the pod was created, at least 20 s from
//!   expiring, pod not terminating), it is deleted directly: the budget already counts it as
//!   disrupted, so this takes nothing more from it. Entries of other pods are named in the
//!   blocked pods' messages with the time they expire ([`held_text`]).
//! - **Transient errors** (5xx, connection failures) are retried with the same back-off until the
//!   timeout; kubectl gives up on the pod at once. Other errors fail the pod, the other pods
//!   carry on, and the drain ends with [`DrainError::Failed`].
//! - **UID preconditions**: every eviction and deletion carries the pod's UID, so a new pod that
//!   took the name of a removed one (a StatefulSet replica) is never removed by mistake.
//! - **Waiting**: one `LIST` of the node's pods per [`DrainOptions::poll_interval`] instead of
//!   one `GET` per pod per second; a pod is gone when no pod with its UID is left on the node.
//! - **Timeout**: kubectl reports "global timeout reached"; here [`DrainError::Timeout`] names
//!   every remaining pod and why, e.g. `default/web-0: eviction blocked by PodDisruptionBudget
//!   default/web-pdb (0 disruptions allowed)` or `default/db-0: still terminating (removal
//!   accepted 42s ago; grace period 30s; finalizers: example.com/flush)`.
//! - **Cordon ownership**: kubectl does not record who cordoned a node and `kubectl uncordon`
//!   lifts any cordon. Here the owner and time are recorded and only the owner's cordon is
//!   lifted. Like kubectl, a drain still runs on a node someone else cordoned.
//! - **Dry run** is client-side only (`--dry-run=client`); there is no server dry run.
//! - **Device scope and two passes** ([`DevicePredicate`], [`TwoPassDrain`]) are not in kubectl.
//! - **Events** replace kubectl's printed lines; `examples/drain.rs` prints them in kubectl's
//!   words.
//! - **Uncordoning a deleted node** is [`UncordonOutcome::NodeMissing`], not an error, so cleanup
//!   after a node left the cluster does not get stuck.
//!
//! As in kubectl: pods already terminating are evicted again and waited for (unless
//! [`PodRules::skip_wait_for_delete_timeout`] skips them); a 403 with cause
//! `NamespaceTerminating` counts as accepted; a pod selected by more than one budget fails
//! (the API server refuses such evictions); DaemonSet controller references are checked with a
//! `GET` so a pod whose DaemonSet is gone needs `force`.
#![deny(missing_docs)]

mod backoff;
mod budget;
mod budget_watch;
pub mod classify;
mod completion;
mod cordon;
mod counters;
mod daemonsets_seen;
mod device;
mod drainer;
mod error;
mod event;
mod node_patch;
mod node_pods;
mod pod_ref;
mod removal;
mod report;
mod two_pass;

pub use backoff::Backoff;
pub use budget::{
    BudgetFound, DISRUPTED_POD_TIMEOUT, HeldDisruption, disruption_already_granted, find_budget,
    held_disruptions, held_text, selects as budget_selects,
};
pub use classify::{
    CallerVerdict, ClassifyContext, DaemonSetLookup, Disposition, PodDecision, PodPredicate,
    PodRules, Reason, classify, classify_all,
};
pub use completion::{CompletionWait, OnCompletionTimeout, unfinished};
pub use cordon::{
    CordonOutcome, CordonOwner, UncordonOutcome, cordon, cordon_with, cordon_with_cached, uncordon,
    uncordon_with,
};
pub use counters::{CounterSnapshot, DrainCounters};
pub use daemonsets_seen::DaemonSetsSeen;
pub use device::DevicePredicate;
pub use drainer::{DrainOptions, Drainer, OnRefused};
pub use error::DrainError;
pub use event::{DrainEvent, DrainEventKind, EventSink, Pass, Removal};
pub use node_patch::{ExtrasFor, NodePatchExtras};
pub use node_pods::list_node_pods;
pub use pod_ref::{ObjectKey, PodRef};
pub use report::{DrainReport, StuckPod, StuckReason};
/// The label selector classification, completion waits and two-pass drains take (from
/// `ttdp-selector`, re-exported so callers need not depend on it).
pub use ttdp_selector::Selector;
pub use two_pass::{TwoPassDrain, TwoPassReport};

/// The README's example, compiled as a doctest so it cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
