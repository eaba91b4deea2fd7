//! What the API server handled during a rollout, by kind of request, from its own `/metrics`
//! (`apiserver_request_total` and `apiserver_request_duration_seconds_sum`), read before and
//! after: every client's requests, the controller's and the agent stand-in's as well as the
//! DaemonSet controller's, the scheduler's and the node lifecycle controller's. With 2 CPUs
//! shared, the server's load is what each node PATCH of a hand-off waits behind, and this says
//! whose requests make it.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use kube::Client;
use serde_json::{Value, json};

/// Request count and summed handling time (s) by "VERB resource[/subresource]".
#[derive(Debug, Default, Clone)]
pub struct ServerCounts(BTreeMap<String, (f64, f64)>);

impl ServerCounts {
    /// Reads the server's counters now.
    pub async fn read(client: &Client) -> Result<Self> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .context("cannot build the /metrics request")?;
        let text = client
            .request_text(request)
            .await
            .context("cannot read the API server's /metrics")?;
        Ok(Self::parse(&text))
    }

    fn parse(text: &str) -> Self {
        let mut counts = BTreeMap::new();
        for line in text.lines() {
            let (is_count, rest) = if let Some(r) = line.strip_prefix("apiserver_request_total{") {
                (true, r)
            } else if let Some(r) = line.strip_prefix("apiserver_request_duration_seconds_sum{") {
                (false, r)
            } else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let entry: &mut (f64, f64) = counts.entry(kind(labels)).or_default();
            if is_count {
                entry.0 += value;
            } else {
                entry.1 += value;
            }
        }
        Self(counts)
    }

    /// The requests since `before`, per node upgraded, the kinds with at least
    /// one request in ten nodes: `{"PATCH nodes": {"per_node", "server_ms_per_node"}}`.
    pub fn per_node_since(&self, before: &Self, nodes: usize) -> Value {
        let nodes = nodes.max(1) as f64;
        let mut out = serde_json::Map::new();
        for (kind, (count, seconds)) in &self.0 {
            let (count0, seconds0) = before.0.get(kind).copied().unwrap_or_default();
            let per_node = (count - count0) / nodes;
            if per_node < 0.1 {
                continue;
            }
            let ms = 1000.0 * (seconds - seconds0) / nodes;
            out.insert(
                kind.clone(),
                json!({ "per_node": round2(per_node), "server_ms_per_node": round2(ms) }),
            );
        }
        Value::Object(out)
    }
}

/// "VERB resource[/subresource]" of a metric line's labels.
fn kind(labels: &str) -> String {
    let label = |name: &str| {
        labels
            .split(',')
            .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
            .map(|v| v.trim_end_matches('"').to_owned())
            .unwrap_or_default()
    };
    let (verb, resource, sub) = (label("verb"), label("resource"), label("subresource"));
    if sub.is_empty() {
        format!("{verb} {resource}")
    } else {
        format!("{verb} {resource}/{sub}")
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_per_node_by_verb_and_resource() {
        let line = |verb: &str, resource: &str, sub: &str, count: u32, sum: f64| {
            format!(
                "apiserver_request_total{{code=\"200\",component=\"apiserver\",group=\"\",resource=\"{resource}\",scope=\"resource\",subresource=\"{sub}\",verb=\"{verb}\",version=\"v1\"}} {count}\n\
                 apiserver_request_duration_seconds_sum{{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"{resource}\",scope=\"resource\",subresource=\"{sub}\",verb=\"{verb}\",version=\"v1\"}} {sum}\n"
            )
        };
        let before = ServerCounts::parse(&(line("PATCH", "nodes", "", 100, 1.0) + "# HELP x\n"));
        let after = ServerCounts::parse(
            &(line("PATCH", "nodes", "", 600, 6.0)
                + &line("PATCH", "pods", "status", 100, 3.0)
                + &line("GET", "leases", "", 5, 0.1)),
        );
        let mix = after.per_node_since(&before, 100);
        assert_eq!(mix["PATCH nodes"]["per_node"], 5.0);
        assert_eq!(mix["PATCH nodes"]["server_ms_per_node"], 50.0);
        assert_eq!(mix["PATCH pods/status"]["per_node"], 1.0);
        assert!(mix.get("GET leases").is_none(), "{mix}");
    }
}
