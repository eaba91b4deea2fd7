//! The API server's own time for the controller's requests, from its audit log.
//!
//! The launched API server records every request of the controller's identity at the Metadata
//! level once answered (stage `ResponseComplete`; see `ttdp_testkit::launcher::audit`). Each
//! record carries `requestReceivedTimestamp` and `stageTimestamp`, both taken by the server:
//! their difference is the time the server took, without the client's or the network's part.
//! The log is read from an offset, so that a figure covers one phase of the run only.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// Where the launched API server writes its audit log, below the control plane's directory.
pub fn audit_log_path(plane_dir: &Path) -> PathBuf {
    plane_dir.join("logs").join("audit.log")
}

/// The audit log's length now: the offset a phase's records start after.
pub fn log_end(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// The records written after `offset`, one JSON document per line.
pub fn read_from(path: &Path, offset: u64) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(text)
}

/// One node patch as the server saw it: when it was received and when answered.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchSpan {
    pub node: String,
    pub received: Timestamp,
    pub answered: Timestamp,
}

/// What a phase's records say about the controller's requests.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ServerTimes {
    /// The server's time for each node patch (cordon, grant, uncordon).
    pub node_patches: Vec<Duration>,
    /// Each node patch, in the log's order.
    pub node_patch_spans: Vec<PatchSpan>,
    /// Status writes to the policy.
    pub status_writes: usize,
}

/// The server's times in `log` (whole lines of the JSON audit log; others are skipped).
pub fn server_times(log: &str) -> ServerTimes {
    let mut times = ServerTimes::default();
    for record in log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        if record["stage"] != "ResponseComplete" || record["verb"] != "patch" {
            continue;
        }
        let object = &record["objectRef"];
        let subresource = object["subresource"].as_str().unwrap_or_default();
        match (object["resource"].as_str(), subresource) {
            (Some("nodes"), "") => {
                let Some(span) = patch_span(&record) else {
                    continue;
                };
                times.node_patches.extend(server_time(&span));
                times.node_patch_spans.push(span);
            }
            (Some("tenstorrentdriverpolicies"), "status") => times.status_writes += 1,
            _ => {}
        }
    }
    times
}

/// The node and the server's two timestamps of one record.
fn patch_span(record: &Value) -> Option<PatchSpan> {
    let at = |key: &str| record[key].as_str()?.parse::<Timestamp>().ok();
    Some(PatchSpan {
        node: record["objectRef"]["name"].as_str()?.to_owned(),
        received: at("requestReceivedTimestamp")?,
        answered: at("stageTimestamp")?,
    })
}

/// `stageTimestamp − requestReceivedTimestamp` of one patch.
fn server_time(span: &PatchSpan) -> Option<Duration> {
    Duration::try_from(span.answered.duration_since(span.received)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(verb: &str, resource: &str, sub: &str, stage: &str, from: &str, to: &str) -> String {
        serde_json::json!({
            "kind": "Event", "stage": stage, "verb": verb,
            "objectRef": { "resource": resource, "subresource": sub, "name": "tt-00001" },
            "requestReceivedTimestamp": from, "stageTimestamp": to,
        })
        .to_string()
    }

    #[test]
    fn node_patches_are_timed_by_the_server_and_status_writes_counted() {
        let log = [
            record(
                "patch",
                "nodes",
                "",
                "ResponseComplete",
                "2026-12-07T03:00:00.000100Z",
                "2026-12-07T03:00:00.004600Z",
            ),
            record(
                "patch",
                "nodes",
                "",
                "ResponseComplete",
                "2026-12-07T03:00:01.999000Z",
                "2026-12-07T03:00:02.011000Z",
            ),
            // A node's status, a get and another stage are not node patches.
            record(
                "patch",
                "nodes",
                "status",
                "ResponseComplete",
                "2026-12-07T03:00:00Z",
                "2026-12-07T03:00:09Z",
            ),
            record(
                "get",
                "nodes",
                "",
                "ResponseComplete",
                "2026-12-07T03:00:00Z",
                "2026-12-07T03:00:09Z",
            ),
            record(
                "patch",
                "nodes",
                "",
                "ResponseStarted",
                "2026-12-07T03:00:00Z",
                "2026-12-07T03:00:09Z",
            ),
            record(
                "patch",
                "tenstorrentdriverpolicies",
                "status",
                "ResponseComplete",
                "2026-12-07T03:00:00Z",
                "2026-12-07T03:00:00.1Z",
            ),
            "{\"kind\":\"Event\",\"verb\":\"pa".to_owned(),
        ]
        .join("\n");
        let times = server_times(&log);
        assert_eq!(
            times.node_patches,
            [Duration::from_micros(4_500), Duration::from_millis(12)]
        );
        assert_eq!(times.status_writes, 1);
        let nodes: Vec<_> = times.node_patch_spans.iter().map(|s| &s.node).collect();
        assert_eq!(nodes, ["tt-00001", "tt-00001"]);
        assert_eq!(
            times.node_patch_spans[1].received,
            "2026-12-07T03:00:01.999Z".parse::<Timestamp>().unwrap()
        );
    }

    #[test]
    fn the_log_is_read_from_an_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = audit_log_path(dir.path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        assert_eq!(log_end(&path), 0);
        std::fs::write(&path, "before\n").unwrap();
        let offset = log_end(&path);
        std::fs::write(&path, "before\nafter\n").unwrap();
        assert_eq!(read_from(&path, offset).unwrap(), "after\n");
    }
}
