//! The default view: one row per policy, one column per node (sorted), each cell the node's
//! state and loaded version coloured by state; wide fleets wrap into blocks that fit the
//! terminal. `-o wide` turns it into one row per node and one column per policy. Summary lines
//! per policy follow the table.

use std::collections::BTreeMap;

use ttdp_api::NodeStatus;

use super::{RenderOptions, policy_summary};
use crate::fleet::{Fleet, listed_nodes, policy_name};
use crate::palette::Colour;
use crate::text_table::{COLUMN_GAP, Cell, Table};

/// How the status table is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// A row per policy, a column per node, wrapped into blocks to fit the width.
    PolicyRows,
    /// A row per node, a column per policy (`-o wide`).
    NodeRows,
}

/// The cell of a node: `State version`, or `-` when the policy does not list the node.
pub fn node_cell(node: Option<&NodeStatus>) -> Cell {
    match node {
        Some(n) => {
            let text = match &n.current_version {
                Some(v) => format!("{} {v}", n.state),
                None => n.state.to_string(),
            };
            Cell::coloured(text, Colour::of_state(n.state))
        }
        None => Cell::plain("-"),
    }
}

/// The whole status view.
pub fn render(fleet: &Fleet, layout: Layout, opts: &RenderOptions) -> String {
    let mut out = match layout {
        Layout::PolicyRows => policy_rows(fleet, opts),
        Layout::NodeRows => node_rows(fleet, opts),
    };
    if !out.is_empty() {
        out.push('\n');
    }
    for view in &fleet.policies {
        out.push_str(&policy_summary::render(view, opts.palette, opts.now));
    }
    out
}

/// Each policy's nodes by name.
fn by_name(fleet: &Fleet) -> Vec<BTreeMap<&str, &NodeStatus>> {
    fleet
        .policies
        .iter()
        .map(|p| {
            listed_nodes(&p.policy)
                .iter()
                .map(|n| (n.name.as_str(), n))
                .collect()
        })
        .collect()
}

fn policy_rows(fleet: &Fleet, opts: &RenderOptions) -> String {
    let nodes = fleet.listed_node_names();
    if nodes.is_empty() {
        return String::new();
    }
    let per_policy = by_name(fleet);
    let cells: Vec<Vec<Cell>> = per_policy
        .iter()
        .map(|m| {
            nodes
                .iter()
                .map(|n| node_cell(m.get(n.as_str()).copied()))
                .collect()
        })
        .collect();
    let names: Vec<&str> = fleet
        .policies
        .iter()
        .map(|p| policy_name(&p.policy))
        .collect();
    let first_width = names
        .iter()
        .map(|n| n.chars().count())
        .chain(["POLICY".len()])
        .max()
        .unwrap_or(0);
    let widths: Vec<usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            cells
                .iter()
                .map(|row| row[i].width())
                .chain([n.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();

    let mut blocks = Vec::new();
    let mut start = 0;
    while start < nodes.len() {
        let mut used = first_width;
        let mut end = start;
        while end < nodes.len() && (end == start || used + COLUMN_GAP + widths[end] <= opts.width) {
            used += COLUMN_GAP + widths[end];
            end += 1;
        }
        let mut table = Table::new(
            std::iter::once("POLICY".to_owned()).chain(nodes[start..end].iter().cloned()),
        );
        for (name, row) in names.iter().zip(&cells) {
            table.push(
                std::iter::once(Cell::plain(*name))
                    .chain(row[start..end].iter().cloned())
                    .collect(),
            );
        }
        blocks.push(table.render(opts.palette));
        start = end;
    }
    blocks.join("\n")
}

fn node_rows(fleet: &Fleet, opts: &RenderOptions) -> String {
    let nodes = fleet.listed_node_names();
    if nodes.is_empty() {
        return String::new();
    }
    let per_policy = by_name(fleet);
    let mut table = Table::new(
        std::iter::once("NODE".to_owned()).chain(
            fleet
                .policies
                .iter()
                .map(|p| policy_name(&p.policy).to_owned()),
        ),
    );
    for node in &nodes {
        table.push(
            std::iter::once(Cell::plain(node.clone()))
                .chain(
                    per_policy
                        .iter()
                        .map(|m| node_cell(m.get(node.as_str()).copied())),
                )
                .collect(),
        );
    }
    table.render(opts.palette)
}
