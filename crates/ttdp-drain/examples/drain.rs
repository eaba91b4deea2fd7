//! `kubectl drain` built on ttdp-drain, printing what kubectl prints, so the library can be
//! compared with kubectl on any cluster:
//!
//! ```text
//! cargo run -p ttdp-drain --example drain -- NODE [--kubeconfig FILE] [--context NAME]
//!     [--ignore-daemonsets] [--delete-emptydir-data] [--force] [--pod-selector SELECTOR]
//!     [--timeout 60s] [--disable-eviction] [--dry-run] [--grace-period N]
//! ```
//!
//! Unlike kubectl it records who cordoned the node in the annotations
//! `drain.example.com/cordoned-by` (the `--owner`, default `ttdp-drain-example`) and
//! `drain.example.com/cordoned-at`; `--uncordon` lifts that cordon (and only that one).
//! `RUST_LOG=ttdp_drain=debug` shows the library's logs on stderr.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use ttdp_drain::{
    CordonOutcome, CordonOwner, Disposition, DrainError, DrainEvent, DrainEventKind, DrainOptions,
    Drainer, EventSink, PodDecision, PodRules, UncordonOutcome,
};
use ttdp_selector::Selector;

/// Drain a node the way `kubectl drain` does.
#[derive(Debug, Parser)]
#[command(name = "drain")]
struct Args {
    /// The node to drain.
    node: String,
    /// Path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config, or in-cluster).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long)]
    context: Option<String>,
    /// Ignore DaemonSet-managed pods.
    #[arg(long)]
    ignore_daemonsets: bool,
    /// Continue even if there are pods using emptyDir (their data is deleted).
    #[arg(long)]
    delete_emptydir_data: bool,
    /// Continue even if there are pods that declare no controller.
    #[arg(long)]
    force: bool,
    /// Label selector to filter pods on the node.
    #[arg(long, default_value = "")]
    pod_selector: String,
    /// How long to wait before giving up, e.g. 60s, 5m, 1h30m; 0 waits forever.
    #[arg(long, default_value = "0s", value_parser = ttdp_api::duration::parse_duration)]
    timeout: Duration,
    /// Delete pods instead of evicting them, bypassing PodDisruptionBudgets.
    #[arg(long)]
    disable_eviction: bool,
    /// Only print what would be done (`client`; `none` is a normal run).
    #[arg(long, num_args = 0..=1, default_missing_value = "client", default_value = "none")]
    dry_run: String,
    /// Seconds each pod gets to terminate; negative uses the pod's own.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    grace_period: i64,
    /// Skip pods that have been terminating for longer than this many seconds (0: never).
    #[arg(long, default_value_t = 0)]
    skip_wait_for_delete_timeout: u64,
    /// At most this many eviction requests in flight.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// The cordon owner recorded on the node.
    #[arg(long, default_value = "ttdp-drain-example")]
    owner: String,
    /// Lift this owner's cordon instead of draining.
    #[arg(long)]
    uncordon: bool,
}

async fn client(args: &Args) -> anyhow::Result<Client> {
    let mut config = if args.kubeconfig.is_some() || args.context.is_some() {
        let kubeconfig = match &args.kubeconfig {
            Some(path) => Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?,
            None => Kubeconfig::read().context("cannot read the kubeconfig")?,
        };
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..KubeConfigOptions::default()
        };
        Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .context("cannot load the kubeconfig")?
    } else {
        Config::infer()
            .await
            .context("cannot find a kubeconfig or in-cluster config")?
    };
    // ttdp-drain paces refused evictions itself (as kubectl does); kube's own retry of 429s
    // would resend them within milliseconds instead.
    config.default_retry = false;
    Client::try_from(config).context("cannot build a Kubernetes client")
}

/// kubectl groups pods by message: `Warning: ignoring DaemonSet-managed Pods: ns/a, ns/b`.
fn grouped<'a>(items: impl Iterator<Item = (String, &'a PodDecision)>) -> Vec<String> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (message, d) in items {
        groups.entry(message).or_default().push(d.pod.to_string());
    }
    groups
        .into_iter()
        .map(|(message, pods)| format!("{message}: {}", pods.join(", ")))
        .collect()
}

fn print_event(event: &DrainEvent, dry_run: &str) {
    match &event.kind {
        DrainEventKind::Planned { decisions } => {
            let warnings = decisions.iter().flat_map(|d| {
                let skipped = (d.disposition == Disposition::Skip
                    && d.reason == ttdp_drain::Reason::DaemonSetIgnored)
                    .then(|| (d.reason.to_string(), d));
                d.warnings
                    .iter()
                    .map(move |w| (w.to_string(), d))
                    .chain(skipped)
            });
            for line in grouped(warnings) {
                eprintln!("Warning: {line}");
            }
        }
        DrainEventKind::Evicting { pod } => println!("evicting pod {pod}{dry_run}"),
        DrainEventKind::Deleting { pod } => println!("deleting pod {pod}{dry_run}"),
        DrainEventKind::EvictionBlocked {
            pod,
            message,
            held,
            retry_in,
            ..
        } => eprintln!(
            "error when evicting pods/\"{}\" -n \"{}\" (will retry after {:.1}s at the latest): {message}{}",
            pod.name,
            pod.namespace,
            retry_in.as_secs_f64(),
            ttdp_drain::held_text(held)
        ),
        DrainEventKind::RequestFailed {
            pod,
            error,
            retry_in,
        } => eprintln!(
            "error when removing pod {pod} (will retry after {:.1}s): {error}",
            retry_in.as_secs_f64()
        ),
        DrainEventKind::Gone { pod, removal } => println!("pod/{} {removal}", pod.name),
        DrainEventKind::PassStarted { .. }
        | DrainEventKind::WaitingForCompletion { .. }
        | DrainEventKind::Done { .. } => {}
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let dry_run = match args.dry_run.as_str() {
        "none" => false,
        "client" => true,
        other => bail!(
            "--dry-run must be none or client, got {other:?} (server dry run is not supported)"
        ),
    };
    let suffix = if dry_run { " (dry run)" } else { "" };
    let node = args.node.as_str();
    let owner = CordonOwner {
        owner: args.owner.clone(),
        owner_annotation: "drain.example.com/cordoned-by".into(),
        time_annotation: "drain.example.com/cordoned-at".into(),
    };
    let drainer = Drainer::new(client(&args).await?)
        .with_events(EventSink::new(move |e| print_event(e, suffix)));

    if args.uncordon {
        match drainer.uncordon(node, &owner).await? {
            UncordonOutcome::Uncordoned => println!("node/{node} uncordoned"),
            UncordonOutcome::NotCordoned => println!("node/{node} already uncordoned"),
            UncordonOutcome::NodeMissing => bail!("nodes \"{node}\" not found"),
            UncordonOutcome::External { owner } => println!(
                "node/{node} left cordoned: cordoned by {}",
                owner.as_deref().unwrap_or("someone else")
            ),
        }
        return Ok(());
    }

    if dry_run {
        println!("node/{node} cordoned (dry run)");
    } else {
        match drainer.cordon(node, &owner).await? {
            CordonOutcome::Cordoned => println!("node/{node} cordoned"),
            CordonOutcome::AlreadyOwned | CordonOutcome::External { .. } => {
                println!("node/{node} already cordoned")
            }
        }
    }

    let options = DrainOptions {
        rules: PodRules {
            ignore_daemonsets: args.ignore_daemonsets,
            delete_emptydir_data: args.delete_emptydir_data,
            force: args.force,
            selector: Selector::parse(&args.pod_selector)?,
            skip_wait_for_delete_timeout: (args.skip_wait_for_delete_timeout > 0)
                .then(|| Duration::from_secs(args.skip_wait_for_delete_timeout)),
            ..PodRules::default()
        },
        timeout: (!args.timeout.is_zero()).then_some(args.timeout),
        disable_eviction: args.disable_eviction,
        grace_period: u32::try_from(args.grace_period).ok(),
        dry_run,
        concurrency: args.concurrency,
        ..DrainOptions::default()
    };
    match drainer.drain(node, &options).await {
        Ok(report) => {
            if report.dry_run {
                for d in report.with(Disposition::Evict) {
                    println!("evicting pod {} (dry run)", d.pod);
                }
                for d in report.with(Disposition::Delete) {
                    println!("deleting pod {} (dry run)", d.pod);
                }
            }
            println!("node/{node} drained{suffix}");
            Ok(())
        }
        Err(DrainError::Refused { pods, .. }) => {
            let lines = grouped(pods.iter().map(|d| (d.reason.to_string(), d)));
            eprintln!(
                "error: unable to drain node {node:?} due to error: [{}], continuing command...",
                lines.join(", ")
            );
            eprintln!("There are pending nodes to be drained:\n {node}");
            for line in lines {
                eprintln!("{line}");
            }
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("error: unable to drain node {node:?}: {e}");
            std::process::exit(1);
        }
    }
}
