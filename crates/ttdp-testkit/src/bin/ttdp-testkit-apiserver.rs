//! Runs the in-process test API server as a standalone process (for the demo and for manual
//! kubectl sessions): prints the kubeconfig path and serves until Ctrl-C or SIGTERM.

use std::time::Duration;

use clap::Parser;
use ttdp_testkit::apiserver::{PodTermination, TestApiServer};
use ttdp_testkit::sim::DaemonSetController;
use ttdp_testkit::sim::control_plane::WorkloadControlPlane;

/// Serve the ttdp test Kubernetes API server on 127.0.0.1.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Port to listen on (0 picks a free one).
    #[arg(long, env = "TTDP_APISERVER_PORT", default_value_t = 0)]
    port: u16,
    /// Leave graceful pod deletions to a kubelet instead of completing them after 200 ms.
    #[arg(long, env = "TTDP_APISERVER_KUBELET_DELETES")]
    kubelet_deletes: bool,
    /// Also run the DaemonSet and ReplicaSet controller and scheduler stand-ins, so that the
    /// server plays a whole control plane for suites run in real-cluster mode
    /// (`TTDP_TEST_KUBECONFIG`).
    #[arg(long, env = "TTDP_APISERVER_CONTROLLERS")]
    controllers: bool,
    /// Also copy the kubeconfig to this path.
    #[arg(long, env = "TTDP_APISERVER_KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut builder = TestApiServer::builder().port(args.port);
    if args.kubelet_deletes {
        builder = builder.pod_termination(PodTermination::Kubelet);
    }
    let server = builder.start().await?;
    let path = match &args.kubeconfig {
        Some(p) => {
            std::fs::copy(server.kubeconfig_path(), p)?;
            p.clone()
        }
        None => server.kubeconfig_path().to_path_buf(),
    };
    let controllers = if args.controllers {
        let client = server.client().await?;
        Some((
            DaemonSetController::start(client.clone(), Duration::from_secs(30)),
            WorkloadControlPlane::start(client, Duration::from_secs(1)),
        ))
    } else {
        None
    };
    println!("{}", path.display());
    eprintln!(
        "serving {} ; export KUBECONFIG={} ; Ctrl-C to stop",
        server.url(),
        path.display()
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = terminate.recv() => {}
    }
    if let Some((daemonsets, workloads)) = controllers {
        daemonsets.shutdown().await;
        workloads.shutdown().await;
    }
    server.shutdown().await;
    Ok(())
}
