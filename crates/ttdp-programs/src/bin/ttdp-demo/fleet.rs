//! The simulated fleet the demo runs: which nodes exist, which one is host-managed, and which
//! workloads sit where so the upgrade has something to drain.
//!
//! Layout for `n` Tenstorrent nodes (`demo-tt-0` ... `demo-tt-<n-1>`) and `m` plain nodes
//! (`demo-cpu-0` ...; on a shared cluster the prefix is `demo-<random>`):
//! - with `n >= 2`, the last Tenstorrent node has tt-kmd installed by DKMS on the host
//!   ([`HOST_MANAGED_VERSION`]): ttdp must only observe it;
//! - the other Tenstorrent nodes start with no module loaded (a fresh install);
//! - after the install, `inference-*` replicas (one per node on the first three nodes, each
//!   mounting `/dev/tenstorrent`, one PodDisruptionBudget with `maxUnavailable: 1` over all of
//!   them), a `trainer` requesting a `tenstorrent.com/n300` device, a `log-shipper` using no
//!   device (only the full-node pass evicts it), a `monitor` holding the device on the
//!   host-managed node and a `web` pod on the first plain node. Every workload is owned by a
//!   ReplicaSet, so drains may evict it.

use ttdp_testkit::sim::{DeviceUse, SimClusterOptions, TenstorrentNode, Workload, WorkloadOwner};

/// The name prefix of every node and of the workloads' namespace on a cluster of the demo's own.
pub const DEMO_PREFIX: &str = "demo";
/// The tt-kmd version DKMS installed on the host-managed node.
pub const HOST_MANAGED_VERSION: &str = "2.6.1";
/// The label the inference replicas share (and their PodDisruptionBudget selects).
pub const INFERENCE_LABEL: (&str, &str) = ("app", "inference");
/// The PodDisruptionBudget over the inference replicas.
pub const INFERENCE_BUDGET: &str = "inference";

/// Sizes of the fleet and its names' prefix.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// Prefix of the node names.
    pub prefix: String,
    /// Tenstorrent nodes, the host-managed one included.
    pub tenstorrent: usize,
    /// Plain nodes.
    pub plain: usize,
}

impl Fleet {
    /// Whether the last Tenstorrent node is host-managed.
    pub fn has_host_managed(&self) -> bool {
        self.tenstorrent >= 2
    }

    /// Tenstorrent nodes whose driver ttdp installs.
    pub fn container_nodes(&self) -> Vec<String> {
        let count = self.tenstorrent - usize::from(self.has_host_managed());
        (0..count).map(|i| self.tenstorrent_name(i)).collect()
    }

    /// The host-managed node, if any.
    pub fn host_managed_node(&self) -> Option<String> {
        self.has_host_managed()
            .then(|| self.tenstorrent_name(self.tenstorrent - 1))
    }

    /// Plain nodes' names.
    pub fn plain_nodes(&self) -> Vec<String> {
        (0..self.plain)
            .map(|i| format!("{}-cpu-{i}", self.prefix))
            .collect()
    }

    /// The simulated cluster's nodes (the caller adds images, speed and environment).
    pub fn cluster_options(&self) -> SimClusterOptions {
        let mut options = SimClusterOptions::new()
            .name_prefix(&self.prefix)
            .plain_nodes(self.plain);
        // Two pools by label, only to show labels in the views.
        for i in 0..self.container_nodes().len() {
            let pool = if i.is_multiple_of(2) { "prod" } else { "batch" };
            options = options.node(TenstorrentNode::new().label("tt.tenstorrent.com/pool", pool));
        }
        if self.has_host_managed() {
            options = options.node(
                TenstorrentNode::new()
                    .host_managed(HOST_MANAGED_VERSION)
                    .label("tt.tenstorrent.com/pool", "lab"),
            );
        }
        options
    }

    /// The workloads placed once the first version is installed.
    pub fn workloads(&self) -> Vec<Workload> {
        let nodes = self.container_nodes();
        let mut workloads: Vec<Workload> = nodes
            .iter()
            .take(3)
            .enumerate()
            .map(|(i, node)| {
                replica(&format!("inference-{i}"), node, INFERENCE_LABEL.1)
                    .device(DeviceUse::HostPath)
            })
            .collect();
        if let Some(node) = nodes.get(3) {
            workloads.push(replica("trainer", node, "trainer").device(DeviceUse::Resource));
        }
        if let Some(node) = nodes.get(4) {
            workloads.push(replica("log-shipper", node, "log-shipper").with_empty_dir());
        }
        if let Some(node) = self.host_managed_node() {
            workloads.push(replica("monitor", &node, "monitor").device(DeviceUse::HostPath));
        }
        if let Some(node) = self.plain_nodes().first() {
            workloads.push(replica("web", node, "web"));
        }
        workloads
    }

    /// Whether the upgrade drains `workload`: it runs on a node whose driver ttdp installs (not
    /// on the host-managed node, nor on a plain one).
    pub fn is_drained(&self, workload: &Workload) -> bool {
        self.container_nodes().contains(&workload.node)
    }

    fn tenstorrent_name(&self, i: usize) -> String {
        format!("{}-tt-{i}", self.prefix)
    }
}

/// A workload labelled `app=<app>` and owned by a ReplicaSet, so drains may evict it.
fn replica(name: &str, node: &str, app: &str) -> Workload {
    Workload::new(name, node)
        .owner(WorkloadOwner::ReplicaSet)
        .label("app", app)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_tenstorrent_node_is_host_managed_and_gets_no_drained_workload() {
        let fleet = Fleet {
            prefix: DEMO_PREFIX.to_owned(),
            tenstorrent: 4,
            plain: 1,
        };
        assert_eq!(
            fleet.container_nodes(),
            ["demo-tt-0", "demo-tt-1", "demo-tt-2"]
        );
        assert_eq!(fleet.host_managed_node().as_deref(), Some("demo-tt-3"));
        let drained: Vec<String> = fleet
            .workloads()
            .into_iter()
            .filter(|w| fleet.is_drained(w))
            .map(|w| w.name)
            .collect();
        assert_eq!(drained, ["inference-0", "inference-1", "inference-2"]);
        let monitor = fleet.workloads().into_iter().find(|w| w.name == "monitor");
        assert_eq!(monitor.map(|w| w.node).as_deref(), Some("demo-tt-3"));
    }

    #[test]
    fn a_single_node_fleet_has_no_host_managed_node() {
        let fleet = Fleet {
            prefix: DEMO_PREFIX.to_owned(),
            tenstorrent: 1,
            plain: 0,
        };
        assert_eq!(fleet.container_nodes(), ["demo-tt-0"]);
        assert!(fleet.host_managed_node().is_none());
        assert_eq!(fleet.workloads().len(), 1);
    }
}
