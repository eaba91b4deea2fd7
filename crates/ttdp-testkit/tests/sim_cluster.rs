//! `SimCluster`: the nodes it registers, their simulated hosts, heartbeats and leases.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use ttdp_testkit::sim::{
    SCENARIO_LABEL, SimCluster, SimClusterOptions, TenstorrentNode, eventually,
};

const NFD: &str = "feature.node.kubernetes.io/pci-1200_1e52.present";

fn ready(node: &Node) -> Option<(String, jiff::Timestamp)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .clone();
    Some((c.status, c.last_heartbeat_time?.0))
}

#[tokio::test]
async fn nodes_hosts_and_heartbeats() {
    let cluster = SimCluster::start(
        SimClusterOptions::new()
            .node(TenstorrentNode::new())
            .node(TenstorrentNode::new().loaded("2.1.0").label("pool", "prod"))
            .node(TenstorrentNode::new().host_managed("1.34.0"))
            .plain_nodes(1)
            .kmd_versions(&["2.2.0"])
            .time_scale(0.05),
    )
    .await
    .unwrap();
    let tt = cluster.tenstorrent_node_names();
    let plain = cluster.plain_node_names();
    assert_eq!(tt.len(), 3);
    assert_eq!(plain.len(), 1);
    assert!(
        tt.iter()
            .chain(&plain)
            .all(|n| n.starts_with(cluster.prefix())),
        "every name carries the scenario prefix"
    );

    let nodes: Api<Node> = Api::all(cluster.client());
    // Only this scenario's nodes: on a shared (real) cluster other scenarios add theirs.
    let listed = nodes
        .list(
            &ListParams::default()
                .labels(&format!("{NFD}=true,{SCENARIO_LABEL}={}", cluster.prefix())),
        )
        .await
        .unwrap();
    let mut names: Vec<String> = listed
        .items
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, tt, "only Tenstorrent nodes carry the NFD label");
    let scenario = nodes
        .list(&ListParams::default().labels(&format!("{SCENARIO_LABEL}={}", cluster.prefix())))
        .await
        .unwrap();
    assert_eq!(
        scenario.items.len(),
        4,
        "every node carries the scenario label"
    );
    let prod = cluster.get_node(&tt[1]).await.unwrap();
    assert_eq!(prod.metadata.labels.as_ref().unwrap()["pool"], "prod");
    let capacity = prod.status.as_ref().unwrap().allocatable.clone().unwrap();
    assert_eq!(capacity["tenstorrent.com/n300"].0, "4");

    // Hosts: module state and DKMS signals as asked.
    let root = |i: usize| {
        cluster
            .node(&tt[i])
            .unwrap()
            .host_root()
            .unwrap()
            .to_path_buf()
    };
    assert!(
        !root(0).join("sys/module/tenstorrent").exists(),
        "no module on a fresh node"
    );
    assert_eq!(
        std::fs::read_to_string(root(1).join("sys/module/tenstorrent/version"))
            .unwrap()
            .trim(),
        "2.1.0"
    );
    assert_eq!(
        std::fs::read_to_string(root(2).join("sys/module/tenstorrent/version"))
            .unwrap()
            .trim(),
        "1.34.0"
    );
    assert!(root(2).join("var/lib/dkms/tenstorrent").is_dir());
    assert!(
        root(2)
            .join("usr/src/tenstorrent-1.34.0/dkms.conf")
            .is_file()
    );
    assert!(!root(1).join("var/lib/dkms/tenstorrent").exists());
    assert!(cluster.node(&plain[0]).unwrap().host_root().is_none());
    let node = |i: usize| cluster.node(&tt[i]).unwrap();
    assert_eq!(node(0).loaded_version(), None);
    assert_eq!(node(1).loaded_version().as_deref(), Some("2.1.0"));
    assert_eq!(node(1).device_refcnt(), Some(0));
    assert_eq!(cluster.node(&plain[0]).unwrap().device_refcnt(), None);
    let tags = std::process::Command::new("git")
        .arg("-C")
        .arg(cluster.kmd_repo().dir())
        .arg("tag")
        .output()
        .unwrap();
    let tags = String::from_utf8(tags.stdout).unwrap();
    for v in ["1.34.0", "2.1.0", "2.2.0"] {
        assert!(tags.lines().any(|t| t == format!("ttkmd-{v}")), "{tags}");
    }

    // Heartbeats: Ready stays True with a moving heartbeat, and each node has a fresh lease.
    let (status, first) = ready(&nodes.get(&tt[0]).await.unwrap()).unwrap();
    assert_eq!(status, "True");
    eventually("a newer heartbeat", Duration::from_secs(10), || {
        let nodes = nodes.clone();
        let name = tt[0].clone();
        async move {
            let (status, beat) = ready(&nodes.get(&name).await.ok()?)?;
            (status == "True" && beat > first).then_some(())
        }
    })
    .await
    .unwrap();
    let leases: Api<Lease> = Api::namespaced(cluster.client(), "kube-node-lease");
    for name in tt.iter().chain(&plain) {
        let lease = leases.get(name).await.unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(name.as_str()));
        assert!(spec.renew_time.is_some());
        assert_eq!(lease.metadata.owner_references.unwrap()[0].kind, "Node");
    }
    cluster.shutdown().await.unwrap();
}
