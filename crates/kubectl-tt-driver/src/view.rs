//! Turns a fleet into the text of a `status` or `nodes` view in the requested output format:
//! the same function serves one-shot commands and every redraw of a watch.

use ttdp_api::NodeState;

use crate::cli::Output;
use crate::error::Error;
use crate::fleet::{Fleet, NodeRow};
use crate::render::status::Layout;
use crate::render::{RenderOptions, nodes, status};
use crate::report::{nodes_report, status_report};

/// Which view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// The policy × node table.
    Status,
    /// The per-node table.
    Nodes,
}

/// A view to show: which, limited to which policy, in which format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// Which view.
    pub view: View,
    /// Only this policy (`nodes POLICY`).
    pub only: Option<&'a str>,
    /// Output format.
    pub output: Output,
    /// `nodes --state`: only nodes in these states (empty: every node).
    pub states: &'a [NodeState],
}

/// Whether a node row is shown under a `--state` filter (an empty filter shows every row).
pub fn shows(states: &[NodeState], row: &NodeRow) -> bool {
    states.is_empty() || states.contains(&row.state)
}

/// The text of `view` of `fleet` in `output` format.
pub fn render(
    fleet: &Fleet,
    view: View,
    output: Output,
    opts: &RenderOptions,
) -> Result<String, Error> {
    render_request(
        fleet,
        &Request {
            view,
            only: None,
            output,
            states: &[],
        },
        opts,
    )
}

/// The text of the view `request` asks for, of `fleet` (already limited to `request.only`).
pub fn render_request(
    fleet: &Fleet,
    request: &Request<'_>,
    opts: &RenderOptions,
) -> Result<String, Error> {
    let shown = || -> Vec<NodeRow> {
        let mut rows = fleet.node_rows();
        rows.retain(|r| shows(request.states, r));
        rows
    };
    match (request.view, request.output) {
        (View::Status, Output::Table) => Ok(status::render(fleet, Layout::PolicyRows, opts)),
        (View::Status, Output::Wide) => Ok(status::render(fleet, Layout::NodeRows, opts)),
        (View::Status, Output::Json) => json(&status_report(fleet)),
        (View::Status, Output::Yaml) => yaml(&status_report(fleet)),
        (View::Nodes, Output::Table | Output::Wide) => Ok(nodes::render(
            fleet,
            &fleet.node_rows(),
            request.states,
            opts,
        )),
        (View::Nodes, Output::Json) => json(&nodes_report(&shown())),
        (View::Nodes, Output::Yaml) => yaml(&nodes_report(&shown())),
    }
}

/// `value` as pretty JSON, newline-terminated.
pub fn json<T: serde::Serialize>(doc: &T) -> Result<String, Error> {
    serde_json::to_string_pretty(doc)
        .map(|s| s + "\n")
        .map_err(|e| Error::Encode {
            format: "json",
            message: e.to_string(),
        })
}

/// `value` as YAML.
pub fn yaml<T: serde::Serialize>(doc: &T) -> Result<String, Error> {
    serde_saphyr::to_string(doc).map_err(|e| Error::Encode {
        format: "yaml",
        message: e.to_string(),
    })
}
