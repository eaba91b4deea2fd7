//! The command line: `kubectl tt driver
//! [status|nodes|describe|logs|watch|pause|resume|retry|skip|completion]`.
//!
//! The connection flags are kubectl's (`--kubeconfig`, `--context`, `--cluster`, `--user`,
//! `-n/--namespace`, `--request-timeout`) and `KUBECONFIG` is honoured the same way, so the plugin
//! talks to whatever `kubectl` talks to.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ttdp_api::NodeState;

const AFTER_HELP: &str = "\
States and colours: Done (green); Cordoning, Draining, Upgrading, Uncordoning (cyan);
Pending and paused policies (yellow); Failed, Conflict (red); HostManaged (grey).
Colours are off when stdout is not a terminal, with --no-color, or when NO_COLOR is set.

Examples:
  kubectl tt driver                      # every policy, one column per node
  kubectl tt driver -o wide              # one row per node instead
  kubectl tt driver nodes default        # why is a node stuck?
  kubectl tt driver nodes default --state Failed,Draining
  kubectl tt driver logs node-3          # the agent's log on node-3
  kubectl tt driver describe default     # spec, conditions, nodes, recent Events
  kubectl tt driver watch                # redraw on every change
  kubectl tt driver pause default        # stop starting new upgrade steps
  kubectl tt driver retry default node-3 # retry a Failed node now";

/// `kubectl tt driver`: one view of TenstorrentDriverPolicy rollouts.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-tt-driver",
    bin_name = "kubectl tt driver",
    version,
    about = "One view of TenstorrentDriverPolicy rollouts: policies, nodes, states and versions",
    long_about = "One view of TenstorrentDriverPolicy rollouts: every policy (CR), the state and loaded \
tt-kmd version of each of its nodes, and what needs attention. Without a subcommand it runs `status`.",
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// How to reach the cluster.
    #[command(flatten)]
    pub connection: ConnectionArgs,

    /// Never colour the output (also: NO_COLOR set to anything).
    #[arg(long, global = true)]
    pub no_color: bool,

    /// What to do (default: status).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Options of the default `status` command.
    #[command(flatten)]
    pub status: StatusArgs,
}

impl Cli {
    /// Parses `args` (program name first). Connection flags may come before or after the
    /// subcommand, as with kubectl; `status`'s own `-o` and `--watch` given before another
    /// subcommand are an error rather than silently ignored.
    pub fn try_parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cli = Cli::try_parse_from(args)?;
        let status_flags = cli.status.output != Output::Table || cli.status.watch;
        if status_flags && cli.command.is_some() {
            return Err(<Cli as clap::CommandFactory>::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "-o/--output and --watch before a subcommand belong to `status`; put them after the subcommand",
            ));
        }
        Ok(cli)
    }
}

/// kubectl's connection flags.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct ConnectionArgs {
    /// Path to the kubeconfig file (default: KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,

    /// The kubeconfig cluster to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub cluster: Option<String>,

    /// The kubeconfig user to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub user: Option<String>,

    /// Namespace of the operator's DaemonSets (default: search every namespace). Policies are
    /// cluster-scoped.
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// How long to wait for a single request, like kubectl's: `0` (no limit), `30s`, `2m`, `1h`.
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_timeout)]
    pub request_timeout: Option<Duration>,
}

/// Parses kubectl's `--request-timeout`: a number with an optional `s`, `m` or `h` unit.
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: use e.g. 0, 30s, 2m or 1h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("invalid duration unit in {text:?}: use s, m or h")),
    };
    Ok(Duration::from_secs(secs))
}

/// Parses a node state name, in any case (`failed`, `Failed`, `FAILED`); an unknown name is
/// an error listing the valid ones.
pub fn parse_state(text: &str) -> Result<NodeState, String> {
    let wanted = text.trim();
    NodeState::ALL
        .into_iter()
        .find(|s| s.as_str().eq_ignore_ascii_case(wanted))
        .ok_or_else(|| {
            let valid: Vec<&str> = NodeState::ALL.iter().map(|s| s.as_str()).collect();
            format!(
                "unknown node state {text:?}; valid states: {}",
                valid.join(", ")
            )
        })
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Output {
    /// Human-readable table (the default).
    #[default]
    Table,
    /// status: one row per node and one column per policy; nodes: same as table.
    Wide,
    /// JSON with stable field names.
    Json,
    /// YAML with stable field names.
    Yaml,
}

/// Options of `status`.
#[derive(Debug, Clone, Default, Args)]
pub struct StatusArgs {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: Output,

    /// After printing, keep watching and redraw on every change (Ctrl-C to stop).
    #[arg(short = 'w', long)]
    pub watch: bool,
}

/// Options of `nodes`.
#[derive(Debug, Clone, Args)]
pub struct NodesArgs {
    /// Only this policy's nodes (default: every policy).
    #[arg(value_name = "POLICY")]
    pub policy: Option<String>,

    /// Output format (`wide` is the same as `table`).
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: Output,

    /// After printing, keep watching and redraw on every change (Ctrl-C to stop).
    #[arg(short = 'w', long)]
    pub watch: bool,

    /// Only nodes in these states (case-insensitive; repeat the flag or separate with commas),
    /// e.g. `--state Failed` or `--state draining,upgrading`.
    #[arg(long = "state", value_name = "STATE", value_delimiter = ',', value_parser = parse_state)]
    pub states: Vec<NodeState>,
}

/// Options of `logs`.
#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// The node whose agent's log to print.
    #[arg(value_name = "NODE")]
    pub node: String,

    /// The policy whose agent to read (needed only when agents of several policies run on the
    /// node).
    #[arg(long, value_name = "POLICY")]
    pub policy: Option<String>,

    /// Keep streaming new lines (Ctrl-C to stop).
    #[arg(short = 'f', long)]
    pub follow: bool,

    /// Only the last N lines.
    #[arg(long, value_name = "N")]
    pub tail: Option<i64>,

    /// The log of the previous, terminated run of the agent container (after a crash).
    #[arg(short = 'p', long)]
    pub previous: bool,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// One row per policy, one column per node: state and loaded version (the default).
    #[command(after_help = AFTER_HELP)]
    Status(StatusArgs),

    /// One row per node: policy, state, current → target version, install mode, who cordoned
    /// it, how long it has been in its state, and why (blocking pods, holders, build errors).
    ///
    /// Nodes that a large fleet's status omits (Done, or waiting for a slot) are listed from node labels.
    Nodes(NodesArgs),

    /// Everything about one policy: spec summary, DaemonSet, conditions, per-node detail and
    /// recent Events.
    Describe {
        /// The policy.
        #[arg(value_name = "POLICY")]
        policy: String,
        /// Output format (`wide` is the same as `table`); json and yaml are documents with
        /// stable field names.
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Output,
    },

    /// The log of the agent on a node: finds the policy's agent pod there (label
    /// driver.tenstorrent.com/policy) and prints its log, like `kubectl logs`.
    Logs(LogsArgs),

    /// `status --watch`: redraw on every change, from a watch on the API server (no polling).
    Watch {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Output,
    },

    /// Pause a policy (sets spec.paused=true): no node starts a new upgrade step; steps in
    /// flight finish; the DaemonSet keeps running.
    Pause {
        /// The policy.
        #[arg(value_name = "POLICY")]
        policy: String,
    },

    /// Resume a paused policy (sets spec.paused=false).
    Resume {
        /// The policy.
        #[arg(value_name = "POLICY")]
        policy: String,
    },

    /// Ask the controller to retry a Failed node now, without waiting for its back-off.
    ///
    /// How it works: the plugin sets the annotation driver.tenstorrent.com/retry on the Node to
    /// the current time (RFC 3339). The controller sees it, retries the node's upgrade at once
    /// (its attempt counter is kept) and removes the annotation. Only Failed nodes, and the
    /// canary node that halted a rollout, can be retried (a halted canary then runs again,
    /// with a fresh soak); needs permission to patch nodes.
    Retry {
        /// The policy whose rollout failed on the node.
        #[arg(value_name = "POLICY")]
        policy: String,
        /// The Failed node.
        #[arg(value_name = "NODE")]
        node: String,
    },

    /// Take a node out of every policy (or, with --undo, give it back).
    ///
    /// How it works: the plugin sets the label driver.tenstorrent.com/skip=true on the Node.
    /// Policies never select a node with it: the controller releases the node (lifts its
    /// cordon, reopens its deploy gates) and a halted canary stops waiting for it. The driver
    /// the node runs stays loaded. --undo removes the label; needs permission to patch nodes.
    Skip {
        /// The node.
        #[arg(value_name = "NODE")]
        node: String,
        /// Remove the label instead.
        #[arg(long)]
        undo: bool,
    },

    /// Print a shell completion script for kubectl-tt-driver.
    ///
    /// bash: `source <(kubectl tt driver completion bash)`;
    /// zsh: `kubectl tt driver completion zsh > "${fpath[1]}/_kubectl-tt-driver"`;
    /// fish: `kubectl tt driver completion fish > ~/.config/fish/completions/kubectl-tt-driver.fish`.
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_subcommand_means_status_with_its_flags() {
        let cli = Cli::try_parse_args(["kubectl-tt-driver", "-o", "json", "--context", "x"])
            .expect("parses");
        assert!(cli.command.is_none());
        assert_eq!(cli.status.output, Output::Json);
        assert_eq!(cli.connection.context.as_deref(), Some("x"));
    }

    #[test]
    fn connection_flags_work_after_a_subcommand() {
        let cli = Cli::try_parse_args([
            "kubectl-tt-driver",
            "--context",
            "c",
            "nodes",
            "fleet",
            "--kubeconfig",
            "/tmp/k",
            "-n",
            "ops",
        ])
        .expect("parses");
        assert_eq!(
            cli.connection.kubeconfig.as_deref(),
            Some(std::path::Path::new("/tmp/k"))
        );
        assert_eq!(cli.connection.namespace.as_deref(), Some("ops"));
        assert_eq!(cli.connection.context.as_deref(), Some("c"));
    }

    #[test]
    fn status_flags_before_another_subcommand_are_rejected() {
        let err = Cli::try_parse_args(["kubectl-tt-driver", "-o", "json", "nodes"])
            .expect_err("ambiguous");
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
        assert!(Cli::try_parse_args(["kubectl-tt-driver", "nodes", "-o", "json"]).is_ok());
    }

    #[test]
    fn node_states_parse_in_any_case_repeated_or_comma_separated() {
        let cli = Cli::try_parse_args([
            "kubectl-tt-driver",
            "nodes",
            "fleet",
            "--state",
            "failed,DRAINING",
            "--state",
            "HostManaged",
        ])
        .expect("parses");
        let Some(Command::Nodes(args)) = cli.command else {
            panic!("nodes expected");
        };
        assert_eq!(
            args.states,
            [
                NodeState::Failed,
                NodeState::Draining,
                NodeState::HostManaged
            ]
        );
        let err = Cli::try_parse_args(["kubectl-tt-driver", "nodes", "--state", "Broken"])
            .expect_err("unknown state");
        let text = err.to_string();
        assert!(text.contains("unknown node state \"Broken\""), "{text}");
        assert!(
            text.contains("Pending, Cordoning, Draining, Upgrading, Uncordoning, Done, Failed, HostManaged, Conflict"),
            "{text}"
        );
    }

    #[test]
    fn request_timeouts_parse_like_kubectl() {
        assert_eq!(parse_timeout("0"), Ok(Duration::ZERO));
        assert_eq!(parse_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_timeout("5 parsecs").is_err());
        assert!(parse_timeout("").is_err());
    }
}
