//! kubectl tt driver: one view of TenstorrentDriverPolicy rollouts.

fn main() {
    eprintln!("kubectl-tt-driver: not implemented yet");
    std::process::exit(2);
}
