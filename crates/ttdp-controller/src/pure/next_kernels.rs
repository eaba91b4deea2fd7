//! Whether the nodes could reboot into each kernel installed on them and find the driver: the
//! policy's `KernelsReady` condition, the counts of the gauge of nodes with a kernel not ready,
//! and which agent start loads are new (observed once each by the start-load histogram). All
//! from the node entries ([`NextKernels`] and [`NodeStartLoad`], which the agents report).

use ttdp_api::NodeStatus;
use ttdp_api::driver::v1alpha1::{KernelNotReady, NextKernelState, NodeStartLoad};

use crate::pure::status::NodeEntries;

/// Reasons of the `KernelsReady` condition.
pub mod reasons {
    /// Every installed kernel the nodes report has the module ready.
    pub const NEXT_KERNELS_READY: &str = "NextKernelsReady";
    /// Some node has an installed kernel without a ready module: booting into it leaves the
    /// node without the driver until the agent builds or downloads one.
    pub const NEXT_KERNEL_WITHOUT_DRIVER: &str = "NextKernelWithoutDriver";
}

/// How many kernels without a ready module the condition's message names; the rest are
/// counted.
pub const KERNELS_NAMED: usize = 4;

/// The most characters of one kernel's account in the condition's message.
const DETAIL_CHARS: usize = 160;

/// The `KernelsReady` condition's status, reason and message for the nodes' `entries`, whose
/// agents prepare tt-kmd `target`.
pub fn kernels_ready(target: &str, entries: &NodeEntries) -> (bool, &'static str, String) {
    let reporting: Vec<&NodeStatus> = entries
        .values()
        .filter(|n| n.next_kernels.is_some())
        .map(|n| &**n)
        .collect();
    let mut missing: Vec<(&str, &KernelNotReady)> = reporting
        .iter()
        .flat_map(|n| {
            let kernels = n.next_kernels.iter().flat_map(|k| &k.not_ready);
            kernels.map(|k| (n.name.as_str(), k))
        })
        .collect();
    let nodes_without = reporting
        .iter()
        .filter(|n| n.next_kernels.as_ref().is_some_and(|k| !k.all_ready()))
        .count();
    if nodes_without == 0 {
        let message = if reporting.is_empty() {
            "no node reports a kernel installed besides the running one".to_owned()
        } else {
            format!(
                "every kernel installed on the {} with more than one kernel has tt-kmd {target} ready",
                nodes(reporting.len())
            )
        };
        return (true, reasons::NEXT_KERNELS_READY, message);
    }
    // Failed kernels first: they need someone; the pending ones are on their way.
    missing.sort_by_key(|(_, k)| k.state);
    let omitted: i32 = reporting
        .iter()
        .filter_map(|n| n.next_kernels.as_ref())
        .map(|k| k.not_ready_omitted)
        .sum();
    let more = missing.len().saturating_sub(KERNELS_NAMED) + usize::try_from(omitted).unwrap_or(0);
    let mut named: Vec<String> = missing
        .iter()
        .take(KERNELS_NAMED)
        .map(|(node, k)| format!("kernel {} on {node} ({})", k.release, detail(k)))
        .collect();
    if more > 0 {
        named.push(format!("and {more} more"));
    }
    let message = format!(
        "{} would boot without tt-kmd {target}: {}",
        nodes(nodes_without),
        named.join("; ")
    );
    (false, reasons::NEXT_KERNEL_WITHOUT_DRIVER, message)
}

/// "1 node would", "2 nodes would".
fn nodes(n: usize) -> String {
    if n == 1 {
        "1 node".to_owned()
    } else {
        format!("{n} nodes")
    }
}

/// What went wrong with one kernel, short: the agent's message, else its reason.
fn detail(k: &KernelNotReady) -> String {
    let text = match (&k.message, &k.reason, k.state) {
        (Some(m), _, _) if !m.is_empty() => m.clone(),
        (_, Some(r), NextKernelState::Failed) => r.clone(),
        (_, Some(r), NextKernelState::Pending) => format!("being prepared: {r}"),
        (_, None, NextKernelState::Failed) => "failed".to_owned(),
        (_, None, NextKernelState::Pending) => "being prepared".to_owned(),
    };
    match text.char_indices().nth(DETAIL_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// How many nodes have a kernel whose module failed, and how many have only kernels still
/// being prepared, among those without a ready module: the gauge's two series.
pub fn nodes_not_ready(entries: &NodeEntries) -> (i64, i64) {
    let (mut failed, mut pending) = (0, 0);
    for kernels in entries.values().filter_map(|n| n.next_kernels.as_ref()) {
        if kernels.any_failed() {
            failed += 1;
        } else if !kernels.all_ready() {
            pending += 1;
        }
    }
    (failed, pending)
}

/// The start load `now` reports that `before` (the node's previous entry) did not: each
/// agent start is observed once, however often the entry is rebuilt.
pub fn new_start_load(before: Option<&NodeStatus>, now: &NodeStatus) -> Option<NodeStartLoad> {
    let load = now.start_load?;
    (before.and_then(|b| b.start_load) != Some(load)).then_some(load)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ttdp_api::NodeState;
    use ttdp_api::agent_report::{KernelModuleState, KernelReadiness};
    use ttdp_api::driver::v1alpha1::NextKernels;

    use super::*;

    fn kernel(release: &str, state: KernelModuleState, message: Option<&str>) -> KernelReadiness {
        KernelReadiness {
            release: release.into(),
            state,
            reason: match state {
                KernelModuleState::Failed => Some("BuildFailed".into()),
                _ => None,
            },
            message: message.map(str::to_owned),
        }
    }

    fn node(name: &str, kernels: &[KernelReadiness]) -> NodeStatus {
        NodeStatus {
            next_kernels: NextKernels::of_report(kernels),
            ..NodeStatus::new(name, NodeState::Done)
        }
    }

    fn entries(nodes: impl IntoIterator<Item = NodeStatus>) -> NodeEntries {
        nodes
            .into_iter()
            .map(|n| (Arc::from(n.name.as_str()), Arc::new(n)))
            .collect()
    }

    #[test]
    fn true_when_every_installed_kernel_is_ready_or_none_is_reported() {
        use KernelModuleState::*;
        let (ok, reason, message) = kernels_ready("2.8.0", &entries([node("tt-1", &[])]));
        assert!(ok);
        assert_eq!(reason, reasons::NEXT_KERNELS_READY);
        assert_eq!(
            message,
            "no node reports a kernel installed besides the running one"
        );
        let ready = entries([
            node("tt-1", &[kernel("6.1.0-60-amd64", Ready, None)]),
            node("tt-2", &[kernel("6.1.0-60-amd64", Ready, None)]),
            node("tt-3", &[]),
        ]);
        assert_eq!(
            kernels_ready("2.8.0", &ready),
            (
                true,
                reasons::NEXT_KERNELS_READY,
                "every kernel installed on the 2 nodes with more than one kernel has tt-kmd 2.8.0 ready".to_owned()
            )
        );
        assert_eq!(nodes_not_ready(&ready), (0, 0));
    }

    #[test]
    fn false_names_the_kernels_failed_first_and_counts_the_rest() {
        use KernelModuleState::*;
        let fleet = entries([
            node(
                "tt-1",
                &[
                    kernel("6.1.0-61-amd64", Pending, None),
                    kernel("6.1.0-60-amd64", Ready, None),
                ],
            ),
            node(
                "tt-3",
                &[kernel(
                    "6.1.0-58-amd64",
                    Failed,
                    Some("make modules failed: implicit declaration of function 'pci_enable_msi'"),
                )],
            ),
            node("tt-5", &[kernel("6.1.0-60-amd64", Ready, None)]),
            node(
                "tt-7",
                &[KernelReadiness {
                    reason: Some("HeadersMissing".into()),
                    ..kernel("6.1.0-60-amd64", Failed, None)
                }],
            ),
        ]);
        let (ok, reason, message) = kernels_ready("2.8.0", &fleet);
        assert!(!ok);
        assert_eq!(reason, reasons::NEXT_KERNEL_WITHOUT_DRIVER);
        assert_eq!(
            message,
            "3 nodes would boot without tt-kmd 2.8.0: \
             kernel 6.1.0-58-amd64 on tt-3 (make modules failed: implicit declaration of function 'pci_enable_msi'); \
             kernel 6.1.0-60-amd64 on tt-7 (HeadersMissing); \
             kernel 6.1.0-61-amd64 on tt-1 (being prepared)"
        );
        assert_eq!(nodes_not_ready(&fleet), (2, 1));

        let many: Vec<KernelReadiness> = (50..57)
            .map(|abi| {
                kernel(
                    &format!("6.1.0-{abi}-amd64"),
                    Failed,
                    Some(&"e".repeat(400)),
                )
            })
            .collect();
        let (_, _, message) = kernels_ready("2.8.0", &entries([node("tt-9", &many)]));
        assert!(
            message.starts_with("1 node would boot without"),
            "{message}"
        );
        assert_eq!(message.matches("kernel 6.1.0-").count(), 3, "{message}");
        assert!(message.ends_with("; and 4 more"), "{message}");
        assert!(message.len() < 1000, "bounded: {}", message.len());
    }

    #[test]
    fn a_start_load_is_new_once() {
        let load = |ms| NodeStartLoad {
            cache_hit: true,
            ready_after_ms: ms,
        };
        let with = |l: Option<NodeStartLoad>| NodeStatus {
            start_load: l,
            ..NodeStatus::new("tt-1", NodeState::Done)
        };
        assert_eq!(
            new_start_load(None, &with(Some(load(2300)))),
            Some(load(2300))
        );
        assert_eq!(new_start_load(None, &with(None)), None);
        let seen = with(Some(load(2300)));
        assert_eq!(new_start_load(Some(&seen), &seen.clone()), None);
        assert_eq!(
            new_start_load(Some(&seen), &with(Some(load(1900)))),
            Some(load(1900))
        );
        assert_eq!(new_start_load(Some(&seen), &with(None)), None);
    }
}
