//! What the node tables show of the kernels a node could boot into and of its loaded module's
//! signer: a short NEXT-KERNELS cell (the kernels without a ready module, then how many are
//! ready), a SIGNER cell, and `describe`'s lines saying why each kernel is not ready.

use ttdp_api::driver::v1alpha1::{NextKernelState, NextKernels};

use crate::fleet::NodeRow;

/// The NEXT-KERNELS cell: `-` when the node reports no other kernel, `2 ready` when all are,
/// else each kernel without a ready module with its reason (or state), then the ready count:
/// `6.1.0-58-amd64 BuildFailed, 6.1.0-61-amd64 Pending; 1 ready`.
pub fn next_kernels_cell(kernels: Option<&NextKernels>) -> String {
    let Some(k) = kernels else {
        return "-".to_owned();
    };
    let mut missing: Vec<String> = k
        .not_ready
        .iter()
        .map(|n| {
            let why = match (&n.reason, n.state) {
                (Some(reason), NextKernelState::Failed) => reason.clone(),
                _ => n.state.as_str().to_owned(),
            };
            format!("{} {why}", n.release)
        })
        .collect();
    if k.not_ready_omitted > 0 {
        missing.push(format!("{} more", k.not_ready_omitted));
    }
    let ready = format!("{} ready", k.ready);
    if missing.is_empty() {
        ready
    } else {
        format!("{}; {ready}", missing.join(", "))
    }
}

/// The SIGNER cell: who signed the loaded module, `-` when unsigned or not reported.
pub fn signer_cell(row: &NodeRow) -> String {
    row.module_signer.clone().unwrap_or_else(|| "-".to_owned())
}

/// One line per kernel without a ready module, node by node:
/// `tt-3: kernel 6.1.0-58-amd64 Failed (BuildFailed): make modules failed ...`.
pub fn not_ready_lines(rows: &[NodeRow]) -> Vec<String> {
    let mut lines = Vec::new();
    for row in rows {
        let Some(k) = &row.next_kernels else {
            continue;
        };
        for n in &k.not_ready {
            let mut line = format!("{}: kernel {} {}", row.node, n.release, n.state.as_str());
            if let Some(reason) = &n.reason {
                line.push_str(&format!(" ({reason})"));
            }
            if let Some(message) = n.message.as_deref().filter(|m| !m.is_empty()) {
                line.push_str(&format!(": {message}"));
            }
            lines.push(line);
        }
        if k.not_ready_omitted > 0 {
            lines.push(format!(
                "{}: and {} more kernels without a ready module",
                row.node, k.not_ready_omitted
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use ttdp_api::driver::v1alpha1::KernelNotReady;

    use super::*;

    fn not_ready(release: &str, state: NextKernelState, reason: Option<&str>) -> KernelNotReady {
        KernelNotReady {
            release: release.into(),
            state,
            reason: reason.map(str::to_owned),
            message: None,
        }
    }

    #[test]
    fn the_cell_names_the_kernels_without_a_module_then_the_ready_count() {
        assert_eq!(next_kernels_cell(None), "-");
        let ready = NextKernels {
            ready: 2,
            ..NextKernels::default()
        };
        assert_eq!(next_kernels_cell(Some(&ready)), "2 ready");
        let mixed = NextKernels {
            ready: 1,
            not_ready: vec![
                not_ready(
                    "6.1.0-58-amd64",
                    NextKernelState::Failed,
                    Some("BuildFailed"),
                ),
                not_ready("6.1.0-61-amd64", NextKernelState::Pending, Some("Building")),
            ],
            not_ready_omitted: 2,
        };
        assert_eq!(
            next_kernels_cell(Some(&mixed)),
            "6.1.0-58-amd64 BuildFailed, 6.1.0-61-amd64 Pending, 2 more; 1 ready"
        );
    }
}
