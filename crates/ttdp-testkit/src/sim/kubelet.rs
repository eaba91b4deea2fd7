//! The simulated kubelet: registers its nodes, keeps them alive, and runs the pods bound to them
//! (one pod worker each) as child processes or process-less workloads.
//!
//! It is a kube-rs client watching pods with the field selector `spec.nodeName=<node>`, so it works
//! the same against the test API server and against a real cluster, where it serves only the nodes
//! it registered.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::container_runtime::lock;
use super::error::{SimError, allow_status};
use super::image_map::ImageMap;
use super::node_heartbeat::{SimNodeSpec, heartbeat, register_node};
use super::pod_status::pod_is_finished;
use super::pod_worker::{KubeletShared, NodeContext, PodUpdate, PodWorker};
use super::time_scale::TimeScale;

/// The kubelet's node status update period.
const HEARTBEAT_PERIOD: Duration = Duration::from_secs(10);

/// How the simulated kubelet runs containers.
#[derive(Debug, Clone, Default)]
pub struct KubeletConfig {
    /// Images run as local binaries; all others are workload containers.
    pub image_map: ImageMap,
    /// Speed of simulated time (probe periods, back-off, grace periods, heartbeats).
    pub time_scale: TimeScale,
    /// Environment every mapped container on every node starts from (e.g. `KUBECONFIG`,
    /// `PATH`); the pod's own `env` may override it.
    pub common_env: Vec<(String, String)>,
    /// Where container output goes (`<namespace>_<pod>_<container>.log`); none: discarded.
    pub log_dir: Option<PathBuf>,
    /// Number of this kubelet's first node among all simulated nodes, so that several kubelets
    /// in one cluster give their nodes and pods distinct addresses.
    pub first_node_index: usize,
}

type Workers = Arc<Mutex<HashMap<String, PodWorker>>>;

/// A running simulated kubelet serving one or more nodes. Stop it with [`SimKubelet::shutdown`];
/// dropping it stops its tasks too (child processes are then killed on drop).
pub struct SimKubelet {
    client: Client,
    nodes: Vec<String>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    workers: Workers,
}

impl SimKubelet {
    /// Registers `nodes` and starts serving them. Node number `i` (counting from
    /// `first_node_index`) gets host IP `10.0.<i/250>.<i%250+2>` and pod IPs `10.244.<i%250>.*`.
    pub async fn start(
        client: Client,
        config: KubeletConfig,
        nodes: Vec<SimNodeSpec>,
    ) -> Result<Self, SimError> {
        let shutdown = CancellationToken::new();
        if let Some(dir) = &config.log_dir {
            std::fs::create_dir_all(dir).map_err(|source| SimError::HostIo {
                path: dir.clone(),
                source,
            })?;
        }
        let (first_node_index, time_scale) = (config.first_node_index, config.time_scale);
        let shared = Arc::new(KubeletShared {
            client: client.clone(),
            config,
            shutdown: shutdown.clone(),
        });
        let workers: Workers = Arc::default();
        let mut tasks = Vec::new();
        let mut names = Vec::new();
        for (offset, spec) in nodes.into_iter().enumerate() {
            let i = first_node_index + offset;
            let index = u8::try_from(i % 250).unwrap_or(0);
            let host_ip = format!("10.0.{}.{}", i / 250, usize::from(index) + 2);
            register_node(&client, &spec, &host_ip).await?;
            info!(node = %spec.name, host_ip = %host_ip, "simulated node registered");
            names.push(spec.name.clone());
            let node = Arc::new(NodeContext {
                spec,
                host_ip,
                index,
            });
            tasks.push(tokio::spawn(heartbeat_loop(
                client.clone(),
                node.clone(),
                time_scale,
                shutdown.clone(),
            )));
            tasks.push(tokio::spawn(serve_node(
                shared.clone(),
                node,
                workers.clone(),
            )));
        }
        Ok(Self {
            client,
            nodes: names,
            shutdown,
            tasks,
            workers,
        })
    }

    /// Stops serving: kills every container (releasing device holds) without touching the API.
    pub async fn shutdown(mut self) {
        self.stop().await;
    }

    /// Stops serving and deletes this kubelet's Node objects (for shared real clusters).
    pub async fn shutdown_and_unregister(mut self) -> Result<(), SimError> {
        self.stop().await;
        delete_nodes(&self.client, &self.nodes).await
    }

    async fn stop(&mut self) {
        self.shutdown.cancel();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        let workers: Vec<PodWorker> = lock(&self.workers).drain().map(|(_, w)| w).collect();
        for worker in workers {
            let _ = tokio::time::timeout(Duration::from_secs(10), worker.task).await;
        }
    }
}

impl std::fmt::Debug for SimKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimKubelet")
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl Drop for SimKubelet {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Deletes the Node objects `names` (those already gone too).
pub(crate) async fn delete_nodes(client: &Client, names: &[String]) -> Result<(), SimError> {
    let api: Api<Node> = Api::all(client.clone());
    for name in names {
        let deleted = api.delete(name, &DeleteParams::default()).await;
        allow_status(deleted, 404, || format!("delete simulated node {name}"))?;
    }
    Ok(())
}

async fn heartbeat_loop(
    client: Client,
    node: Arc<NodeContext>,
    scale: TimeScale,
    shutdown: CancellationToken,
) {
    let period = scale
        .scale(HEARTBEAT_PERIOD)
        .max(Duration::from_millis(200));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        if let Err(err) = heartbeat(&client, &node.spec, &node.host_ip).await {
            debug!(node = %node.spec.name, error = %err, "node heartbeat failed; retrying");
        }
    }
}

async fn serve_node(shared: Arc<KubeletShared>, node: Arc<NodeContext>, workers: Workers) {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", node.spec.name));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut next_ip: u8 = 2;
    // Uids seen during a relist; pods missing from it are gone.
    let mut relisted: Option<Vec<String>> = None;
    loop {
        let event = tokio::select! {
            () = shared.shutdown.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Err(err)) => {
                debug!(node = %node.spec.name, error = %err, "pod watch error; retrying")
            }
            Some(Ok(Event::Init)) => relisted = Some(Vec::new()),
            Some(Ok(Event::InitApply(pod))) => {
                if let Some(seen) = relisted.as_mut() {
                    seen.push(pod.uid().unwrap_or_default());
                }
                apply(&shared, &node, &workers, pod, &mut next_ip);
            }
            Some(Ok(Event::InitDone)) => {
                if let Some(seen) = relisted.take() {
                    let gone: Vec<String> = lock(&workers)
                        .keys()
                        .filter(|uid| !seen.contains(uid))
                        .cloned()
                        .collect();
                    for uid in gone {
                        forget(&workers, &uid);
                    }
                }
            }
            Some(Ok(Event::Apply(pod))) => apply(&shared, &node, &workers, pod, &mut next_ip),
            Some(Ok(Event::Delete(pod))) => forget(&workers, &pod.uid().unwrap_or_default()),
        }
    }
}

fn apply(
    shared: &Arc<KubeletShared>,
    node: &Arc<NodeContext>,
    workers: &Workers,
    pod: Pod,
    next_ip: &mut u8,
) {
    let Some(uid) = pod.uid() else {
        return;
    };
    if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node.spec.name.as_str()) {
        forget(workers, &uid);
        return;
    }
    let mut workers = lock(workers);
    if let Some(worker) = workers.get(&uid) {
        if !worker.task.is_finished() {
            let _ = worker.updates.send(PodUpdate::Present(Box::new(pod)));
        }
        return;
    }
    // A pod that already ended is not started again (e.g. after a kubelet restart).
    if pod_is_finished(&pod) {
        return;
    }
    let pod_ip = if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
        node.host_ip.clone()
    } else {
        let ip = format!("10.244.{}.{}", node.index, *next_ip);
        *next_ip = if *next_ip >= 254 { 2 } else { *next_ip + 1 };
        ip
    };
    info!(node = %node.spec.name, pod = %pod.name_any(), "pod bound to simulated node");
    workers.insert(
        uid,
        PodWorker::start(shared.clone(), node.clone(), pod, pod_ip),
    );
}

fn forget(workers: &Workers, uid: &str) {
    let removed = lock(workers).remove(uid);
    if let Some(worker) = removed
        && worker.updates.send(PodUpdate::Gone).is_err()
        && !worker.task.is_finished()
    {
        warn!(
            uid,
            "pod worker does not listen; it will stop with the kubelet"
        );
    }
}
