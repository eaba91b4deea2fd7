//! `spec.source.prebuilt` end to end: the real controller, the real agent binary on simulated
//! nodes and a real control plane, with the modules served over HTTP on loopback. The fleet
//! upgrades from the server alone (the policy's repository does not exist, so nothing can be
//! built), loading only files whose checksums the policy pins; a file the server vouches for
//! but that is not the pinned one fails the node and leaves its driver loaded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use harness::{Harness, STEP, node_entry, tt_node};
use serde_json::json;
use sha2::{Digest, Sha256};
use ttdp_api::NodeState;
use ttdp_kmod::{BuildOptions, HostRoot, KoCache, SimHost, build_module};
use ttdp_testkit::sim::DEFAULT_KERNEL_RELEASE;

/// A plain HTTP file server on loopback answering from a path table, recording what was asked.
struct FileServer {
    base: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl FileServer {
    fn start(files: HashMap<String, Vec<u8>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request);
                let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
                seen.lock().unwrap().push(path.clone());
                let (status, body) = match files.get(&path) {
                    Some(body) => ("200 OK", body.clone()),
                    None => ("404 Not Found", b"not found".to_vec()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&body);
            }
        });
        Self { base, requests }
    }

    fn template(&self) -> String {
        format!(
            "{}/tt-kmd/{{version}}/{{kernelRelease}}/tenstorrent.ko",
            self.base
        )
    }

    fn downloads_of(&self, version: &str) -> usize {
        let path = ko_path(version);
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|p| **p == path)
            .count()
    }
}

fn ko_path(version: &str) -> String {
    format!("/tt-kmd/{version}/{DEFAULT_KERNEL_RELEASE}/tenstorrent.ko")
}

/// `version` built from the cluster's tt-kmd repository for the simulated nodes' kernel, with
/// its checksum file; `tampered` publishes another file in its place, with that file's own
/// checksum (what whoever controls the server can do). Returns the sha256 of the genuine file.
fn publish(
    files: &mut HashMap<String, Vec<u8>>,
    h: &Harness,
    version: &str,
    tampered: bool,
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let host = SimHost::create(dir.path().join("host"), DEFAULT_KERNEL_RELEASE).unwrap();
    let options = BuildOptions {
        repository: h.cluster.kmd_repo().url(),
        work_dir: Some(dir.path().join("work")),
        ..BuildOptions::default()
    };
    let built = build_module(
        host.host(),
        DEFAULT_KERNEL_RELEASE,
        &version.parse().unwrap(),
        &options,
    )
    .unwrap();
    let mut ko = std::fs::read(&built.ko_path).unwrap();
    let genuine = format!("{:x}", Sha256::digest(&ko));
    if tampered {
        // still a module of this version for this kernel: only the pin tells it apart
        ko.extend_from_slice(b"\0tampered");
    }
    let sum = format!("{:x}", Sha256::digest(&ko));
    files.insert(ko_path(version), ko);
    files.insert(
        format!("{}.sha256", ko_path(version)),
        format!("{sum}  tenstorrent.ko\n").into_bytes(),
    );
    genuine
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_upgrades_from_prebuilt_modules_without_building() {
    let h = Harness::start(|p| vec![tt_node(p).loaded("2.7.0"), tt_node(p).loaded("2.7.0")]).await;
    h.cluster.kmd_repo().add_version("2.9.0").unwrap();
    let mut files = HashMap::new();
    let mut pins = Vec::new();
    for (version, tampered) in [("2.7.0", false), ("2.8.0", false), ("2.9.0", true)] {
        let sum = publish(&mut files, &h, version, tampered);
        pins.push(
            json!({"version": version, "kernelRelease": DEFAULT_KERNEL_RELEASE, "sha256": sum}),
        );
    }
    let server = FileServer::start(files);
    let source = |fallback: &str| {
        json!({
            "repository": "https://git.invalid/no/such/tt-kmd.git",
            "prebuilt": {
                "url": server.template(),
                "fallback": fallback,
                "allowInsecureHttp": true,
                "checksums": pins,
            },
        })
    };
    let policy = h
        .create_policy("prebuilt", "2.7.0", json!({"source": source("Fail")}))
        .await;
    h.wait_ready(&policy, STEP).await;

    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    h.wait_ready(&policy, STEP * 2).await;
    for node in h.nodes() {
        assert_eq!(h.kmd_version(&node).await.as_deref(), Some("2.8.0"));
        let host = HostRoot::new(h.cluster.node(&node).unwrap().host_root().unwrap());
        let record = KoCache::new(&host)
            .record(DEFAULT_KERNEL_RELEASE, &"2.8.0".parse().unwrap())
            .unwrap();
        assert_eq!(
            record.source_repository,
            format!("{}{}", server.base, ko_path("2.8.0")),
            "{node} cached the download"
        );
        assert_eq!(record.source_commit, None, "{node}: nothing was built");
    }
    assert_eq!(server.downloads_of("2.8.0"), 2, "one download per node");

    // a file the server vouches for that is not the pinned one: the node fails and keeps 2.8.0
    h.patch_spec(&policy, json!({"version": "2.9.0"})).await;
    let first = h.nodes()[0].clone();
    let p = h
        .wait_policy(
            &policy,
            "a node failed with PrebuiltRejected",
            STEP * 2,
            |p| {
                node_entry(p, &first).is_some_and(|e| {
                    e.state == NodeState::Failed && e.reason.as_deref() == Some("PrebuiltRejected")
                })
            },
        )
        .await;
    let message = node_entry(&p, &first).unwrap().message.clone().unwrap();
    assert!(
        message.contains("spec.source.prebuilt.checksums pins") && message.contains("2.9.0"),
        "{message}"
    );
    assert_eq!(
        h.kmd_version(&first).await.as_deref(),
        Some("2.8.0"),
        "the working driver stays loaded"
    );
    assert_eq!(
        h.cluster.node(&first).unwrap().loaded_version().as_deref(),
        Some("2.8.0")
    );
    h.shutdown().await;
}
