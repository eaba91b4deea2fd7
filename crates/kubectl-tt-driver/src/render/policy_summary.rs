//! The summary lines under the status table: one line per policy with its version and counts,
//! then indented notes for what needs attention (conditions that are not OK, no status yet, a
//! status behind the spec, Done and waiting nodes left out of the status).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use ttdp_api::driver::v1alpha1::condition;

use crate::fleet::{PolicyView, nodes_omitted, policy_name};
use crate::palette::{Colour, Palette};

/// Whether a condition is one the user should look at. `Progressing` and `Paused` are
/// informational; `Ready=False` during a rollout (`Progressing=True`) is expected.
pub fn condition_needs_attention(c: &Condition, all: &[Condition]) -> bool {
    match c.type_.as_str() {
        condition::READY => {
            let progressing = all
                .iter()
                .any(|o| o.type_ == condition::PROGRESSING && o.status == "True");
            c.status != "True" && !progressing
        }
        condition::DEGRADED | condition::INVALID_SPEC => c.status != "False",
        _ => false,
    }
}

/// `Type=Status (Reason): message`.
pub fn condition_line(c: &Condition) -> String {
    let mut line = format!("{}={}", c.type_, c.status);
    if !c.reason.is_empty() {
        line.push_str(&format!(" ({})", c.reason));
    }
    if !c.message.is_empty() {
        line.push_str(&format!(": {}", c.message));
    }
    line
}

/// The summary line and notes of one policy, each line ending in `\n`.
pub fn render(view: &PolicyView, palette: Palette) -> String {
    let policy = &view.policy;
    let name = policy_name(policy);
    let mut out = format!("{name}: version {}", policy.spec.version);
    let status = policy.status.as_ref();
    if let Some(s) = status.and_then(|s| s.summary.as_ref()) {
        out.push_str(&format!(
            ", matched {}, up-to-date {}, in-progress {}, failed {}",
            s.matched, s.up_to_date, s.in_progress, s.failed
        ));
    }
    if policy.spec.paused {
        out.push_str(", ");
        out.push_str(&palette.paint("paused", Some(Colour::Yellow)));
    }
    out.push('\n');
    if let Some(s) = status.and_then(|s| s.summary.as_ref()) {
        let others: Vec<String> = [
            ("pending", s.pending),
            ("host-managed", s.host_managed),
            ("conflicts", s.conflicts),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(label, n)| format!("{label} {n}"))
        .collect();
        if !others.is_empty() {
            out.push_str(&format!("  {}\n", others.join(", ")));
        }
    }
    if let Some(ds) = &view.daemonset {
        out.push_str(&format!(
            "  daemonset {}/{}: {}/{} ready\n",
            ds.namespace, ds.name, ds.ready, ds.desired
        ));
    }

    let Some(status) = status else {
        out.push_str(&format!(
            "  no status yet: the controller has not reported on {name}; is ttdp-controller running?\n"
        ));
        return out;
    };
    if let (Some(observed), Some(generation)) =
        (status.observed_generation, policy.metadata.generation)
        && observed < generation
    {
        out.push_str(&format!(
            "  status describes generation {observed}, the spec is at generation {generation}: the controller has not caught up yet\n"
        ));
    }
    for c in &status.conditions {
        if condition_needs_attention(c, &status.conditions) {
            out.push_str("  ");
            out.push_str(&palette.paint(&condition_line(c), Some(Colour::Red)));
            out.push('\n');
        }
    }
    let omitted = nodes_omitted(policy);
    if omitted > 0 {
        out.push_str(&format!(
            "  {omitted} Done and waiting nodes are omitted from status.nodes to keep it small; list every node (from node labels) with: kubectl tt driver nodes {name}\n"
        ));
    }
    out
}
