//! Real-kernel tests: run inside the QEMU VM by `cargo xtask vm-test` (ignored elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

fn ko(version: &str) -> PathBuf {
    let dir = std::env::var("TTDP_VM_KO_DIR").expect("TTDP_VM_KO_DIR is set by the VM's /init");
    PathBuf::from(dir).join(version).join("tenstorrent.ko")
}

#[test]
#[ignore = "needs a real kernel: run by cargo xtask vm-test"]
fn stub_module_loads_and_reports_its_version() {
    let status = Command::new("insmod").arg(ko("1.0.0")).status().unwrap();
    assert!(status.success());
    let version = std::fs::read_to_string("/sys/module/tenstorrent/version").unwrap();
    assert_eq!(version.trim(), "1.0.0");
    assert!(std::path::Path::new("/dev/tenstorrent/0").exists());
    let status = Command::new("rmmod").arg("tenstorrent").status().unwrap();
    assert!(status.success());
    assert!(!std::path::Path::new("/sys/module/tenstorrent").exists());
}
