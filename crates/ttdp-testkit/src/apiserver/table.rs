//! Server-side printing (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), which
//! `kubectl get` asks for: the columns kubectl shows for the built-in types, and a CRD's
//! `additionalPrinterColumns` for custom resources.

use serde_json::{Value, json};

use super::catalog::ResourceType;

fn column(name: &str, kind: &str, priority: u8) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": kind, "format": format, "description": "", "priority": priority})
}

/// Age as kubectl prints it (`42s`, `5m`, `3h`, `2d`).
pub fn age(created: &str) -> String {
    let Ok(ts) = created.parse::<jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let secs = jiff::Timestamp::now().duration_since(ts).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 8 * 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "<none>".into(),
        other => other.to_string(),
    }
}

fn condition_true(obj: &Value, kind: &str) -> Option<bool> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| c["status"] == "True")
}

/// A simple JSONPath (`.spec.x`, `.status.nodes[0].name`) as CRD printer columns use.
fn json_path<'a>(obj: &'a Value, path: &str) -> &'a Value {
    let mut current = obj;
    for seg in path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
    {
        let (field, index) = match seg.split_once('[') {
            Some((f, i)) => (f, i.trim_end_matches(']').parse::<usize>().ok()),
            None => (seg, None),
        };
        current = &current[field];
        if let Some(i) = index {
            current = &current[i];
        }
    }
    current
}

/// Computes a row's cells from an object.
type Cells = Box<dyn Fn(&Value) -> Vec<Value>>;

fn columns_and_cells(rt: &ResourceType) -> (Vec<Value>, Cells) {
    let created = |o: &Value| {
        json!(age(o["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or_default()))
    };
    let name = |o: &Value| json!(o["metadata"]["name"].as_str().unwrap_or_default());
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => (
            vec![
                column("Name", "string", 0),
                column("Ready", "string", 0),
                column("Status", "string", 0),
                column("Restarts", "string", 0),
                column("Age", "string", 0),
                column("IP", "string", 1),
                column("Node", "string", 1),
            ],
            Box::new(move |o| {
                let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
                let statuses = o["status"]["containerStatuses"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let ready = statuses.iter().filter(|s| s["ready"] == true).count();
                let restarts: i64 = statuses
                    .iter()
                    .filter_map(|s| s["restartCount"].as_i64())
                    .sum();
                let status = if o["metadata"]["deletionTimestamp"].is_string() {
                    "Terminating".to_string()
                } else {
                    o["status"]["reason"]
                        .as_str()
                        .or(o["status"]["phase"].as_str())
                        .unwrap_or("Unknown")
                        .to_string()
                };
                vec![
                    name(o),
                    json!(format!("{ready}/{total}")),
                    json!(status),
                    json!(restarts.to_string()),
                    created(o),
                    json!(o["status"]["podIP"].as_str().unwrap_or("<none>")),
                    json!(o["spec"]["nodeName"].as_str().unwrap_or("<none>")),
                ]
            }),
        ),
        ("", "nodes") => (
            vec![
                column("Name", "string", 0),
                column("Status", "string", 0),
                column("Roles", "string", 0),
                column("Age", "string", 0),
                column("Version", "string", 0),
            ],
            Box::new(move |o| {
                let mut status = match condition_true(o, "Ready") {
                    Some(true) => "Ready".to_string(),
                    Some(false) => "NotReady".to_string(),
                    None => "Unknown".to_string(),
                };
                if o["spec"]["unschedulable"] == true {
                    status.push_str(",SchedulingDisabled");
                }
                let roles: Vec<String> = o["metadata"]["labels"]
                    .as_object()
                    .map(|m| {
                        m.keys()
                            .filter_map(|k| {
                                k.strip_prefix("node-role.kubernetes.io/")
                                    .map(str::to_string)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let roles = if roles.is_empty() {
                    "<none>".to_string()
                } else {
                    roles.join(",")
                };
                vec![
                    name(o),
                    json!(status),
                    json!(roles),
                    created(o),
                    json!(
                        o["status"]["nodeInfo"]["kubeletVersion"]
                            .as_str()
                            .unwrap_or("")
                    ),
                ]
            }),
        ),
        ("", "namespaces") => (
            vec![
                column("Name", "string", 0),
                column("Status", "string", 0),
                column("Age", "string", 0),
            ],
            Box::new(move |o| vec![name(o), json!(text(&o["status"]["phase"])), created(o)]),
        ),
        ("apps", "daemonsets") => (
            [
                "Name",
                "Desired",
                "Current",
                "Ready",
                "Up-to-date",
                "Available",
                "Node Selector",
                "Age",
            ]
            .iter()
            .map(|c| column(c, "string", 0))
            .collect(),
            Box::new(move |o| {
                let s = &o["status"];
                let n = |v: &Value| json!(v.as_i64().unwrap_or(0));
                let selector = o["spec"]["template"]["spec"]["nodeSelector"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", text(v)))
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "<none>".into());
                vec![
                    name(o),
                    n(&s["desiredNumberScheduled"]),
                    n(&s["currentNumberScheduled"]),
                    n(&s["numberReady"]),
                    n(&s["updatedNumberScheduled"]),
                    n(&s["numberAvailable"]),
                    json!(selector),
                    created(o),
                ]
            }),
        ),
        ("policy", "poddisruptionbudgets") => (
            [
                "Name",
                "Min Available",
                "Max Unavailable",
                "Allowed Disruptions",
                "Age",
            ]
            .iter()
            .map(|c| column(c, "string", 0))
            .collect(),
            Box::new(move |o| {
                let or_na = |v: &Value| {
                    if v.is_null() {
                        json!("N/A")
                    } else {
                        json!(text(v))
                    }
                };
                vec![
                    name(o),
                    or_na(&o["spec"]["minAvailable"]),
                    or_na(&o["spec"]["maxUnavailable"]),
                    json!(o["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)),
                    created(o),
                ]
            }),
        ),
        ("", "events") => (
            ["Last Seen", "Type", "Reason", "Object", "Message"]
                .iter()
                .map(|c| column(c, "string", 0))
                .collect(),
            Box::new(move |o| {
                let last = o["lastTimestamp"]
                    .as_str()
                    .or(o["eventTime"].as_str())
                    .or(o["metadata"]["creationTimestamp"].as_str())
                    .unwrap_or_default();
                let involved = &o["involvedObject"];
                vec![
                    json!(age(last)),
                    json!(text(&o["type"])),
                    json!(text(&o["reason"])),
                    json!(format!(
                        "{}/{}",
                        involved["kind"].as_str().unwrap_or_default().to_lowercase(),
                        involved["name"].as_str().unwrap_or_default()
                    )),
                    json!(text(&o["message"])),
                ]
            }),
        ),
        _ if rt.is_custom() => {
            let printer = rt.printer_columns.clone();
            let mut cols = vec![column("Name", "string", 0)];
            for c in &printer {
                cols.push(column(
                    c["name"].as_str().unwrap_or_default(),
                    c["type"].as_str().unwrap_or("string"),
                    c["priority"].as_u64().unwrap_or(0) as u8,
                ));
            }
            let has_age = printer
                .iter()
                .any(|c| c["jsonPath"] == ".metadata.creationTimestamp");
            if !has_age {
                cols.push(column("Age", "date", 0));
            }
            (
                cols,
                Box::new(move |o| {
                    let mut cells = vec![name(o)];
                    for c in &printer {
                        let path = c["jsonPath"].as_str().unwrap_or_default();
                        let v = json_path(o, path);
                        cells.push(if path == ".metadata.creationTimestamp" {
                            created(o)
                        } else if v.is_null() {
                            json!("")
                        } else {
                            v.clone()
                        });
                    }
                    if !has_age {
                        cells.push(created(o));
                    }
                    cells
                }),
            )
        }
        _ => (
            vec![column("Name", "string", 0), column("Age", "string", 0)],
            Box::new(move |o| vec![name(o), created(o)]),
        ),
    }
}

fn row_object(obj: &Value, include: Option<&str>) -> Value {
    match include {
        Some("None") => Value::Null,
        Some("Object") => obj.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }),
    }
}

/// Render an object or a list as a `Table`.
pub fn render(rt: &ResourceType, value: &Value, include: Option<&str>) -> Value {
    let (columns, cells) = columns_and_cells(rt);
    let (items, meta) = match value["items"].as_array() {
        Some(items) => (items.clone(), value["metadata"].clone()),
        None => (
            vec![value.clone()],
            json!({"resourceVersion": value["metadata"]["resourceVersion"]}),
        ),
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| json!({"cells": cells(o), "object": row_object(o, include)}))
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}
