//! The status the controller decided for each policy (handed to the policy's writer in
//! [`crate::runtime::writes::status_view`]), and the one JSON patch per write that records it: only what
//! changed while the policy is still at the version of the last write, else the whole status.
//! The controller is the status's only writer. Writes are spaced by the size of the status
//! ([`WRITE_SPACING_PER_ENTRY`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::{Resource, ResourceExt};
use ttdp_api::{NodeState, TenstorrentDriverPolicy, TenstorrentDriverPolicyStatus};

use crate::error::Error;
use crate::pure::status::{BuiltStatus, NodeEntries, NodeReport, PolicyFacts, build_status};
use crate::pure::transition::NodeTransition;
use crate::runtime::writes::status_view::StatusViews;

/// The least time between the starts of two status writes of a policy, per node entry listed in
/// `status.nodes`. At each write the API server stores the whole object (etcd keeps every
/// revision until it compacts) and sends it to every watcher, and with many nodes the object is
/// mostly node entries: spacing the writes by the entries bounds the bytes a rollout writes per
/// second however fast the fleet changes (`docs/benchmarks.md` has the figures).
pub const WRITE_SPACING_PER_ENTRY: Duration = Duration::from_micros(10);

/// The last status the controller recorded for a policy (by uid), uncompacted. The API server's
/// copy is the durable one; this only bridges the moment between a write and its watch event.
#[derive(Clone, Debug, Default)]
pub struct RecordedStatus {
    /// The status as written, without its node entries (those are in `nodes`).
    pub status: TenstorrentDriverPolicyStatus,
    /// Every node entry, including ones compacted out of the status.
    pub nodes: NodeEntries,
    /// The policy's `resourceVersion` right after that write (or when the status was read):
    /// while the policy still has it, the next write can send only what changed.
    pub resource_version: Option<String>,
    /// When that write started (None: not written by this process).
    pub written_at: Option<Instant>,
}

/// Whether two statuses are equal but for `nodes` (the cached policy's status has none).
pub(crate) fn same_apart_from_nodes(
    a: &TenstorrentDriverPolicyStatus,
    b: &TenstorrentDriverPolicyStatus,
) -> bool {
    let TenstorrentDriverPolicyStatus {
        observed_generation,
        conditions,
        summary,
        nodes: _,
        rollout,
    } = a;
    *observed_generation == b.observed_generation
        && *conditions == b.conditions
        && *summary == b.summary
        && *rollout == b.rollout
}

/// Writes the status unless it is unchanged (and the cached policy's copy agrees); returns the
/// policy's new `resourceVersion` when it wrote.
///
/// While the policy is still at the version of the last write, only what changed is sent: a JSON
/// patch replacing the changed node entries and top-level fields, guarded by a `test` of that
/// `resourceVersion` (see [`status_delta`]). Otherwise (after a start, someone else's write, a
/// node joining or leaving, most entries changed) the whole status is replaced with one
/// `add /status`: the controller is the status's only writer, and a replace costs the API
/// server a plain write, where a server-side apply of thousands of node entries makes it merge
/// every entry's managed fields. The reply is asked for as `PartialObjectMetadata`: the watch
/// delivers the object, and the whole object back at every write would cost as much again.
pub(crate) async fn write_status(
    client: &Client,
    policy: &TenstorrentDriverPolicy,
    built: &BuiltStatus,
    last: &RecordedStatus,
) -> Result<Option<String>, Error> {
    let name = policy.name_any();
    let failed = |e: kube::Error| Error::kube(format!("write status of policy {name}"), e);
    if let Some(ops) = status_delta(last, built) {
        let body = serde_json::to_vec(&ops).map_err(Error::Serialize)?;
        match patch_status(client, &name, body).await {
            Ok(version) => return Ok(version),
            // The policy moved on since (or the server refused the patch): replace it whole.
            Err(kube::Error::Api(e)) => {
                tracing::debug!(policy = %name, code = e.code, "status delta not applied; writing the whole status");
            }
            Err(e) => return Err(failed(e)),
        }
    }
    #[derive(serde::Serialize)]
    struct ReplaceStatus {
        op: &'static str,
        path: &'static str,
        value: TenstorrentDriverPolicyStatus,
    }
    let body = serde_json::to_vec(&[ReplaceStatus {
        op: "add",
        path: "/status",
        value: built.whole(),
    }])
    .map_err(Error::Serialize)?;
    patch_status(client, &name, body).await.map_err(failed)
}

/// Sends a JSON patch to the policy's status; returns the new `resourceVersion`.
async fn patch_status(
    client: &Client,
    name: &str,
    body: Vec<u8>,
) -> Result<Option<String>, kube::Error> {
    let url = format!(
        "{}/{name}/status",
        TenstorrentDriverPolicy::url_path(&(), None)
    );
    let request = http::Request::patch(url)
        .header(http::header::CONTENT_TYPE, "application/json-patch+json")
        .header(
            http::header::ACCEPT,
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        )
        .body(body)
        .map_err(|e| kube::Error::BuildRequest(kube::core::request::Error::BuildRequest(e)))?;
    let reply = client.request_text(request).await?;
    let meta: kube::core::PartialObjectMeta<TenstorrentDriverPolicy> =
        serde_json::from_str(&reply).map_err(kube::Error::SerdeError)?;
    Ok(meta.metadata.resource_version)
}

/// The JSON patch from the status last written to `built`: a `test` that the policy is still
/// at the `resourceVersion` of that write, then the changed top-level fields and node entries
/// (by index). None when that is unknown or not worth it: no `resourceVersion`, a field
/// removed, entries left out (compaction) before or now, a node joined or left, or more than
/// half of the entries changed (a version bump).
fn status_delta(last: &RecordedStatus, built: &BuiltStatus) -> Option<Vec<serde_json::Value>> {
    use serde_json::json;
    let version = last.resource_version.as_ref()?;
    let (before, status) = (&last.status, &built.status);
    let lists_all = |s: &TenstorrentDriverPolicyStatus| {
        s.summary.as_ref().is_some_and(|s| s.nodes_omitted == 0)
    };
    if !lists_all(before)
        || !lists_all(status)
        || !built.same_nodes
        || status.observed_generation.is_none()
        || status.conditions.is_empty()
        || built.changed.len() > built.all_nodes.len() / 2
    {
        return None;
    }
    let mut ops =
        vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": version})];
    if status.observed_generation != before.observed_generation {
        ops.push(json!({"op": "add", "path": "/status/observedGeneration", "value": status.observed_generation}));
    }
    if status.conditions != before.conditions {
        ops.push(json!({"op": "add", "path": "/status/conditions", "value": status.conditions}));
    }
    if status.summary != before.summary {
        ops.push(json!({"op": "add", "path": "/status/summary", "value": status.summary}));
    }
    if status.rollout != before.rollout {
        match &status.rollout {
            Some(rollout) => {
                ops.push(json!({"op": "add", "path": "/status/rollout", "value": rollout}))
            }
            // Removing a field is a whole write (see above).
            None => return None,
        }
    }
    // Both in name order: one walk finds each changed entry's index.
    let mut changed = built.changed.iter().peekable();
    for (i, (name, entry)) in built.all_nodes.iter().enumerate() {
        if changed.peek().is_none() {
            break;
        }
        if changed.next_if(|c| *c == name).is_some() {
            ops.push(
                json!({"op": "replace", "path": format!("/status/nodes/{i}"), "value": **entry}),
            );
        }
    }
    Some(ops)
}

/// A status decided, not handed over yet. Handed over, the policy's status writer
/// ([`crate::runtime::writes::status_view`]) writes it soon and the round goes on at once, except when
/// the rollout's state (`status.rollout`: canary, soak, applied target) changed, which
/// reconciles read back before acting and so is written first.
pub struct Decided {
    policy: Arc<TenstorrentDriverPolicy>,
    decided: Arc<RecordedStatus>,
    urgent: bool,
    write_first: bool,
}

/// `built` as the policy's decided status, written first (before the round acts) when `wait` or
/// when the rollout's state changed; urgent when a node failed or the conditions changed.
pub fn decide(
    policy: &Arc<TenstorrentDriverPolicy>,
    built: BuiltStatus,
    last: &RecordedStatus,
    wait: bool,
) -> Decided {
    let write_first = wait || built.status.rollout != last.status.rollout;
    let urgent = write_first
        || built.status.conditions != last.status.conditions
        || built.changed.iter().any(|n| {
            built
                .all_nodes
                .get(n)
                .is_some_and(|e| e.state == NodeState::Failed)
                && last
                    .nodes
                    .get(n)
                    .is_none_or(|e| e.state != NodeState::Failed)
        });
    let decided = Arc::new(RecordedStatus {
        status: built.status,
        nodes: built.all_nodes,
        resource_version: None,
        written_at: None,
    });
    Decided {
        policy: policy.clone(),
        decided,
        urgent,
        write_first,
    }
}

impl Decided {
    /// The status decided.
    pub fn recorded(&self) -> Arc<RecordedStatus> {
        self.decided.clone()
    }

    /// Whether it must be written before the round acts.
    pub fn write_first(&self) -> bool {
        self.write_first
    }

    /// Remembers it and hands it to the writer; waits for the write when it must be written
    /// first.
    pub async fn hand_over(
        self,
        views: &StatusViews,
        client: &Client,
    ) -> Result<Arc<RecordedStatus>, Error> {
        let ticket = views.submit(client, &self.policy, self.decided.clone(), self.urgent);
        if self.write_first {
            ticket.written().await?;
        }
        Ok(self.decided)
    }
}

/// Writes the status with every node entry as recorded and the conditions of `facts`, and
/// waits for the write.
pub async fn record_nodes_as_they_are(
    (views, client): (&StatusViews, &Client),
    policy: &TenstorrentDriverPolicy,
    last: &RecordedStatus,
    facts: &PolicyFacts,
) -> Result<Arc<RecordedStatus>, Error> {
    let reports = last
        .nodes
        .values()
        .map(|e| NodeReport {
            name: e.name.clone(),
            transition: NodeTransition {
                state: e.state,
                reason: e.reason.clone(),
                message: e.message.clone(),
                actions: vec![],
            },
            current_version: e.current_version.clone(),
            loaded_parameters: e.loaded_parameters.clone(),
            source_commit: e.source_commit.clone(),
            udev_rule: e.udev_rule.clone(),
            next_kernels: e.next_kernels.clone(),
            module_signer: e.module_signer.clone(),
            start_load: e.start_load,
            install_mode: e.install_mode.clone(),
        })
        .collect();
    let now = Time(Timestamp::now());
    let built = build_status(facts, &last.status, &last.nodes, reports, &now);
    (decide(&Arc::new(policy.clone()), built, last, true))
        .hand_over(views, client)
        .await
}

/// When the status write after `w` may start: [`WRITE_SPACING_PER_ENTRY`] per node entry `w`
/// listed, after `w`'s start (None: `w` was not written by this process).
pub fn next_write_at(w: &RecordedStatus) -> Option<Instant> {
    let omitted = w.status.summary.as_ref().map_or(0, |s| s.nodes_omitted);
    let listed = w.nodes.len() - usize::try_from(omitted).unwrap_or(0).min(w.nodes.len());
    let entries = u32::try_from(listed).unwrap_or(u32::MAX);
    Some(w.written_at? + WRITE_SPACING_PER_ENTRY * entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use serde_json::json;
    use ttdp_api::driver::v1alpha1::Summary;
    use ttdp_api::{NodeState, NodeStatus};

    fn entry(name: &str, state: NodeState) -> NodeStatus {
        NodeStatus {
            current_version: Some("2.7.0".into()),
            ..NodeStatus::new(name, state)
        }
    }

    fn status(nodes: Vec<NodeStatus>, omitted: i32) -> TenstorrentDriverPolicyStatus {
        TenstorrentDriverPolicyStatus {
            observed_generation: Some(2),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: "RollingOut".into(),
                message: String::new(),
                observed_generation: Some(2),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            }],
            summary: Some(Summary {
                matched: 3,
                nodes_omitted: omitted,
                ..Summary::default()
            }),
            nodes,
            rollout: None,
        }
    }

    fn entries(nodes: Vec<NodeStatus>) -> NodeEntries {
        nodes
            .into_iter()
            .map(|n| (Arc::from(n.name.as_str()), Arc::new(n)))
            .collect()
    }

    fn recorded(nodes: Vec<NodeStatus>, omitted: i32, version: Option<&str>) -> RecordedStatus {
        RecordedStatus {
            status: status(Vec::new(), omitted),
            nodes: entries(nodes),
            resource_version: version.map(str::to_owned),
            written_at: None,
        }
    }

    /// `nodes` built after `last`: what changed found as update_status finds it.
    fn built(last: &RecordedStatus, nodes: Vec<NodeStatus>, omitted: i32) -> BuiltStatus {
        let all_nodes = entries(nodes);
        let changed = all_nodes
            .iter()
            .filter(|(name, entry)| last.nodes.get(&***name) != Some(*entry))
            .map(|(name, _)| name.clone())
            .collect();
        BuiltStatus {
            status: status(Vec::new(), omitted),
            same_nodes: all_nodes.keys().eq(last.nodes.keys()),
            all_nodes,
            changes: Vec::new(),
            changed,
        }
    }

    fn fleet(states: [NodeState; 4]) -> Vec<NodeStatus> {
        ["a", "b", "c", "d"]
            .iter()
            .zip(states)
            .map(|(n, s)| entry(n, s))
            .collect()
    }

    #[test]
    fn a_hand_off_sends_the_changed_entries_guarded_by_the_last_written_version() {
        use NodeState::*;
        let last = recorded(fleet([Upgrading, Pending, Done, Pending]), 0, Some("41"));
        let mut next = built(&last, fleet([Done, Cordoning, Done, Pending]), 0);
        next.status.observed_generation = Some(3);
        let ops = status_delta(&last, &next).unwrap();
        assert_eq!(
            ops,
            vec![
                json!({"op": "test", "path": "/metadata/resourceVersion", "value": "41"}),
                json!({"op": "add", "path": "/status/observedGeneration", "value": 3}),
                json!({"op": "replace", "path": "/status/nodes/0", "value": {"name": "a", "state": "Done", "currentVersion": "2.7.0"}}),
                json!({"op": "replace", "path": "/status/nodes/1", "value": {"name": "b", "state": "Cordoning", "currentVersion": "2.7.0"}}),
            ]
        );
    }

    #[test]
    fn the_whole_status_is_written_when_a_delta_cannot_be_trusted_or_is_not_worth_it() {
        use NodeState::*;
        let now = fleet([Done, Cordoning, Done, Pending]);
        let states = [Upgrading, Pending, Done, Pending];
        let delta = |last: &RecordedStatus, nodes: Vec<NodeStatus>, omitted| {
            status_delta(last, &built(last, nodes, omitted))
        };
        // Never written by this controller (or read) at a known version.
        assert!(delta(&recorded(fleet(states), 0, None), now.clone(), 0).is_none());
        // The last write left entries out (compaction): indexes do not match.
        assert!(delta(&recorded(fleet(states), 2, Some("41")), now.clone(), 0).is_none());
        // This one leaves entries out.
        assert!(delta(&recorded(fleet(states), 0, Some("41")), now.clone(), 2).is_none());
        // A node joined.
        let mut joined = now.clone();
        joined.push(entry("e", Pending));
        assert!(delta(&recorded(fleet(states), 0, Some("41")), joined, 0).is_none());
        // Another node in the same place.
        let mut renamed = now.clone();
        renamed[2].name = "z".into();
        assert!(delta(&recorded(fleet(states), 0, Some("41")), renamed, 0).is_none());
        // Most entries changed (a version bump queues every node).
        let done = recorded(fleet([Done, Done, Done, Done]), 0, Some("41"));
        assert!(delta(&done, fleet([Pending, Pending, Pending, Done]), 0).is_none());
        // Nothing changed: only the guard (record() skips the write before it gets here).
        let same = recorded(now.clone(), 0, Some("41"));
        assert_eq!(delta(&same, now, 0).map(|ops| ops.len()), Some(1));
    }

    #[test]
    fn writes_are_spaced_by_the_entries_listed() {
        let nodes: Vec<NodeStatus> = (0..5_000)
            .map(|i| entry(&format!("n{i:04}"), NodeState::Done))
            .collect();
        let start = Instant::now();
        let mut w = recorded(nodes, 0, None);
        assert_eq!(
            next_write_at(&w),
            None,
            "not written by this process: no wait"
        );
        w.written_at = Some(start);
        assert_eq!(next_write_at(&w), Some(start + Duration::from_millis(50)));
        // The same fleet with all but 500 nodes left out of status.nodes.
        w.status.summary.as_mut().unwrap().nodes_omitted = 4_500;
        assert_eq!(next_write_at(&w), Some(start + Duration::from_millis(5)));
    }
}
