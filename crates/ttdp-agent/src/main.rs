//! The ttdp node agent: installs, upgrades and reports tt-kmd on one node.

fn main() {
    eprintln!("ttdp-agent: not implemented yet");
    std::process::exit(2);
}
