//! Pod classification: what a drain does with each pod on a node, and why.
//!
//! [`classify`] is a pure function of the pod, the [`PodRules`] and a [`ClassifyContext`] (the
//! current time and what the caller found out about DaemonSets). It applies the checks in this
//! order and stops at the first that decides:
//!
//! 1. the pod selector ([`PodRules::selector`]): unselected pods are skipped
//!    (`kubectl drain --pod-selector` filters them out when listing);
//! 2. the device scope ([`PodRules::device`]): pods that do not use the device are skipped;
//! 3. pods terminating for longer than [`PodRules::skip_wait_for_delete_timeout`] are skipped;
//! 4. DaemonSet-managed pods that have not finished: skipped with
//!    [`ignore_daemonsets`](PodRules::ignore_daemonsets), refused without it; a pod whose
//!    DaemonSet no longer exists is removed with [`force`](PodRules::force), and without it
//!    refused, or skipped with [`skip_unmanaged`](PodRules::skip_unmanaged);
//! 5. mirror (static) pods are skipped;
//! 6. with [`skip_unmanaged`](PodRules::skip_unmanaged) and without [`force`](PodRules::force),
//!    unfinished pods without a controller are skipped ([`Reason::UnmanagedSkipped`]), before
//!    the `emptyDir` check: a pod that stays keeps its data;
//! 7. unfinished pods with `emptyDir` volumes are refused without
//!    [`delete_emptydir_data`](PodRules::delete_emptydir_data);
//! 8. unfinished pods without a controller are refused without [`force`](PodRules::force);
//! 9. the caller's [`extra`](PodRules::extra) predicate;
//! 10. what is left is removed: finished pods (`Succeeded`/`Failed`) are deleted, all others
//!     evicted.
//!
//! Steps 3 to 8 are `kubectl drain`'s filters in kubectl's order with kubectl's messages, so a
//! caller can print them the way kubectl does. Step 6 and the skip in step 4 are not in
//! kubectl: `kubectl drain` without `--force` refuses those pods and drains nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use ttdp_selector::Selector;

use crate::device::DevicePredicate;
use crate::pod_ref::{ObjectKey, PodRef};

/// The annotation the kubelet puts on mirror pods of static pods.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Which pods a drain removes. [`Default`] is `kubectl drain` without flags: every pod
/// selected, DaemonSet pods, bare pods and pods with `emptyDir` refused.
#[derive(Clone, Debug, Default)]
pub struct PodRules {
    /// Skip DaemonSet-managed pods instead of refusing to drain (`--ignore-daemonsets`).
    pub ignore_daemonsets: bool,
    /// Remove pods with `emptyDir` volumes, losing their data (`--delete-emptydir-data`).
    pub delete_emptydir_data: bool,
    /// Remove pods without a controller and pods whose DaemonSet is gone (`--force`).
    pub force: bool,
    /// Without [`force`](Self::force), skip the pods it would remove (pods without a
    /// controller, pods whose DaemonSet is gone) and drain the rest, instead of refusing to
    /// drain. Not in `kubectl drain`, which refuses them; no effect with `force`. The skipped
    /// pods are the ones [`PodDecision::skipped_without_force`] picks out.
    pub skip_unmanaged: bool,
    /// Only pods whose labels match (`--pod-selector`); the empty selector selects every pod.
    pub selector: Selector,
    /// Only pods that use this device; `None` considers every pod.
    pub device: Option<DevicePredicate>,
    /// Skip pods that have been terminating for longer than this
    /// (`--skip-wait-for-delete-timeout`); `None` waits for every pod.
    pub skip_wait_for_delete_timeout: Option<Duration>,
    /// The caller's own check, applied after kubectl's.
    pub extra: Option<PodPredicate>,
}

/// What the caller's [`PodPredicate`] says about a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallerVerdict {
    /// No objection: kubectl's rules decide.
    Allow,
    /// Leave the pod alone, for this reason.
    Skip(String),
    /// Refuse to drain because of this pod, for this reason.
    Refuse(String),
}

/// A caller-supplied check run after kubectl's rules (kubectl's `AdditionalFilters`).
#[derive(Clone)]
pub struct PodPredicate(Arc<dyn Fn(&Pod) -> CallerVerdict + Send + Sync>);

impl PodPredicate {
    /// Wrap a function.
    pub fn new(check: impl Fn(&Pod) -> CallerVerdict + Send + Sync + 'static) -> Self {
        Self(Arc::new(check))
    }

    /// Run the check.
    pub fn check(&self, pod: &Pod) -> CallerVerdict {
        (self.0)(pod)
    }
}

impl fmt::Debug for PodPredicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PodPredicate(..)")
    }
}

/// What a drain does with a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Disposition {
    /// Evict it through the Eviction API, honouring PodDisruptionBudgets (or delete it when
    /// eviction is disabled).
    Evict,
    /// Delete it: it has finished, so no budget counts it.
    Delete,
    /// Leave it on the node.
    Skip,
    /// It may not be removed with these rules; the drain refuses to start.
    Refuse,
}

impl Disposition {
    /// Whether the drain removes the pod.
    pub fn removes(self) -> bool {
        matches!(self, Self::Evict | Self::Delete)
    }
}

/// Why a pod got its [`Disposition`], or a warning about a pod that is removed.
///
/// The `Display` text of kubectl's reasons is kubectl's own message, the same for every pod with
/// that reason, so pods can be grouped the way `kubectl drain` prints them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Its labels do not match the pod selector (skipped).
    NotSelected,
    /// It does not use the device (skipped).
    NotDeviceUser,
    /// It has been terminating for longer than the skip-wait-for-delete timeout (skipped).
    DeletionOverdue,
    /// It is DaemonSet-managed and DaemonSet pods are ignored (skipped).
    DaemonSetIgnored,
    /// It is DaemonSet-managed and DaemonSet pods are not ignored (refused).
    DaemonSetManaged,
    /// Its controlling DaemonSet does not exist (refused without force; a warning with force).
    DaemonSetMissing {
        /// The DaemonSet its controller reference names.
        daemonset: ObjectKey,
    },
    /// Looking up its controlling DaemonSet failed (refused).
    DaemonSetUnknown {
        /// The DaemonSet its controller reference names.
        daemonset: ObjectKey,
        /// The lookup error.
        error: String,
    },
    /// It is the mirror of a static pod; only the kubelet can remove it (skipped).
    Mirror,
    /// It has `emptyDir` volumes and their data may not be deleted (refused).
    LocalStorage,
    /// Warning: it has `emptyDir` volumes whose data is lost.
    DeletingLocalStorage,
    /// It has no controller, so nothing recreates it (refused).
    Unmanaged,
    /// It has no controller and is left on the node because force is off (skipped; not in
    /// kubectl, see [`PodRules::skip_unmanaged`]).
    UnmanagedSkipped,
    /// Warning: it has no controller and is removed anyway.
    DeletingUnmanaged,
    /// It has no controller and is removed because of force.
    NoController,
    /// It has finished (deleted without eviction).
    Finished {
        /// `Succeeded` or `Failed`.
        phase: String,
    },
    /// It has a controller that recreates it elsewhere (evicted).
    Controlled {
        /// The controller's kind, e.g. `ReplicaSet`.
        kind: String,
        /// The controller's name.
        name: String,
    },
    /// The caller's predicate decided.
    Caller(String),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotSelected => f.write_str("not selected by the pod selector"),
            Self::NotDeviceUser => f.write_str("does not use the device"),
            Self::DeletionOverdue => {
                f.write_str("terminating for longer than the skip-wait-for-delete timeout")
            }
            Self::DaemonSetIgnored => f.write_str("ignoring DaemonSet-managed Pods"),
            Self::DaemonSetManaged => {
                f.write_str("DaemonSet-managed Pods (use --ignore-daemonsets to ignore)")
            }
            Self::DaemonSetMissing { daemonset } => {
                write!(f, "daemonsets.apps \"{}\" not found", daemonset.name)
            }
            Self::DaemonSetUnknown { daemonset, error } => {
                write!(f, "cannot look up DaemonSet {daemonset}: {error}")
            }
            Self::Mirror => f.write_str("mirror pod of a static pod"),
            Self::LocalStorage => {
                f.write_str("Pods with local storage (use --delete-emptydir-data to override)")
            }
            Self::DeletingLocalStorage => f.write_str("deleting Pods with local storage"),
            Self::Unmanaged => f.write_str(
                "cannot delete Pods that declare no controller (use --force to override)",
            ),
            Self::UnmanagedSkipped => {
                f.write_str("declares no controller; skipped because force is off")
            }
            Self::DeletingUnmanaged => f.write_str("deleting Pods that declare no controller"),
            Self::NoController => f.write_str("declares no controller; removed because of force"),
            Self::Finished { phase } => write!(f, "pod has finished ({phase})"),
            Self::Controlled { kind, name } => write!(f, "controlled by {kind} {name}"),
            Self::Caller(message) => f.write_str(message),
        }
    }
}

/// The decision about one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodDecision {
    /// The pod.
    pub pod: PodRef,
    /// What the drain does with it.
    pub disposition: Disposition,
    /// Why.
    pub reason: Reason,
    /// kubectl's warnings about removing it ([`Reason::DeletingLocalStorage`],
    /// [`Reason::DeletingUnmanaged`], [`Reason::DaemonSetMissing`]); empty unless it is removed.
    pub warnings: Vec<Reason>,
}

impl PodDecision {
    /// Whether the pod is left on the node only because force is off: a pod without a
    /// controller, or whose DaemonSet is gone, skipped under [`PodRules::skip_unmanaged`].
    pub fn skipped_without_force(&self) -> bool {
        self.disposition == Disposition::Skip
            && matches!(
                self.reason,
                Reason::UnmanagedSkipped | Reason::DaemonSetMissing { .. }
            )
    }
}

/// What a DaemonSet lookup found, for [`ClassifyContext::daemonsets`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DaemonSetLookup {
    /// The DaemonSet does not exist (the API answered 404).
    Missing,
    /// The lookup failed with this error.
    Failed(String),
}

/// What classification needs besides the pod and the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassifyContext {
    /// The current time (for [`PodRules::skip_wait_for_delete_timeout`]).
    pub now: Timestamp,
    /// DaemonSets that controller references name but that could not be found; a DaemonSet not
    /// in this map exists.
    pub daemonsets: BTreeMap<ObjectKey, DaemonSetLookup>,
}

impl ClassifyContext {
    /// A context at `now` in which every DaemonSet exists.
    pub fn at(now: Timestamp) -> Self {
        Self {
            now,
            daemonsets: BTreeMap::new(),
        }
    }
}

/// The controller reference of a pod (`ownerReferences` entry with `controller: true`).
pub fn controller_of(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// Whether the pod has finished: phase `Succeeded` or `Failed`.
pub fn has_finished(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// The DaemonSet whose existence [`classify`] needs to know for this pod, if any: set for
/// unfinished, DaemonSet-controlled pods within the rules' selector and device scope.
pub fn daemonset_to_look_up(pod: &Pod, rules: &PodRules) -> Option<ObjectKey> {
    if !in_scope(pod, rules) || has_finished(pod) {
        return None;
    }
    let controller = controller_of(pod).filter(|c| c.kind == "DaemonSet")?;
    Some(ObjectKey::new(
        pod.metadata.namespace.clone().unwrap_or_default(),
        controller.name.clone(),
    ))
}

fn in_scope(pod: &Pod, rules: &PodRules) -> bool {
    let selected = match &pod.metadata.labels {
        Some(labels) => rules.selector.matches(labels),
        None => rules.selector.matches(&BTreeMap::new()),
    };
    selected && rules.device.as_ref().is_none_or(|d| d.matches(pod))
}

fn has_empty_dir(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| v.empty_dir.is_some())
}

fn deletion_overdue(pod: &Pod, rules: &PodRules, now: Timestamp) -> bool {
    let (Some(limit), Some(since)) = (
        rules.skip_wait_for_delete_timeout,
        &pod.metadata.deletion_timestamp,
    ) else {
        return false;
    };
    let Ok(limit) = jiff::SignedDuration::try_from(limit) else {
        return false;
    };
    since.0.checked_add(limit).is_ok_and(|until| until < now)
}

/// A check's verdict that ends classification.
type Verdict = (Disposition, Reason);

/// Decide what a drain with `rules` does with `pod`. See the module docs for the order.
pub fn classify(pod: &Pod, rules: &PodRules, ctx: &ClassifyContext) -> PodDecision {
    let mut warnings = Vec::new();
    let (disposition, reason) = match verdict(pod, rules, ctx, &mut warnings) {
        Ok(removal) => removal,
        Err(verdict) => {
            warnings.clear();
            verdict
        }
    };
    PodDecision {
        pod: PodRef::of(pod),
        disposition,
        reason,
        warnings,
    }
}

/// The checks in order: `Err` is a check that decided (skip or refuse), `Ok` the removal of
/// what is left. Warnings about removing the pod are pushed to `warnings`.
fn verdict(
    pod: &Pod,
    rules: &PodRules,
    ctx: &ClassifyContext,
    warnings: &mut Vec<Reason>,
) -> Result<Verdict, Verdict> {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    if !rules.selector.matches(&labels) {
        return Err((Disposition::Skip, Reason::NotSelected));
    }
    if rules.device.as_ref().is_some_and(|d| !d.matches(pod)) {
        return Err((Disposition::Skip, Reason::NotDeviceUser));
    }
    if deletion_overdue(pod, rules, ctx.now) {
        return Err((Disposition::Skip, Reason::DeletionOverdue));
    }
    check_daemonset(pod, rules, ctx, warnings)?;
    if is_mirror(pod) {
        return Err((Disposition::Skip, Reason::Mirror));
    }
    check_local_data(pod, rules, warnings)?;
    if let Some(extra) = &rules.extra {
        match extra.check(pod) {
            CallerVerdict::Allow => {}
            CallerVerdict::Skip(why) => return Err((Disposition::Skip, Reason::Caller(why))),
            CallerVerdict::Refuse(why) => return Err((Disposition::Refuse, Reason::Caller(why))),
        }
    }
    Ok(removal(pod))
}

/// Step 4: DaemonSet-managed pods.
fn check_daemonset(
    pod: &Pod,
    rules: &PodRules,
    ctx: &ClassifyContext,
    warnings: &mut Vec<Reason>,
) -> Result<(), Verdict> {
    let Some(daemonset) = daemonset_to_look_up(pod, rules) else {
        return Ok(());
    };
    match ctx.daemonsets.get(&daemonset) {
        Some(DaemonSetLookup::Missing) if rules.force => {
            warnings.push(Reason::DaemonSetMissing { daemonset });
            Ok(())
        }
        Some(DaemonSetLookup::Missing) => {
            Err((unforced(rules), Reason::DaemonSetMissing { daemonset }))
        }
        Some(DaemonSetLookup::Failed(error)) => {
            let error = error.clone();
            Err((
                Disposition::Refuse,
                Reason::DaemonSetUnknown { daemonset, error },
            ))
        }
        None if rules.ignore_daemonsets => Err((Disposition::Skip, Reason::DaemonSetIgnored)),
        None => Err((Disposition::Refuse, Reason::DaemonSetManaged)),
    }
}

/// What happens without force to a pod that only force removes.
fn unforced(rules: &PodRules) -> Disposition {
    if rules.skip_unmanaged {
        Disposition::Skip
    } else {
        Disposition::Refuse
    }
}

fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

/// Steps 6 to 8: unfinished pods that nothing recreates, and pods with `emptyDir` data.
fn check_local_data(
    pod: &Pod,
    rules: &PodRules,
    warnings: &mut Vec<Reason>,
) -> Result<(), Verdict> {
    if has_finished(pod) {
        return Ok(());
    }
    let unmanaged = controller_of(pod).is_none();
    if unmanaged && !rules.force && rules.skip_unmanaged {
        return Err((Disposition::Skip, Reason::UnmanagedSkipped));
    }
    if has_empty_dir(pod) {
        if !rules.delete_emptydir_data {
            return Err((Disposition::Refuse, Reason::LocalStorage));
        }
        warnings.push(Reason::DeletingLocalStorage);
    }
    if unmanaged {
        if !rules.force {
            return Err((Disposition::Refuse, Reason::Unmanaged));
        }
        warnings.push(Reason::DeletingUnmanaged);
    }
    Ok(())
}

/// Step 10: finished pods are deleted, the others evicted.
fn removal(pod: &Pod) -> Verdict {
    if has_finished(pod) {
        let phase = phase(pod).to_owned();
        return (Disposition::Delete, Reason::Finished { phase });
    }
    let reason = match controller_of(pod) {
        Some(c) => Reason::Controlled {
            kind: c.kind.clone(),
            name: c.name.clone(),
        },
        None => Reason::NoController,
    };
    (Disposition::Evict, reason)
}

/// [`classify`] every pod, keeping their order.
pub fn classify_all<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    rules: &PodRules,
    ctx: &ClassifyContext,
) -> Vec<PodDecision> {
    pods.into_iter().map(|p| classify(p, rules, ctx)).collect()
}
