//! The `nodes` view: one row per node of each policy, answering "why is it stuck": state,
//! current → target version, install mode, who cordoned it, how long it has been in its state,
//! and the controller's reason and message (blocking pods, holders, build errors).

use ttdp_api::NodeState;

use super::kernels::next_kernels_cell;
use super::{RenderOptions, version_change};
use crate::age::age;
use crate::fleet::{Fleet, NodeRow, RowSource, nodes_omitted, policy_name};
use crate::palette::Colour;
use crate::text_table::{Cell, Table};

/// Column headings of the nodes table.
pub const HEADER: [&str; 8] = [
    "POLICY",
    "NODE",
    "STATE",
    "VERSION",
    "MODE",
    "CORDONED-BY",
    "AGE",
    "MESSAGE",
];

/// The cordoned-by cell: the annotation's owner, `<other>` for a node cordoned without it,
/// `-` when not cordoned (or unknown).
pub fn cordoned_by(row: &NodeRow) -> String {
    match (&row.cordoned_by, row.unschedulable) {
        (Some(owner), _) => owner.clone(),
        (None, Some(true)) => "<other>".to_owned(),
        _ => "-".to_owned(),
    }
}

/// The message cell: reason and message, and a pending retry request.
pub fn message(row: &NodeRow) -> String {
    let why = row.why();
    match (row.retry_requested, why.is_empty()) {
        (true, true) => "retry requested".to_owned(),
        (true, false) => format!("{why} (retry requested)"),
        (false, _) => why,
    }
}

/// The cells every node table starts with: node, state, version (or version change) and
/// install mode.
pub fn node_cells(row: &NodeRow) -> [Cell; 4] {
    [
        Cell::plain(row.node.clone()),
        Cell::coloured(row.state.as_str(), Colour::of_state(row.state)),
        Cell::plain(version_change(
            row.state,
            row.current_version.as_deref(),
            &row.target_version,
        )),
        Cell::plain(row.install_mode.clone().unwrap_or_else(|| "-".to_owned())),
    ]
}

/// The table of those of `rows` in `states` (every row when `states` is empty), and a note for
/// each policy whose omitted nodes could not all be found by their labels. A NEXT-KERNELS
/// column (the node's other installed kernels without a ready module) comes after MODE when a
/// node reports other kernels.
pub fn render(
    fleet: &Fleet,
    rows: &[NodeRow],
    states: &[NodeState],
    opts: &RenderOptions,
) -> String {
    let shown: Vec<&NodeRow> = rows
        .iter()
        .filter(|r| crate::view::shows(states, r))
        .collect();
    let with_kernels = shown.iter().any(|r| r.next_kernels.is_some());
    let mut header = Vec::from(HEADER);
    if with_kernels {
        header.insert(5, "NEXT-KERNELS");
    }
    let mut table = Table::new(header);
    for row in shown {
        let mut cells = vec![Cell::plain(row.policy.clone())];
        cells.extend(node_cells(row));
        if with_kernels {
            cells.push(Cell::plain(next_kernels_cell(row.next_kernels.as_ref())));
        }
        cells.extend([
            Cell::plain(cordoned_by(row)),
            Cell::plain(age(row.since, opts.now)),
            Cell::plain(message(row)),
        ]);
        table.push(cells);
    }
    let mut out = table.render(opts.palette);
    for view in &fleet.policies {
        let name = policy_name(&view.policy);
        let omitted = nodes_omitted(&view.policy);
        if omitted <= 0 {
            continue;
        }
        let found = rows
            .iter()
            .filter(|r| r.policy == name && r.source != RowSource::Status)
            .count();
        if found < omitted as usize {
            out.push_str(&format!(
                "\nnote: {name} omits {omitted} Done and waiting nodes from its status; only {found} were found by node labels (are Nodes readable, and does the controller require the NFD label?)\n"
            ));
        }
    }
    out
}
