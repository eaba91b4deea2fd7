//! The simulated kubelet's worker for one pod: starts its containers, writes its status whenever
//! it changes, and carries out graceful deletion (stop the containers within the grace period,
//! then delete the pod with grace 0, as the kubelet does).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, Probe};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use ttdp_api::names::{DEVICE_PATH, DEVICE_RESOURCE_PREFIX};

use super::container_runtime::{
    ContainerBody, ContainerHandle, ContainerSnapshot, DeviceHold, ReadinessProbe, RuntimeSettings,
    StopRequest,
};
use super::container_spec::{ProcessSpec, container_process, probe_process};
use super::error::is_not_found;
use super::kubelet::KubeletConfig;
use super::node_heartbeat::SimNodeSpec;
use super::pod_status::{ConditionClock, PodFacts, pod_status};

/// How often the pod as last seen is checked for the status last written (insurance against
/// lost writes). As the kubelet's status manager does, a status the API already shows is not
/// written again: each such write costs the API server, which shares this machine.
const STATUS_RESYNC: Duration = Duration::from_secs(5);
/// How soon a failed status write is tried again.
const STATUS_RETRY: Duration = Duration::from_millis(200);

/// A node the kubelet serves: what its heartbeat and the pods bound to it need.
#[derive(Debug)]
pub(crate) struct NodeContext {
    pub spec: SimNodeSpec,
    pub host_ip: String,
    /// Third octet of this node's pod addresses.
    pub index: u8,
}

/// What every pod worker of a kubelet shares.
pub(crate) struct KubeletShared {
    pub client: Client,
    pub config: KubeletConfig,
    /// Cancelled when the kubelet shuts down: containers are killed, the API is left alone.
    pub shutdown: CancellationToken,
}

/// The latest the kubelet knows about the pod.
#[derive(Debug, Clone)]
pub(crate) enum PodUpdate {
    Present(Box<Pod>),
    /// Deleted from the API (or no longer bound here).
    Gone,
}

/// A running pod worker.
#[derive(Debug)]
pub(crate) struct PodWorker {
    pub updates: watch::Sender<PodUpdate>,
    pub task: JoinHandle<()>,
}

impl PodWorker {
    pub fn start(
        shared: Arc<KubeletShared>,
        node: Arc<NodeContext>,
        pod: Pod,
        pod_ip: String,
    ) -> Self {
        let (updates, rx) = watch::channel(PodUpdate::Present(Box::new(pod.clone())));
        let task = tokio::spawn(run(shared, node, pod, pod_ip, rx));
        Self { updates, task }
    }
}

async fn run(
    shared: Arc<KubeletShared>,
    node: Arc<NodeContext>,
    mut pod: Pod,
    pod_ip: String,
    mut updates: watch::Receiver<PodUpdate>,
) {
    let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
    let uid = pod.uid().unwrap_or_default();
    let start_time = Timestamp::now();
    let changed = Arc::new(Notify::new());
    let containers = start_containers(&shared, &node, &pod, &key, &changed);
    info!(pod = %key, node = %node.spec.name, containers = containers.len(), "pod started");
    let facts = PodFacts {
        host_ip: &node.host_ip,
        pod_ip: &pod_ip,
        start_time,
        uid: &uid,
    };
    let mut last_written: Option<serde_json::Value> = None;
    let mut clock = ConditionClock::default();
    while pod.metadata.deletion_timestamp.is_none() {
        let snapshots: Vec<_> = containers.iter().map(ContainerHandle::snapshot).collect();
        let status = pod_status(&facts, pod.status.as_ref(), &snapshots, &mut clock);
        let wait = if write_status(&shared, &pod, status, &mut last_written).await {
            STATUS_RESYNC
        } else {
            STATUS_RETRY
        };
        tokio::select! {
            () = shared.shutdown.cancelled() => {
                stop_all(containers, StopRequest::Kill).await;
                return;
            }
            changed_update = updates.changed() => {
                let update = updates.borrow_and_update().clone();
                match (changed_update, update) {
                    (Ok(()), PodUpdate::Present(latest)) => pod = *latest,
                    _ => {
                        info!(pod = %key, "pod vanished from the api; killing its containers");
                        stop_all(containers, StopRequest::Kill).await;
                        return;
                    }
                }
            }
            () = changed.notified() => {}
            () = tokio::time::sleep(wait) => {
                if !shows_written_status(&pod, last_written.as_ref()) {
                    last_written = None;
                }
            }
        }
    }
    // Graceful deletion.
    let spec_grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds);
    let grace_seconds = pod
        .metadata
        .deletion_grace_period_seconds
        .or(spec_grace)
        .unwrap_or(30);
    let grace = shared.config.time_scale.seconds(grace_seconds);
    info!(pod = %key, grace_seconds, "pod terminating");
    let snapshots = tokio::select! {
        snapshots = stop_all(containers, StopRequest::Graceful(grace)) => snapshots,
        () = shared.shutdown.cancelled() => return,
    };
    let mut status = pod_status(&facts, pod.status.as_ref(), &snapshots, &mut clock);
    if status.phase.as_deref() == Some("Running") {
        status.phase = Some("Failed".to_owned());
    }
    write_status(&shared, &pod, status, &mut None).await;
    let api: Api<Pod> =
        Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    let params = DeleteParams::default()
        .grace_period(0)
        .preconditions(Preconditions {
            uid: Some(uid),
            resource_version: None,
        });
    match api.delete(&pod.name_any(), &params).await {
        Ok(_) => info!(pod = %key, "pod deleted after its containers stopped"),
        Err(err) if is_not_found(&err) => {}
        Err(err) => warn!(pod = %key, error = %err, "finishing the pod's deletion failed"),
    }
}

/// Stops every container at once and returns their final snapshots.
async fn stop_all(
    containers: Vec<ContainerHandle>,
    request: StopRequest,
) -> Vec<ContainerSnapshot> {
    futures::future::join_all(containers.into_iter().map(|c| c.stop(request))).await
}

fn start_containers(
    shared: &KubeletShared,
    node: &NodeContext,
    pod: &Pod,
    key: &str,
    changed: &Arc<Notify>,
) -> Vec<ContainerHandle> {
    let spec = pod.spec.clone().unwrap_or_default();
    let restart_policy = spec.restart_policy.unwrap_or_else(|| "Always".to_owned());
    let uses_device = pod_uses_device(pod);
    spec.containers
        .iter()
        .map(|container| {
            let image = container.image.clone().unwrap_or_default();
            let body = container_body(shared, node, pod, container, &image, uses_device);
            let settings = RuntimeSettings {
                time_scale: shared.config.time_scale,
                restart_policy: restart_policy.clone(),
                log_file: (shared.config.log_dir.as_ref()).map(|dir| {
                    dir.join(format!("{}_{}.log", key.replace('/', "_"), container.name))
                }),
                pod: key.to_owned(),
            };
            ContainerHandle::start(&container.name, &image, body, settings, changed.clone())
        })
        .collect()
}

fn container_body(
    shared: &KubeletShared,
    node: &NodeContext,
    pod: &Pod,
    container: &Container,
    image: &str,
    uses_device: bool,
) -> ContainerBody {
    let Some(binary) = shared.config.image_map.binary_for(image) else {
        let device = node.spec.kernel.as_ref().filter(|_| uses_device);
        return ContainerBody::Workload {
            device: device.map(|kernel| DeviceHold {
                kernel: kernel.clone(),
                comm: container.name.chars().take(15).collect(),
            }),
        };
    };
    let process = container_process(
        pod,
        container,
        binary,
        &shared.config.common_env,
        &node.spec.env,
    );
    let probe =
        (container.readiness_probe.as_ref()).map(|p| readiness_probe(p, container, &process));
    ContainerBody::Process { process, probe }
}

fn readiness_probe(probe: &Probe, container: &Container, process: &ProcessSpec) -> ReadinessProbe {
    let secs = |v: Option<i32>, default: u64| {
        Duration::from_secs(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(default))
    };
    ReadinessProbe {
        process: (probe.exec.as_ref()).and_then(|exec| probe_process(exec, container, process)),
        initial_delay: secs(probe.initial_delay_seconds, 0),
        period: secs(probe.period_seconds, 10),
        // Not scaled: starting a process takes real time.
        timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
        failure_threshold: (probe.failure_threshold)
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(3),
    }
}

/// Writes `status` unless it is what was written last; false when the write failed.
async fn write_status(
    shared: &KubeletShared,
    pod: &Pod,
    status: PodStatus,
    last_written: &mut Option<serde_json::Value>,
) -> bool {
    let value = serde_json::json!({ "status": status });
    if last_written.as_ref() == Some(&value) {
        return true;
    }
    let api: Api<Pod> =
        Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    match api
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&value),
        )
        .await
    {
        Ok(_) => {
            *last_written = Some(value);
            true
        }
        Err(err) if is_not_found(&err) => true,
        Err(err) => {
            debug!(pod = %pod.name_any(), error = %err, "pod status write failed; retrying");
            false
        }
    }
}

/// Whether `pod`, as last seen, shows every field of the status patch `written`.
fn shows_written_status(pod: &Pod, written: Option<&serde_json::Value>) -> bool {
    let Some(written) = written else {
        return false;
    };
    serde_json::to_value(&pod.status).is_ok_and(|seen| contains(&seen, &written["status"]))
}

/// Whether `have` holds every field of the merge patch `want` (arrays element by element).
fn contains(have: &serde_json::Value, want: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (have, want) {
        (Value::Object(have), Value::Object(want)) => want
            .iter()
            .all(|(key, field)| have.get(key).is_some_and(|h| contains(h, field))),
        (Value::Array(have), Value::Array(want)) => {
            have.len() == want.len() && have.iter().zip(want).all(|(h, w)| contains(h, w))
        }
        _ => have == want,
    }
}

/// Whether a pod uses the Tenstorrent device: a `hostPath` volume at or under `/dev/tenstorrent`,
/// or a `tenstorrent.com/*` resource request or limit on any container.
fn pod_uses_device(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let host_path = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.host_path.as_ref())
        .any(|h| h.path == DEVICE_PATH || h.path.starts_with(&format!("{DEVICE_PATH}/")));
    let resource = spec.containers.iter().any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            [r.requests.as_ref(), r.limits.as_ref()]
                .into_iter()
                .flatten()
                .any(|m| m.keys().any(|k| k.starts_with(DEVICE_RESOURCE_PREFIX)))
        })
    });
    host_path || resource
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, HostPathVolumeSource, PodSpec, ResourceRequirements, Volume,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn pod(volumes: Vec<&str>, resource: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                volumes: Some(
                    volumes
                        .into_iter()
                        .map(|p| Volume {
                            name: "v".to_owned(),
                            host_path: Some(HostPathVolumeSource {
                                path: p.to_owned(),
                                type_: None,
                            }),
                            ..Volume::default()
                        })
                        .collect(),
                ),
                containers: vec![Container {
                    resources: resource.map(|r| ResourceRequirements {
                        limits: Some(BTreeMap::from([(r.to_owned(), Quantity("1".to_owned()))])),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn device_use_is_a_host_path_or_a_resource() {
        assert!(pod_uses_device(&pod(vec!["/dev/tenstorrent"], None)));
        assert!(pod_uses_device(&pod(vec!["/dev/tenstorrent/0"], None)));
        assert!(!pod_uses_device(&pod(
            vec!["/dev/tenstorrentx", "/dev"],
            None
        )));
        assert!(pod_uses_device(&pod(vec![], Some("tenstorrent.com/n300"))));
        assert!(!pod_uses_device(&pod(vec![], Some("nvidia.com/gpu"))));
    }

    #[test]
    fn a_status_the_pod_shows_is_not_written_again() {
        let written = serde_json::json!({ "status": {
            "phase": "Running",
            "conditions": [{ "type": "Ready", "status": "True" }],
        }});
        let seen = |status: serde_json::Value| Pod {
            status: Some(serde_json::from_value(status).unwrap()),
            ..Pod::default()
        };
        let shown = seen(serde_json::json!({
            "phase": "Running", "podIP": "10.244.0.2",
            "conditions": [{ "type": "Ready", "status": "True", "lastTransitionTime": "2026-12-04T20:40:06Z" }],
        }));
        assert!(shows_written_status(&shown, Some(&written)));
        let lost = seen(serde_json::json!({ "phase": "Pending" }));
        assert!(!shows_written_status(&lost, Some(&written)));
        let not_ready = seen(serde_json::json!({
            "phase": "Running", "conditions": [{ "type": "Ready", "status": "False" }],
        }));
        assert!(!shows_written_status(&not_ready, Some(&written)));
        assert!(!shows_written_status(&shown, None));
    }
}
