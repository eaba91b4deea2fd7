//! The summary lines under the status table: one line per policy with its version and counts,
//! then indented notes for what needs attention (conditions that are not OK, no status yet, a
//! status behind the spec, Done and waiting nodes left out of the status), and where a guarded
//! rollout stands (canary, soak with the time left, halt, next maintenance window).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use ttdp_api::driver::v1alpha1::{RolloutStatus, condition, rollout_phase as phase};

use crate::age::human_duration;

use crate::fleet::{PolicyView, nodes_omitted, policy_name};
use crate::palette::{Colour, Palette};

/// Whether a condition is one the user should look at. `Progressing` and `Paused` are
/// informational; `Ready=False` during a rollout (`Progressing=True`) is expected;
/// `KernelsReady=False` says which nodes would reboot without the driver.
pub fn condition_needs_attention(c: &Condition, all: &[Condition]) -> bool {
    match c.type_.as_str() {
        condition::READY => {
            let progressing = all
                .iter()
                .any(|o| o.type_ == condition::PROGRESSING && o.status == "True");
            c.status != "True" && !progressing
        }
        condition::DEGRADED | condition::INVALID_SPEC => c.status != "False",
        // False: some node would boot into a kernel without the driver.
        condition::KERNELS_READY => c.status == "False",
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
pub fn render(view: &PolicyView, palette: Palette, now: Timestamp) -> String {
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

    if let Some(rollout) = status.and_then(|s| s.rollout.as_ref()) {
        for (line, colour) in rollout_lines(rollout, now) {
            out.push_str("  ");
            out.push_str(&palette.paint(&line, colour));
            out.push('\n');
        }
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

/// Where a guarded rollout stands: its phase (with the soak's time left) and, outside every
/// maintenance window, when the next one opens.
pub fn rollout_lines(r: &RolloutStatus, now: Timestamp) -> Vec<(String, Option<Colour>)> {
    let left = |t: Timestamp| human_duration(t.duration_since(now).max(jiff::SignedDuration::ZERO));
    let canaries = r.canary_nodes.join(", ");
    let mut lines = Vec::new();
    let halted = r.halted_by.clone().unwrap_or_default();
    let from = r.from_version.clone().unwrap_or_default();
    let phase_line = match r.phase.as_str() {
        phase::CANARY => Some((
            format!("canary: upgrading {canaries} first"),
            Some(Colour::Cyan),
        )),
        phase::SOAKING => r.soak_until.as_ref().map(|t| {
            (
                format!("canary: soaking, {} left ({canaries})", left(t.0)),
                Some(Colour::Cyan),
            )
        }),
        phase::ROLLING if !r.canary_nodes.is_empty() => {
            Some(("canary passed: rolling out to the rest".to_owned(), None))
        }
        phase::HALTED => Some((
            format!(
                "halted: {halted}; retry or skip the node to go on (kubectl tt driver retry|skip)"
            ),
            Some(Colour::Red),
        )),
        phase::ROLLING_BACK => Some((
            format!("halted, rolling the canary back to {from}: {halted}"),
            Some(Colour::Red),
        )),
        phase::ROLLED_BACK => Some((
            format!("halted, canary rolled back to {from}: {halted}; change spec.version to go on"),
            Some(Colour::Red),
        )),
        _ => None,
    };
    lines.extend(phase_line);
    if let Some(t) = &r.next_window {
        lines.push((
            format!(
                "outside the maintenance windows: the next opens in {} ({})",
                left(t.0),
                t.0
            ),
            Some(Colour::Yellow),
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_soak_shows_its_time_left_and_a_halt_what_to_do() {
        let now: Timestamp = "2026-12-05T02:00:00Z".parse().unwrap();
        let soaking = RolloutStatus {
            target_version: "2.8.0".into(),
            phase: phase::SOAKING.into(),
            canary_nodes: vec!["tt-0".into()],
            soak_until: Some(Time("2026-12-05T02:04:30Z".parse().unwrap())),
            ..RolloutStatus::default()
        };
        let lines: Vec<String> = rollout_lines(&soaking, now)
            .into_iter()
            .map(|(l, _)| l)
            .collect();
        assert_eq!(lines, ["canary: soaking, 4m30s left (tt-0)"]);
        let halted = RolloutStatus {
            phase: phase::HALTED.into(),
            halted_by: Some("canary node tt-0 failed: DrainTimeout".into()),
            next_window: Some(Time("2026-12-05T03:00:00Z".parse().unwrap())),
            ..soaking
        };
        let lines: Vec<String> = rollout_lines(&halted, now)
            .into_iter()
            .map(|(l, _)| l)
            .collect();
        assert_eq!(
            lines,
            [
                "halted: canary node tt-0 failed: DrainTimeout; retry or skip the node to go on (kubectl tt driver retry|skip)",
                "outside the maintenance windows: the next opens in 60m (2026-12-05T03:00:00Z)",
            ]
        );
    }
}
