//! One status write alone: how long the real API server takes to record one node's new state
//! in a policy whose `status.nodes` lists `n` nodes, on a control plane started for the run with
//! nothing else on it. A hand-off is recorded by such a write (the next node's Cordoning is in
//! it), so this is a floor under the fleet suite's hand-off figure on the same machine.
//!
//! Each timed write is what the controller sends: a JSON patch that replaces one entry (the
//! server still decodes, validates, stores and sends the whole object). The time includes
//! reading the answer, the whole policy, which the controller does not ask for (it takes only
//! the metadata); so it is a little above the server's own. The entries look like a rollout's:
//! most nodes Done, one in ten Draining with its reason and message.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use ttdp_api::{NodeState, NodeStatus, TenstorrentDriverPolicy};
use ttdp_testkit::cluster_setup::{create_policy, install_crd};
use ttdp_testkit::sim::cluster::client_for;

use crate::figures::{print_result, spread};

/// Flags of `ttdp-bench status-write`.
#[derive(Debug, Args)]
pub struct StatusWriteArgs {
    /// Node entries in the status, one policy each.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub entries: Vec<usize>,
    /// Writes timed per policy.
    #[arg(long, default_value_t = 60)]
    pub writes: usize,
}

/// Runs the suite and prints its result line.
pub async fn run(args: &StatusWriteArgs) -> Result<()> {
    let plane = crate::control_plane(&Default::default())?;
    let client = client_for(plane.kubeconfig()).await?;
    install_crd(&client).await?;
    let mut sizes = Vec::new();
    for &n in &args.entries {
        let size = time_writes(&client, n, args.writes).await?;
        eprintln!("status-write: {n} entries: {size}");
        sizes.push(size);
    }
    print_result(&json!({
        "suite": "status_write",
        "server": "real control plane",
        "writes": args.writes,
        "sizes": sizes,
    }));
    Ok(())
}

/// Creates a policy listing `n` nodes, then times `writes` writes of one changed entry each.
async fn time_writes(client: &Client, n: usize, writes: usize) -> Result<Value> {
    if n == 0 {
        bail!("a status to write needs at least one node entry");
    }
    let name = format!("status-write-{n}");
    let spec = json!({ "version": "2.1.0", "nodeAffinity": {} });
    create_policy(client, json!({ "name": name }), spec).await?;
    let api: Api<TenstorrentDriverPolicy> = Api::all(client.clone());
    let mut draining: Vec<bool> = (0..n).map(|i| i % 10 == 0).collect();
    let nodes: Vec<Value> = (0..n)
        .map(|i| entry(i, draining[i]))
        .collect::<Result<_>>()?;
    let status = json!({ "status": { "observedGeneration": 1, "nodes": nodes } });
    let bytes = serde_json::to_vec(&status)?.len();
    let params = PatchParams::default();
    api.patch_status(&name, &params, &Patch::Merge(&status))
        .await
        .with_context(|| format!("cannot write the first status of {name}"))?;
    let mut took = Vec::with_capacity(writes);
    for k in 0..writes {
        // Each write moves one node between Draining and Done, as a hand-off does.
        let i = k % n;
        draining[i] = !draining[i];
        let patch: json_patch::Patch = serde_json::from_value(json!([
            { "op": "replace", "path": format!("/status/nodes/{i}"), "value": entry(i, draining[i])? }
        ]))?;
        let started = Instant::now();
        api.patch_status(&name, &params, &Patch::Json::<()>(patch))
            .await
            .with_context(|| format!("cannot write the status of {name}"))?;
        took.push(started.elapsed());
    }
    let s = spread(took);
    Ok(json!({ "entries": n, "status_bytes": bytes, "write_ms": s.json() }))
}

/// Node `i`'s entry, Done or Draining.
fn entry(i: usize, draining: bool) -> Result<Value> {
    let time = |at: &str| -> Result<Time> { Ok(Time(at.parse()?)) };
    let mut entry = NodeStatus {
        name: format!("tt-{i:05}"),
        state: NodeState::Done,
        current_version: Some("2.1.0".to_owned()),
        target_version: None,
        install_mode: Some("container".to_owned()),
        reason: None,
        message: None,
        last_transition_time: Some(time("2026-12-06T03:30:17Z")?),
        phase_start_time: None,
        attempts: None,
        loaded_parameters: None,
        source_commit: None,
        udev_rule: None,
        next_kernels: None,
        module_signer: None,
        start_load: None,
    };
    if draining {
        entry.state = NodeState::Draining;
        entry.current_version = Some("2.0.0".to_owned());
        entry.target_version = Some("2.1.0".to_owned());
        entry.reason = Some("EvictingPods".to_owned());
        entry.message = Some("evicting 2 pods that use the device".to_owned());
        entry.phase_start_time = Some(time("2026-12-06T03:30:15Z")?);
    }
    Ok(serde_json::to_value(entry)?)
}
