//! The ttdp operator binary: parses flags, sets up logging, connects to the cluster and runs
//! [`ttdp_controller::run`] until SIGTERM or Ctrl-C.

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

/// The ttdp controller: reconciles TenstorrentDriverPolicy objects into per-node tt-kmd rollouts.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    controller: ttdp_controller::ControllerArgs,

    /// Log format (RUST_LOG sets the level, default info).
    #[arg(long, env = "TTDP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match cli.log_format {
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init(),
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
    }
    let mut options = cli.controller.run_options()?;
    let config = kube::Config::infer().await.context(
        "cannot find a kubernetes configuration; set KUBECONFIG or run in a pod with a service account",
    )?;
    // Drains retry refused evictions at their own back-off; kube's default retry would resend
    // a PodDisruptionBudget's 429 within milliseconds.
    let mut drain_config = config.clone();
    drain_config.default_retry = false;
    options.drain_client = Some(
        kube::Client::try_from(drain_config)
            .context("cannot build the drains' kubernetes client")?,
    );
    let client = kube::Client::try_from(config).context("cannot build a kubernetes client")?;
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        signal.cancel();
    });
    ttdp_controller::run(client, cli.controller.settings(), options, shutdown).await?;
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
