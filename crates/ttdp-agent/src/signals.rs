//! Shutdown on SIGTERM or SIGINT, as a [`CancellationToken`] the node flow watches.
//!
//! The token only asks the agent to stop: a swap in flight still finishes (or rolls back) first,
//! and a second signal does not cut it short (only SIGKILL, after the pod's grace period, does).

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT. Must be called inside a tokio runtime.
pub fn shutdown_on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutdown requested");
        cancel.cancel();
        // keep receiving so later signals are ignored instead of killing the process
        loop {
            let received = tokio::select! {
                got = term.recv() => got,
                got = int.recv() => got,
            };
            if received.is_none() {
                break; // the runtime is shutting down
            }
            tracing::info!("shutdown already in progress; finishing the current step first");
        }
    });
    Ok(token)
}
