//! Shell completion, two ways:
//!
//! - static scripts (`completion bash|zsh|fish`), generated from the clap definition so they
//!   never drift from the real flags;
//! - dynamic completion through kubectl (1.26 and later): for `kubectl tt driver <TAB>` kubectl
//!   runs the executable `kubectl_complete-tt-driver` from PATH (`kubectl_complete-tt_driver`
//!   for krew's `kubectl tt-driver`) with the words typed after the plugin's name, the last
//!   one being the word to complete, and reads one candidate a line, then `:<directive>`, as
//!   Cobra's `__complete` prints them. That executable runs `kubectl-tt-driver __complete
//!   WORDS...`, answered here with policy names where a policy goes and node names where a
//!   node goes, read from the cluster the words' connection flags select. The plugin answers
//!   the same way when it runs under a `kubectl_complete-` name (a link to it: what krew
//!   users make, krew putting only the plugin on PATH).
//!
//! Deciding what a word is ([`expected`]) is pure; only [`complete`] reads the cluster.

use std::io::Write;
use std::time::Duration;

use clap::CommandFactory;
use clap_complete::Shell;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use ttdp_api::NodeState;

use crate::cli::{Cli, ConnectionArgs, parse_timeout};
use crate::connection::connect;
use crate::fleet::{natural_cmp, policy_name};

/// The executable name completions are registered for.
pub const BIN_NAME: &str = "kubectl-tt-driver";

/// The hidden first argument that asks for dynamic completion, as Cobra names it.
pub const COMPLETE_ARG: &str = "__complete";

/// How the executables kubectl runs for a plugin's completion are named.
pub const COMPLETION_PREFIX: &str = "kubectl_complete-";

/// Cobra's directive: do not fall back to file names.
const NO_FILE_COMP: u8 = 4;
/// Cobra's directive: something failed, offer nothing.
const DIRECTIVE_ERROR: u8 = 1;
/// Cobra's default directive: the shell completes file names.
const DEFAULT_DIRECTIVE: u8 = 0;

/// How long completion waits for the cluster when `--request-timeout` does not say: a shell
/// waiting on TAB should not hang.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(5);

/// Writes the completion script for `shell`.
pub fn write(shell: Shell, out: &mut impl Write) {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, BIN_NAME, out);
}

/// What the word being completed stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// A subcommand name.
    Subcommand,
    /// A policy name (from the cluster).
    Policy,
    /// A node name (from the cluster).
    Node,
    /// One of these fixed values.
    Value(Vec<String>),
    /// A flag of the subcommand (or a global one).
    Flag(Option<String>),
    /// A file name (the shell's own completion).
    File,
    /// Nothing to offer.
    Nothing,
}

/// What is being completed: the kind of word, the text before the candidates (`--state=` or
/// `failed,` when completing after them) and the prefix typed so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completing {
    /// The kind of word.
    pub expected: Expected,
    /// Text each candidate is prefixed with.
    pub lead: String,
    /// What the candidates must start with (case-insensitive for states).
    pub typed: String,
    /// The connection flags among the words.
    pub connection: ConnectionArgs,
}

/// Flags that take a value in the next word, with what that value is.
fn flag_value(flag: &str) -> Option<Expected> {
    let values = |v: &[&str]| Expected::Value(v.iter().map(|s| (*s).to_owned()).collect());
    Some(match flag {
        "--kubeconfig" => Expected::File,
        "--context" | "--cluster" | "--user" | "-n" | "--namespace" | "--request-timeout"
        | "--tail" => Expected::Nothing,
        "-o" | "--output" => values(&["table", "wide", "json", "yaml"]),
        "--policy" => Expected::Policy,
        "--state" => Expected::Value(NodeState::ALL.iter().map(|s| s.to_string()).collect()),
        _ => return None,
    })
}

/// What the positional arguments of `subcommand` are.
fn positionals(subcommand: &str) -> &'static [Expected] {
    const POLICY: &[Expected] = &[Expected::Policy];
    const POLICY_NODE: &[Expected] = &[Expected::Policy, Expected::Node];
    const NODE: &[Expected] = &[Expected::Node];
    match subcommand {
        "nodes" | "describe" | "pause" | "resume" => POLICY,
        "retry" => POLICY_NODE,
        "skip" | "logs" => NODE,
        _ => &[],
    }
}

/// Records a connection flag's value in `args`.
fn note_connection(args: &mut ConnectionArgs, flag: &str, value: &str) {
    match flag {
        "--kubeconfig" => args.kubeconfig = Some(value.into()),
        "--context" => args.context = Some(value.to_owned()),
        "--cluster" => args.cluster = Some(value.to_owned()),
        "--user" => args.user = Some(value.to_owned()),
        "-n" | "--namespace" => args.namespace = Some(value.to_owned()),
        "--request-timeout" => args.request_timeout = parse_timeout(value).ok(),
        _ => {}
    }
}

/// Decides what the last of `words` (the words after the plugin's name; the last is the one
/// being completed, possibly empty) stands for.
pub fn expected(words: &[String]) -> Completing {
    let (done, current) = match words.split_last() {
        Some((last, done)) => (done, last.as_str()),
        None => (&[][..], ""),
    };
    let mut connection = ConnectionArgs::default();
    let mut positional: Vec<&str> = Vec::new();
    let mut pending_flag: Option<&str> = None;
    for word in done {
        if let Some(flag) = pending_flag.take() {
            note_connection(&mut connection, flag, word);
        } else if let Some((flag, value)) = word.split_once('=').filter(|_| word.starts_with('-')) {
            note_connection(&mut connection, flag, value);
        } else if word.starts_with('-') && word.len() > 1 {
            pending_flag = flag_value(word).map(|_| word.as_str());
        } else {
            positional.push(word);
        }
    }
    let completing = |expected, lead: &str, typed: &str| Completing {
        expected,
        lead: lead.to_owned(),
        typed: typed.to_owned(),
        connection: connection.clone(),
    };
    if let Some(flag) = pending_flag {
        return value_of(flag, "", current, completing);
    }
    if let Some((flag, value)) = current.split_once('=').filter(|_| current.starts_with('-')) {
        return value_of(flag, &format!("{flag}="), value, completing);
    }
    if current.starts_with('-') {
        let sub = positional.first().map(|s| (*s).to_owned());
        return completing(Expected::Flag(sub), "", current);
    }
    let Some((subcommand, args)) = positional.split_first() else {
        return completing(Expected::Subcommand, "", current);
    };
    if *subcommand == "completion" && args.is_empty() {
        let shells = ["bash", "zsh", "fish"].map(str::to_owned).to_vec();
        return completing(Expected::Value(shells), "", current);
    }
    let expected = positionals(subcommand)
        .get(args.len())
        .cloned()
        .unwrap_or(Expected::Nothing);
    completing(expected, "", current)
}

/// The value of `flag` being completed: `typed` so far, after `lead`. A `--state` list
/// completes its last item.
fn value_of(
    flag: &str,
    lead: &str,
    typed: &str,
    completing: impl Fn(Expected, &str, &str) -> Completing,
) -> Completing {
    let expected = flag_value(flag).unwrap_or(Expected::Nothing);
    if flag == "--state"
        && let Some((before, last)) = typed.rsplit_once(',')
    {
        return completing(expected, &format!("{lead}{before},"), last);
    }
    completing(expected, lead, typed)
}

/// The flags of `subcommand` (the top level's when none) and the global ones, as `--long`.
fn flag_names(subcommand: Option<&str>) -> Vec<String> {
    let root = Cli::command();
    let command = subcommand
        .and_then(|s| root.find_subcommand(s))
        .unwrap_or(&root);
    let mut names: Vec<String> = command
        .get_arguments()
        .chain(root.get_arguments().filter(|a| a.is_global_set()))
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    names.extend(["--help".to_owned()]);
    names.sort();
    names.dedup();
    names
}

/// The visible subcommand names.
fn subcommand_names() -> Vec<String> {
    Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_owned())
        .collect()
}

/// `candidates` that start with `typed` (case-insensitively), each after `lead`.
pub fn matching(candidates: &[String], lead: &str, typed: &str) -> Vec<String> {
    let typed = typed.to_lowercase();
    candidates
        .iter()
        .filter(|c| c.to_lowercase().starts_with(&typed))
        .map(|c| format!("{lead}{c}"))
        .collect()
}

/// The names the cluster offers for `expected`.
async fn names_from_cluster(
    connection: &ConnectionArgs,
    expected: &Expected,
) -> Result<Vec<String>, crate::Error> {
    let mut args = connection.clone();
    args.request_timeout = args.request_timeout.or(Some(COMPLETION_TIMEOUT));
    let conn = connect(&args).await?;
    let mut names: Vec<String> = match expected {
        Expected::Policy => conn
            .policies()
            .await?
            .iter()
            .map(|p| policy_name(p).to_owned())
            .collect(),
        _ => {
            let api: Api<Node> = Api::all(conn.client.clone());
            api.list_metadata(&ListParams::default())
                .await
                .map_err(|e| crate::Error::from_kube(e, "list", "nodes", &conn.server))?
                .items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect()
        }
    };
    names.sort_by(|a, b| natural_cmp(a, b));
    Ok(names)
}

/// Answers `__complete WORDS...` on `out`: candidates, one a line, then `:<directive>`.
/// A cluster that cannot be read offers nothing (the error goes to `err`, which kubectl
/// passes to the terminal only when debugging completion).
pub async fn complete(words: &[String], out: &mut impl Write, err: &mut impl Write) {
    let c = expected(words);
    let (candidates, directive) = match &c.expected {
        Expected::Subcommand => (subcommand_names(), NO_FILE_COMP),
        Expected::Value(values) => (values.clone(), NO_FILE_COMP),
        Expected::Flag(sub) => (flag_names(sub.as_deref()), NO_FILE_COMP),
        Expected::File => (Vec::new(), DEFAULT_DIRECTIVE),
        Expected::Nothing => (Vec::new(), NO_FILE_COMP),
        Expected::Policy | Expected::Node => {
            match names_from_cluster(&c.connection, &c.expected).await {
                Ok(names) => (names, NO_FILE_COMP),
                Err(e) => {
                    let _ = writeln!(err, "completion: {e}");
                    (Vec::new(), DIRECTIVE_ERROR)
                }
            }
        }
    };
    let mut text = String::new();
    for candidate in matching(&candidates, &c.lead, &c.typed) {
        text.push_str(&candidate);
        text.push('\n');
    }
    text.push_str(&format!(":{directive}\n"));
    // A shell that went away is not worth an error.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// The words to complete when the command line asks for completion: `__complete WORDS...`,
/// or any arguments when the plugin runs under a completion name (`kubectl_complete-...`, a
/// link to the plugin, as krew users make one).
pub fn completion_words(args: &[std::ffi::OsString]) -> Option<Vec<String>> {
    let (program, rest) = args.split_first()?;
    let called_to_complete = std::path::Path::new(program)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(COMPLETION_PREFIX));
    let words = if called_to_complete {
        rest
    } else {
        let (first, rest) = rest.split_first()?;
        if first != COMPLETE_ARG {
            return None;
        }
        rest
    };
    Some(
        words
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &[&str]) -> Vec<String> {
        text.iter().map(|s| (*s).to_owned()).collect()
    }

    fn kind(text: &[&str]) -> Expected {
        expected(&words(text)).expected
    }

    #[test]
    fn policy_and_node_arguments_are_recognised() {
        assert_eq!(kind(&[""]), Expected::Subcommand);
        assert_eq!(kind(&["de"]), Expected::Subcommand);
        assert_eq!(kind(&["describe", ""]), Expected::Policy);
        assert_eq!(kind(&["nodes", "fl"]), Expected::Policy);
        assert_eq!(kind(&["retry", "fleet", ""]), Expected::Node);
        assert_eq!(kind(&["logs", ""]), Expected::Node);
        assert_eq!(kind(&["skip", "n"]), Expected::Node);
        assert_eq!(kind(&["describe", "fleet", ""]), Expected::Nothing);
        assert_eq!(kind(&["logs", "--policy", ""]), Expected::Policy);
        assert_eq!(kind(&["logs", "--policy", "fleet", ""]), Expected::Node);
    }

    #[test]
    fn connection_flags_are_skipped_and_kept_for_the_lookup() {
        let c = expected(&words(&[
            "--context",
            "prod",
            "describe",
            "--kubeconfig=/k",
            "-n",
            "ops",
            "",
        ]));
        assert_eq!(c.expected, Expected::Policy);
        assert_eq!(c.connection.context.as_deref(), Some("prod"));
        assert_eq!(
            c.connection.kubeconfig.as_deref(),
            Some(std::path::Path::new("/k"))
        );
        assert_eq!(c.connection.namespace.as_deref(), Some("ops"));
        assert_eq!(kind(&["--kubeconfig", ""]), Expected::File);
    }

    #[test]
    fn flag_values_and_flags_complete() {
        let c = expected(&words(&["nodes", "fleet", "--state", "failed,dr"]));
        assert_eq!(c.lead, "failed,");
        let Expected::Value(states) = &c.expected else {
            panic!("states expected, got {c:?}");
        };
        assert_eq!(matching(states, &c.lead, &c.typed), ["failed,Draining"]);
        let c = expected(&words(&["describe", "x", "-o=j"]));
        let Expected::Value(formats) = &c.expected else {
            panic!("formats expected, got {c:?}");
        };
        assert_eq!(matching(formats, &c.lead, &c.typed), ["-o=json"]);
        let logs_flags = flag_names(Some("logs"));
        for flag in ["--policy", "--follow", "--tail", "--previous", "--context"] {
            assert!(logs_flags.contains(&flag.to_owned()), "{logs_flags:?}");
        }
        assert_eq!(kind(&["completion", ""]), {
            Expected::Value(words(&["bash", "zsh", "fish"]))
        });
    }

    #[test]
    fn only_the_hidden_argument_asks_for_completion() {
        let args = |a: &[&str]| -> Vec<std::ffi::OsString> { a.iter().map(Into::into).collect() };
        assert_eq!(
            completion_words(&args(&["kubectl-tt-driver", "__complete", "describe", ""])),
            Some(words(&["describe", ""]))
        );
        assert_eq!(
            completion_words(&args(&["kubectl-tt-driver", "describe"])),
            None
        );
        assert_eq!(
            completion_words(&args(&["/k/bin/kubectl_complete-tt_driver", "logs", ""])),
            Some(words(&["logs", ""])),
            "a link to the plugin under the completion name"
        );
        assert!(!subcommand_names().contains(&COMPLETE_ARG.to_owned()));
    }
}
