//! The live view: the plugin's `kubectl tt driver nodes <policy>` table, redrawn under a header
//! whenever the policy changes (on a terminal), or node transitions printed line by line (when
//! stdout is not a terminal, e.g. in CI).
//!
//! The plugin writes straight to the demo's stdout, so on a terminal it keeps its colours.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::Command;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_programs::{RolloutWatch, Transition};

use crate::scenario::Demo;

/// ANSI: cursor home, clear screen.
const CLEAR: &str = "\x1b[H\x1b[2J";
/// How long one plugin run may take before the frame is drawn without it.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How many recent transitions the terminal view lists under the table.
const RECENT: usize = 8;

impl Demo {
    /// Terminal mode: clears the screen and draws the header, the plugin's nodes table and the
    /// most recent transitions.
    pub async fn redraw_frame(&self, header: &str, transitions: &[Transition]) {
        print!("{CLEAR}{header}\n\n");
        flush();
        self.plugin_table().await;
        let recent = &transitions[transitions.len().saturating_sub(RECENT)..];
        if !recent.is_empty() {
            println!("\nrecent changes:");
            for t in recent {
                println!("{}", transition_line(t, self.epoch));
            }
        }
        flush();
    }

    /// Line mode: prints the transitions after the first `printed` ones.
    pub fn print_new_transitions(&self, watch: &RolloutWatch, printed: &mut usize) {
        let all = watch.transitions();
        for t in all.get(*printed..).unwrap_or_default() {
            println!("{}", transition_line(t, self.epoch));
        }
        *printed = all.len();
        flush();
    }

    /// Prints the plugin's nodes table once, with a title.
    pub async fn print_table(&self, title: &str) {
        println!(
            "\n$ kubectl tt driver nodes {}    # {title}",
            self.names.policy
        );
        flush();
        self.plugin_table().await;
        flush();
    }

    /// The terminal view's header: the fleet, the phase `title` begun at `started`, the summary.
    pub fn header(
        &self,
        title: &str,
        started: Instant,
        policy: &TenstorrentDriverPolicy,
    ) -> String {
        let summary = policy
            .status
            .as_ref()
            .and_then(|s| s.summary.as_ref())
            .map(|s| {
                format!(
                    "{} matched: {} up to date, {} in progress, {} pending, {} failed, {} host-managed",
                    s.matched, s.up_to_date, s.in_progress, s.pending, s.failed, s.host_managed
                )
            })
            .unwrap_or_else(|| "waiting for the controller's first status".to_owned());
        format!(
            "ttdp demo · {} Tenstorrent + {} plain nodes · maxUnavailable {} · speed {}\n{title} · {:.1} s (total {:.1} s) · {summary}\n$ kubectl tt driver nodes {}",
            self.fleet.tenstorrent,
            self.fleet.plain,
            self.args.max_unavailable,
            self.args.speed,
            started.elapsed().as_secs_f64(),
            self.epoch.elapsed().as_secs_f64(),
            self.names.policy,
        )
    }

    /// Runs `kubectl-tt-driver nodes <policy>` with the demo's stdout; reports a failure in one
    /// line instead of the table.
    async fn plugin_table(&self) {
        let plugin = &self.args.plugin;
        let child = Command::new(plugin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["nodes", &self.names.policy])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn();
        let output = async { child?.wait_with_output().await };
        match tokio::time::timeout(PLUGIN_TIMEOUT, output).await {
            Ok(Ok(output)) if output.status.success() => {}
            Ok(Ok(output)) => println!(
                "(kubectl tt driver failed: {})",
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            Ok(Err(e)) => println!("(cannot run {}: {e})", plugin.display()),
            Err(_) => println!(
                "(kubectl tt driver did not answer within {} s)",
                PLUGIN_TIMEOUT.as_secs()
            ),
        }
    }
}

/// `  +12.3s  demo-tt-2   Draining → Upgrading   2.7.0   (reason: message)`, the time counted
/// from `epoch`.
fn transition_line(t: &Transition, epoch: Instant) -> String {
    let from = t.from.map_or_else(|| "·".to_owned(), |s| s.to_string());
    let mut line = format!(
        "  {:>7}  {:<14} {:>11} → {:<12} {}",
        format!(
            "+{:.1}s",
            t.at.saturating_duration_since(epoch).as_secs_f64()
        ),
        t.node,
        from,
        t.to.to_string(),
        t.version.as_deref().unwrap_or("-"),
    );
    if let Some(why) = &t.why {
        let short: String = why.chars().take(100).collect();
        line.push_str(&format!("   ({short})"));
    }
    line
}

/// Flushes stdout, ignoring a closed pipe (the demo keeps running).
pub fn flush() {
    let _ = std::io::stdout().flush();
}
