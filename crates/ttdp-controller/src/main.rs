//! The ttdp operator: reconciles TenstorrentDriverPolicy objects into per-node tt-kmd rollouts.

fn main() {
    eprintln!("ttdp-controller: not implemented yet");
    std::process::exit(2);
}
