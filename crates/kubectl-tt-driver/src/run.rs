//! Runs a parsed command line: connects, fetches, renders, writes. The one place that decides
//! what goes to stdout (the view) and what to stderr (warnings, "no resources" notes).

use std::io::{IsTerminal, Write};

use jiff::Timestamp;

use crate::cli::{Cli, Command, Output};
use crate::connection::{Connection, connect};
use crate::error::Error;
use crate::fetch::Extras;
use crate::palette::Palette;
use crate::render::{DEFAULT_WIDTH, RenderOptions, describe};
use crate::report::describe_report;
use crate::view::{self, Request, View};
use crate::watch::{self, Screen};
use crate::{completion, logs, mutate};

/// What `status` and `nodes` say when there are no policies (like kubectl's "No resources found").
pub const NO_POLICIES: &str = "No TenstorrentDriverPolicy resources found. Create one with spec.version and spec.nodeAffinity: {} (see: kubectl explain ttdp.spec).";

/// The terminal width: `COLUMNS` if set, else the terminal's, else 80.
pub fn terminal_width() -> usize {
    if let Some(cols) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|c| *c > 0)
    {
        return cols;
    }
    match terminal_size::terminal_size_of(std::io::stdout()) {
        Some((terminal_size::Width(w), _)) if w > 0 => usize::from(w),
        _ => DEFAULT_WIDTH,
    }
}

fn options(palette: Palette) -> RenderOptions {
    RenderOptions {
        palette,
        width: terminal_width(),
        now: Timestamp::now(),
    }
}

/// Runs the command, writing the result to `out` and notes to `err`.
pub async fn run(cli: Cli, out: &mut impl Write, err: &mut impl Write) -> Result<(), Error> {
    let palette = Palette::detect(cli.no_color);
    let command = cli.command.unwrap_or(Command::Status(cli.status));
    if let Command::Completion { shell } = command {
        completion::write(shell, out);
        return Ok(());
    }
    let conn = connect(&cli.connection).await?;
    match command {
        Command::Status(args) => {
            let request = Request {
                view: View::Status,
                only: None,
                output: args.output,
                states: &[],
            };
            show(&conn, request, args.watch, palette, out, err).await
        }
        Command::Watch { output } => {
            let request = Request {
                view: View::Status,
                only: None,
                output,
                states: &[],
            };
            show(&conn, request, true, palette, out, err).await
        }
        Command::Nodes(args) => {
            let request = Request {
                view: View::Nodes,
                only: args.policy.as_deref(),
                output: args.output,
                states: &args.states,
            };
            show(&conn, request, args.watch, palette, out, err).await
        }
        Command::Describe { policy, output } => {
            describe(&conn, policy, output, palette, out, err).await
        }
        Command::Logs(args) => logs::run(&conn, &args, out).await,
        Command::Pause { policy } => {
            let line = mutate::set_paused(&conn, &policy, true).await?;
            write(out, &format!("{line}\n"))
        }
        Command::Resume { policy } => {
            let line = mutate::set_paused(&conn, &policy, false).await?;
            write(out, &format!("{line}\n"))
        }
        Command::Retry { policy, node } => {
            let line = mutate::retry(&conn, &policy, &node, Timestamp::now()).await?;
            write(out, &format!("{line}\n"))
        }
        Command::Skip { node, undo } => {
            let line = mutate::skip(&conn, &node, !undo).await?;
            write(out, &format!("{line}\n"))
        }
        Command::Completion { .. } => Ok(()),
    }
}

/// `describe POLICY`: the policy with its nodes, DaemonSet, Events and agent pods, as a page or
/// (`-o json|yaml`) a document of the same facts. Events and pods that cannot be read are
/// warnings, not failures: the rest of the page still helps.
async fn describe(
    conn: &Connection,
    policy: String,
    output: Output,
    palette: Palette,
    out: &mut impl Write,
    err: &mut impl Write,
) -> Result<(), Error> {
    let fetched = conn
        .fleet(
            Some(&policy),
            Extras {
                nodes: true,
                daemonsets: true,
            },
        )
        .await?;
    let mut warnings = fetched.warnings;
    let events = match conn.events(&policy).await {
        Ok(events) => events,
        Err(e) => {
            warnings.push(format!("cannot read events: {e}"));
            Vec::new()
        }
    };
    let Some(view) = fetched.fleet.policies.first() else {
        return Err(Error::PolicyNotFound { name: policy });
    };
    let namespace = view.daemonset.as_ref().map(|d| d.namespace.as_str());
    let pods = match conn.agent_pods(&policy, namespace).await {
        Ok(pods) => pods,
        Err(e) => {
            warnings.push(format!("cannot read agent pods: {e}"));
            Vec::new()
        }
    };
    warn(err, &warnings);
    let rows = fetched.fleet.node_rows();
    let text = match output {
        Output::Table | Output::Wide => {
            describe::render(view, &rows, &pods, &events, &options(palette))
        }
        Output::Json => view::json(&describe_report(view, &rows, &pods, &events))?,
        Output::Yaml => view::yaml(&describe_report(view, &rows, &pods, &events))?,
    };
    write(out, &text)
}

/// Writes the answer. A reader that went away (`| head`) is not an error, as with kubectl.
fn write(out: &mut impl Write, text: &str) -> Result<(), Error> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::Write(e)),
        _ => Ok(()),
    }
}

fn warn(err: &mut impl Write, warnings: &[String]) {
    for w in warnings {
        // stderr is best effort: a closed stderr must not turn a good answer into a failure.
        let _ = writeln!(err, "warning: {w}");
    }
}

/// Shows a view once, or keeps redrawing it with `watch`.
async fn show(
    conn: &Connection,
    request: Request<'_>,
    watch: bool,
    palette: Palette,
    out: &mut impl Write,
    err: &mut impl Write,
) -> Result<(), Error> {
    if watch {
        let screen = Screen {
            clear: std::io::stdout().is_terminal(),
        };
        return watch::run(conn, request, screen, || options(palette), out, err).await;
    }
    let extras = Extras {
        nodes: request.view == View::Nodes,
        daemonsets: request.view == View::Status,
    };
    let fetched = conn.fleet(request.only, extras).await?;
    warn(err, &fetched.warnings);
    if fetched.fleet.policies.is_empty() && matches!(request.output, Output::Table | Output::Wide) {
        let _ = writeln!(err, "{NO_POLICIES}");
        return Ok(());
    }
    let text = view::render_request(&fetched.fleet, &request, &options(palette))?;
    write(out, &text)
}
