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

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tune_malloc();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(run(cli))
}

/// glibc's malloc gives every thread that allocates at once an arena of its own (up to eight per
/// CPU) and keeps freed pages: a reconcile of thousands of nodes allocates from several runtime
/// threads, and resident memory then stays near the sum of each arena's peak. So: one arena;
/// buffers above 64 KiB (a status of thousands of nodes, its watch events) from `mmap`, so that
/// freeing them returns them; and, every second, the free pages inside the heap handed back
/// (`malloc_trim`): much less resident memory at fleet scale for a few milliseconds of CPU a
/// second (`docs/benchmarks.md` has the figures). The image's musl build has none of these
/// tunables and keeps little.
#[allow(unsafe_code)]
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters, here before any other thread exists;
        // a refused setting (return 0) leaves glibc's default, which is only less frugal.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 * 1024);
        }
        let trim = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    // SAFETY: malloc_trim takes the arena's lock like any allocation does.
                    unsafe { libc::malloc_trim(0) };
                }
            });
        if let Err(e) = trim {
            eprintln!("cannot start the malloc-trim thread ({e}); resident memory may stay higher");
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
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
