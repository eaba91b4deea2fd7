//! The live view: the plugin's `kubectl tt driver nodes <policy>` table, redrawn under a header
//! whenever the policy changes (on a terminal), or node transitions printed line by line (when
//! stdout is not a terminal, e.g. in CI).
//!
//! The plugin writes straight to the demo's stdout, so on a terminal it keeps its colours.

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::Command;

use ttdp_testkit::programs::Transition;

/// ANSI: cursor home, clear screen.
const CLEAR: &str = "\x1b[H\x1b[2J";
/// How long one plugin run may take before the frame is drawn without it.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How many recent transitions the terminal view lists under the table.
const RECENT: usize = 8;

/// How the demo draws: the plugin binary, the cluster's kubeconfig, the policy shown, and when
/// the demo started (transitions show the time since).
#[derive(Debug, Clone)]
pub struct LiveView {
    pub plugin: PathBuf,
    pub kubeconfig: PathBuf,
    pub policy: String,
    pub epoch: Instant,
}

impl LiveView {
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

    /// Prints the plugin's nodes table once, with a title (both modes).
    pub async fn print_table(&self, title: &str) {
        println!("\n$ kubectl tt driver nodes {}    # {title}", self.policy);
        flush();
        self.plugin_table().await;
        flush();
    }

    /// Runs `kubectl-tt-driver nodes <policy>` with the demo's stdout; reports a failure in one
    /// line instead of the table.
    async fn plugin_table(&self) {
        let child = Command::new(&self.plugin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["nodes", &self.policy])
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
            Ok(Err(e)) => println!("(cannot run {}: {e})", self.plugin.display()),
            Err(_) => println!(
                "(kubectl tt driver did not answer within {} s)",
                PLUGIN_TIMEOUT.as_secs()
            ),
        }
    }
}

/// `  +12.3s  demo-tt-2   Draining → Upgrading   2.7.0   (reason: message)`, the time counted
/// from `epoch`.
pub fn transition_line(t: &Transition, epoch: Instant) -> String {
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
