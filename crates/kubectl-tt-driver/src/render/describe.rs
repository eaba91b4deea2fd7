//! `describe CR`: the policy's spec in words, its DaemonSet, summary, conditions, per-node detail
//! and recent Events, laid out like `kubectl describe`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use ttdp_api::driver::v1alpha1::{CaBundleSource, PrebuiltSettings};
use ttdp_api::{TenstorrentDriverPolicy, TenstorrentDriverPolicySpec};

use super::RenderOptions;
use super::kernels::{next_kernels_cell, not_ready_lines, signer_cell};
use super::nodes::{cordoned_by, message, node_cells};
use super::policy_summary::condition_needs_attention;
use crate::age::age;
use crate::fleet::{EventFacts, NodeRow, PodFacts, PolicyView, nodes_omitted, policy_name};
use crate::palette::Colour;
use crate::text_table::{Cell, Table};

/// How many Events `describe` shows (the most recent).
pub const MAX_EVENTS: usize = 20;

/// A label selector as `kubectl get -l` would take it; `{}` selects everything.
pub fn selector_text(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => format!("{} {other} ({values})", e.key),
        });
    }
    if parts.is_empty() {
        "{} (every Tenstorrent node)".to_owned()
    } else {
        parts.join(",")
    }
}

/// The Nodes table; a PARAMETERS column (the loaded module parameters), a COMMIT column
/// (the commit the loaded module was built from, abbreviated as git does), a UDEV-RULE column
/// (whose udev rule the node has), a NEXT-KERNELS column (the other installed kernels without a
/// ready module) and a SIGNER column (who signed the loaded module) only when a node reports
/// some, so a policy without them reads as before.
fn node_table(rows: &[NodeRow], opts: &RenderOptions) -> Table {
    let with_parameters = rows.iter().any(|r| r.loaded_parameters.is_some());
    let with_commit = rows.iter().any(|r| r.source_commit.is_some());
    let with_rule = rows.iter().any(|r| r.udev_rule.is_some());
    let with_kernels = rows.iter().any(|r| r.next_kernels.is_some());
    let with_signer = rows.iter().any(|r| r.module_signer.is_some());
    let mut header = vec!["NODE", "STATE", "VERSION", "MODE"];
    if with_parameters {
        header.push("PARAMETERS");
    }
    if with_commit {
        header.push("COMMIT");
    }
    if with_rule {
        header.push("UDEV-RULE");
    }
    if with_kernels {
        header.push("NEXT-KERNELS");
    }
    if with_signer {
        header.push("SIGNER");
    }
    header.extend(["CORDONED-BY", "AGE", "ATTEMPTS", "MESSAGE"]);
    let mut table = Table::new(header);
    for row in rows {
        let mut cells = Vec::from(node_cells(row));
        if with_parameters {
            cells.push(Cell::plain(
                row.loaded_parameters
                    .clone()
                    .unwrap_or_else(|| "-".to_owned()),
            ));
        }
        if with_commit {
            let commit = row.source_commit.as_deref().unwrap_or("-");
            cells.push(Cell::plain(commit.get(..12).unwrap_or(commit)));
        }
        if with_rule {
            cells.push(Cell::plain(udev_rule_cell(row.udev_rule.as_deref())));
        }
        if with_kernels {
            cells.push(Cell::plain(next_kernels_cell(row.next_kernels.as_ref())));
        }
        if with_signer {
            cells.push(Cell::plain(signer_cell(row)));
        }
        cells.extend([
            Cell::plain(cordoned_by(row)),
            Cell::plain(age(row.since, opts.now)),
            Cell::plain(
                row.attempts
                    .map_or_else(|| "-".to_owned(), |a| a.to_string()),
            ),
            Cell::plain(message(row)),
        ]);
        table.push(cells);
    }
    table
}

/// Whose rule the node has, short: the agent reports `<path> (tt-kmd 2.8.0)` or `<path> (not
/// ttdp's, left as is)`, and the path is always tt-kmd's; `-` for none.
fn udev_rule_cell(reported: Option<&str>) -> String {
    let Some(text) = reported else {
        return "-".to_owned();
    };
    match text.split_once(" (") {
        Some((_, whose)) => whose.trim_end_matches(')').to_owned(),
        None => text.to_owned(),
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

fn field(out: &mut String, indent: usize, key: &str, value: &str) {
    let label = format!("{}{key}:", " ".repeat(indent));
    out.push_str(&format!("{label:<21}{value}\n"));
}

fn indented(table: &Table, opts: &RenderOptions) -> String {
    table
        .render(opts.palette)
        .lines()
        .map(|l| format!("  {l}\n"))
        .collect()
}

/// The describe page of one policy. `rows` are its node rows, `pods` its agent pods, `events`
/// its Events (any order).
pub fn render(
    view: &PolicyView,
    rows: &[NodeRow],
    pods: &[PodFacts],
    events: &[EventFacts],
    opts: &RenderOptions,
) -> String {
    let mut out = String::new();
    identity_fields(&mut out, &view.policy, opts);
    spec_fields(&mut out, &view.policy.spec, opts);
    field(&mut out, 0, "DaemonSet", &daemonset_text(view));
    field(&mut out, 0, "Summary", &summary_text(&view.policy));
    conditions_section(&mut out, &view.policy, opts);
    nodes_section(&mut out, &view.policy, rows, opts);
    agent_pods_section(&mut out, pods, opts);
    events_section(&mut out, events, opts);
    out
}

/// Name, Age and Generation (with the generation the status last observed).
fn identity_fields(out: &mut String, policy: &TenstorrentDriverPolicy, opts: &RenderOptions) {
    field(out, 0, "Name", policy_name(policy));
    field(
        out,
        0,
        "Age",
        &age(
            policy.metadata.creation_timestamp.as_ref().map(|t| t.0),
            opts.now,
        ),
    );
    let observed = policy
        .status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .map_or_else(|| "none".to_owned(), |g| g.to_string());
    let generation = policy
        .metadata
        .generation
        .map_or_else(|| "-".to_owned(), |g| g.to_string());
    field(
        out,
        0,
        "Generation",
        &format!("{generation} (status observed {observed})"),
    );
}

/// The `Spec:` block: the policy's settings in words.
fn spec_fields(out: &mut String, spec: &TenstorrentDriverPolicySpec, opts: &RenderOptions) {
    out.push_str("Spec:\n");
    field(out, 2, "Version", &spec.version);
    let mut affinity = selector_text(&spec.user_selector());
    if spec.node_selector.is_some() && spec.node_affinity.is_none() {
        affinity.push_str(" (from the deprecated spec.nodeSelector)");
    }
    field(out, 2, "Node affinity", &affinity);
    let paused = if spec.paused {
        opts.palette
            .paint("true (no node starts a new step)", Some(Colour::Yellow))
    } else {
        "false".to_owned()
    };
    field(out, 2, "Paused", &paused);
    drain_fields(out, spec);
    let max_unavailable = match &spec.upgrade_policy.max_unavailable {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    };
    field(out, 2, "Max unavailable", &max_unavailable);
    field(
        out,
        2,
        "Installer image",
        &format!(
            "{} (pull {})",
            spec.installer.image.as_deref().unwrap_or("<chart default>"),
            spec.installer.image_pull_policy
        ),
    );
    source_fields(out, spec);
    if let Some(module) = spec.module.as_ref().filter(|m| !m.is_empty()) {
        field(out, 2, "Module parameters", &module.parameters.join(" "));
    }
}

/// Drain, its second pass when it has one, bare pods and force unload.
fn drain_fields(out: &mut String, spec: &TenstorrentDriverPolicySpec) {
    let drain = &spec.upgrade_policy.drain;
    let drain_text = if drain.enable {
        format!(
            "cordon + evict device pods{}, timeout {}s",
            if drain.full_node {
                ", then every other pod (fullNode)"
            } else {
                ""
            },
            drain.timeout_seconds
        )
    } else {
        "disabled (no cordon, no drain)".to_owned()
    };
    field(out, 2, "Drain", &drain_text);
    if drain.enable && drain.full_node {
        let pods = if drain.pod_selector_label.is_empty() {
            "every pod".to_owned()
        } else {
            drain.pod_selector_label.clone()
        };
        field(out, 2, "Pass 2 pods", &pods);
        field(out, 2, "Delete emptyDir", yes_no(drain.delete_empty_dir));
    }
    field(out, 2, "Evict bare pods", yes_no(drain.force));
    field(
        out,
        2,
        "Force unload",
        yes_no(spec.upgrade_policy.force_unload),
    );
}

/// Where the module comes from, when the policy says: the repository and pin, prebuilt modules.
fn source_fields(out: &mut String, spec: &TenstorrentDriverPolicySpec) {
    let Some(source) = &spec.source else {
        return;
    };
    let repository = source.repository.as_deref().unwrap_or("<chart default>");
    let pin = source.commit.as_deref().unwrap_or("any commit");
    field(out, 2, "Source", &format!("{repository} ({pin})"));
    if let Some(prebuilt) = &source.prebuilt {
        let on_missing = if prebuilt.fallback == "Fail" {
            "fail if missing"
        } else {
            "build if missing"
        };
        field(
            out,
            2,
            "Prebuilt",
            &format!("{} ({on_missing})", prebuilt.url),
        );
        field(out, 2, "Prebuilt trust", &prebuilt_trust_text(prebuilt));
    }
}

/// What a downloaded module must pass before it is cached: the pins, the server's own
/// checksum, the transport and the CA.
fn prebuilt_trust_text(prebuilt: &PrebuiltSettings) -> String {
    let pinned = match prebuilt.checksums.len() {
        0 => "no pinned checksum".to_owned(),
        1 => "1 pinned checksum".to_owned(),
        n => format!("{n} pinned checksums"),
    };
    let unpinned = if prebuilt.trust_server_checksum {
        "the server's .sha256 trusted for the rest"
    } else {
        "unpinned modules refused"
    };
    let transport = if prebuilt.allow_insecure_http {
        "plain http allowed"
    } else {
        "https only"
    };
    let redirects = if prebuilt.allow_cross_host_redirects {
        "redirects to other hosts followed"
    } else {
        "no redirect to another host"
    };
    let ca = match &prebuilt.ca_bundle {
        Some(CaBundleSource {
            config_map_name: Some(name),
            key,
            ..
        }) => format!("; CA from ConfigMap {name} key {key}"),
        Some(CaBundleSource {
            secret_name: Some(name),
            key,
            ..
        }) => format!("; CA from Secret {name} key {key}"),
        _ => String::new(),
    };
    format!("{pinned}, {unpinned}; {transport}, {redirects}{ca}")
}

fn daemonset_text(view: &PolicyView) -> String {
    match &view.daemonset {
        Some(ds) => format!(
            "{}/{} (desired {}, ready {}, up-to-date {})",
            ds.namespace, ds.name, ds.desired, ds.ready, ds.updated
        ),
        None => "<not found>".to_owned(),
    }
}

fn summary_text(policy: &TenstorrentDriverPolicy) -> String {
    let Some(s) = policy.status.as_ref().and_then(|s| s.summary.as_ref()) else {
        return "<no status yet: is ttdp-controller running?>".to_owned();
    };
    let mut text = format!(
        "matched {}, up-to-date {}, in-progress {}, pending {}, failed {}, host-managed {}, conflicts {}",
        s.matched, s.up_to_date, s.in_progress, s.pending, s.failed, s.host_managed, s.conflicts
    );
    if s.nodes_omitted > 0 {
        text.push_str(&format!(
            " ({} Done and waiting nodes omitted from status.nodes, listed below from node labels)",
            s.nodes_omitted
        ));
    }
    text
}

fn conditions_section(out: &mut String, policy: &TenstorrentDriverPolicy, opts: &RenderOptions) {
    out.push_str("Conditions:\n");
    let conditions = policy
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    if conditions.is_empty() {
        out.push_str("  <none>\n");
        return;
    }
    let mut table = Table::new(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]);
    for c in conditions {
        let status_cell = if condition_needs_attention(c, conditions) {
            Cell::coloured(c.status.clone(), Colour::Red)
        } else {
            Cell::plain(c.status.clone())
        };
        table.push(vec![
            Cell::plain(c.type_.clone()),
            status_cell,
            Cell::plain(c.reason.clone()),
            Cell::plain(age(Some(c.last_transition_time.0), opts.now)),
            Cell::plain(c.message.clone()),
        ]);
    }
    out.push_str(&indented(&table, opts));
}

fn nodes_section(
    out: &mut String,
    policy: &TenstorrentDriverPolicy,
    rows: &[NodeRow],
    opts: &RenderOptions,
) {
    out.push_str("Nodes:\n");
    if rows.is_empty() {
        let note = if nodes_omitted(policy) > 0 {
            "  <none listed; Done and waiting nodes are omitted and none were found by node labels>\n"
        } else {
            "  <none>\n"
        };
        out.push_str(note);
    } else {
        out.push_str(&indented(&node_table(rows, opts), opts));
    }
    let not_ready = not_ready_lines(rows);
    if !not_ready.is_empty() {
        out.push_str(
            "Kernels without a ready module (the node would boot into them without the driver):\n",
        );
        for line in not_ready {
            out.push_str(&format!("  {line}\n"));
        }
    }
}

fn agent_pods_section(out: &mut String, pods: &[PodFacts], opts: &RenderOptions) {
    out.push_str("Agent pods:\n");
    if pods.is_empty() {
        out.push_str("  <none>\n");
        return;
    }
    let mut table = Table::new(["NODE", "POD", "READY", "STATUS", "RESTARTS", "AGE"]);
    for p in pods {
        let ready = format!("{}/{}", p.ready.0, p.ready.1);
        let ready_cell = if p.ready.0 < p.ready.1 {
            Cell::coloured(ready, Colour::Yellow)
        } else {
            Cell::plain(ready)
        };
        table.push(vec![
            Cell::plain(if p.node.is_empty() {
                "<unscheduled>"
            } else {
                &p.node
            }),
            Cell::plain(p.name.clone()),
            ready_cell,
            Cell::plain(p.status.clone()),
            Cell::plain(p.restarts.to_string()),
            Cell::plain(age(p.created, opts.now)),
        ]);
    }
    out.push_str(&indented(&table, opts));
}

/// The most recent [`MAX_EVENTS`] of `events`, oldest first.
pub fn recent_events(events: &[EventFacts]) -> Vec<&EventFacts> {
    let mut recent: Vec<&EventFacts> = events.iter().collect();
    recent.sort_by_key(|e| e.last_seen);
    let skip = recent.len().saturating_sub(MAX_EVENTS);
    recent.split_off(skip)
}

/// The most recent [`MAX_EVENTS`] Events, oldest first.
fn events_section(out: &mut String, events: &[EventFacts], opts: &RenderOptions) {
    out.push_str("Events:\n");
    if events.is_empty() {
        out.push_str("  <none>\n");
        return;
    }
    let mut table = Table::new(["TYPE", "REASON", "AGE", "FROM", "MESSAGE"]);
    for e in recent_events(events) {
        let type_cell = if e.type_ == "Warning" {
            Cell::coloured(e.type_.clone(), Colour::Red)
        } else {
            Cell::plain(e.type_.clone())
        };
        let seen = age(e.last_seen, opts.now);
        let when = if e.count > 1 {
            format!("{seen} (x{})", e.count)
        } else {
            seen
        };
        table.push(vec![
            type_cell,
            Cell::plain(e.reason.clone()),
            Cell::plain(when),
            Cell::plain(e.from.clone()),
            Cell::plain(e.message.clone()),
        ]);
    }
    out.push_str(&indented(&table, opts));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    #[test]
    fn selectors_read_like_kubectl_label_queries() {
        let selector = LabelSelector {
            match_labels: Some(BTreeMap::from([("pool".to_owned(), "prod".to_owned())])),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "rack".to_owned(),
                    operator: "NotIn".to_owned(),
                    values: Some(vec!["r1".to_owned(), "r2".to_owned()]),
                },
                LabelSelectorRequirement {
                    key: "debug".to_owned(),
                    operator: "DoesNotExist".to_owned(),
                    values: None,
                },
            ]),
        };
        assert_eq!(
            selector_text(&selector),
            "pool=prod,rack notin (r1,r2),!debug"
        );
        assert_eq!(
            selector_text(&LabelSelector::default()),
            "{} (every Tenstorrent node)"
        );
    }
}
