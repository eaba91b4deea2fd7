//! `kubectl-tt-driver`: run as `kubectl tt driver ...` (kubectl's plugin mechanism finds it on
//! the PATH). Parses the command line and hands over to the library; `__complete WORDS...`
//! (what `kubectl_complete-tt-driver` runs for kubectl's completion) goes to the completer.

use std::process::ExitCode;

use kubectl_tt_driver::completion::{complete, completion_words};
use kubectl_tt_driver::{Cli, run};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(words) = completion_words(&args) {
        complete(
            &words,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr(),
        )
        .await;
        return ExitCode::SUCCESS;
    }
    let cli = Cli::try_parse_args(args).unwrap_or_else(|e| e.exit());
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr();
    match run(cli, &mut out, &mut err).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
