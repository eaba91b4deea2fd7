//! `kubectl-tt-driver`: run as `kubectl tt driver ...` (kubectl's plugin mechanism finds it on
//! the PATH). Parses the command line and hands over to the library.

use std::process::ExitCode;

use kubectl_tt_driver::{Cli, run};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
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
