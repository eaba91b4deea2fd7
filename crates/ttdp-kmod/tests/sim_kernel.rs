//! The simulated kernel answers like the real one, and keeps its state in files under the host root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::path::Path;

use fixture::{Fixture, RELEASE, v};
use ttdp_hostprobe::{HostFacts, HostRoot};
use ttdp_kmod::{Kernel, ModInfo, ModuleStatus, SimHost, SimKernel, build_module};

const EEXIST: i32 = 17;
const ENOENT: i32 = 2;
const EAGAIN: i32 = 11;
const ENOEXEC: i32 = 8;
const ENODEV: i32 = 19;
const ESRCH: i32 = 3;

fn status(host: &HostRoot) -> ModuleStatus {
    ModuleStatus::read(host, "tenstorrent", Path::new("/dev/tenstorrent")).unwrap()
}

/// Builds `version` with the real build path and returns the `.ko` copied out of the build dir.
fn built_ko(fx: &Fixture, version: &str) -> std::path::PathBuf {
    let built = build_module(fx.sim.host(), RELEASE, &v(version), &fx.build_options()).unwrap();
    let out = fx.dir.path().join(format!("tenstorrent-{version}.ko"));
    std::fs::copy(&built.ko_path, &out).unwrap();
    out
}

#[test]
fn load_publishes_the_module_in_sysfs_and_creates_the_device() {
    let fx = Fixture::new(&["1.0.0"]);
    let ko = built_ko(&fx, "1.0.0");
    fx.kernel()
        .load(&ko, "reset_limit=5 auto_reset_timeout=3")
        .unwrap();
    let host = fx.sim.host();
    let s = status(host);
    assert!(s.loaded);
    assert_eq!(s.version.as_deref(), Some("1.0.0"));
    assert_eq!(s.refcnt, Some(0));
    assert_eq!(s.initstate.as_deref(), Some("live"));
    assert_eq!(
        s.srcversion.as_deref(),
        ModInfo::from_file(&ko).unwrap().srcversion()
    );
    assert_eq!(
        std::fs::read_to_string(host.path("/sys/module/tenstorrent/parameters/reset_limit"))
            .unwrap(),
        "5\n"
    );
    assert!(host.path("/dev/tenstorrent/0").exists());
}

#[test]
fn double_load_is_eexist_and_unload_of_nothing_is_enoent() {
    let fx = Fixture::new(&["1.0.0"]);
    let ko = built_ko(&fx, "1.0.0");
    let kernel = fx.kernel();
    assert_eq!(
        kernel.unload("tenstorrent").unwrap_err().raw_os_error(),
        Some(ENOENT)
    );
    kernel.load(&ko, "").unwrap();
    assert_eq!(
        kernel.load(&ko, "").unwrap_err().raw_os_error(),
        Some(EEXIST)
    );
    kernel.unload("tenstorrent").unwrap();
    assert!(!status(fx.sim.host()).loaded);
    assert!(!fx.sim.host().path("/dev/tenstorrent").exists());
    assert_eq!(
        kernel.unload("tenstorrent").unwrap_err().raw_os_error(),
        Some(ENOENT)
    );
}

#[test]
fn holders_raise_refcnt_and_block_unload_until_released_or_killed() {
    let fx = Fixture::new(&["1.0.0"]);
    let ko = built_ko(&fx, "1.0.0");
    let kernel = fx.kernel();
    assert_eq!(
        kernel.hold(100, "train").unwrap_err().raw_os_error(),
        Some(ENODEV),
        "no module, no device"
    );
    kernel.load(&ko, "").unwrap();
    kernel.hold(100, "train").unwrap();
    kernel.hold(100, "train").unwrap();
    kernel.hold(200, "tt-smi").unwrap();
    let s = status(fx.sim.host());
    assert_eq!(s.refcnt, Some(3));
    let pids: Vec<(i32, &str, usize)> = s
        .device_holders
        .iter()
        .map(|h| (h.pid, h.comm.as_str(), h.paths.len()))
        .collect();
    assert_eq!(pids, vec![(100, "train", 2), (200, "tt-smi", 1)]);

    assert_eq!(
        kernel.unload("tenstorrent").unwrap_err().raw_os_error(),
        Some(EAGAIN)
    );
    kernel.release(200).unwrap();
    assert_eq!(status(fx.sim.host()).refcnt, Some(2));
    kernel.hold(300, "exits").unwrap();
    kernel.exit_process(300).unwrap();
    kernel.exit_process(300).unwrap();
    assert!(!kernel.process_alive(300));
    kernel.kill(100).unwrap();
    assert_eq!(kernel.kill(100).unwrap_err().raw_os_error(), Some(ESRCH));
    assert_eq!(kernel.release(100).unwrap_err().raw_os_error(), Some(ESRCH));
    assert!(!fx.sim.host().path("/proc/100").exists());
    let s = status(fx.sim.host());
    assert_eq!((s.refcnt, s.device_holders.len()), (Some(0), 0));
    kernel.unload("tenstorrent").unwrap();
}

#[test]
fn modules_for_another_kernel_or_not_modules_at_all_are_enoexec() {
    let fx = Fixture::new(&["1.0.0"]);
    let other = SimHost::create(fx.dir.path().join("other-host"), "6.9.0-other").unwrap();
    let built = build_module(
        other.host(),
        "6.9.0-other",
        &v("1.0.0"),
        &fx.build_options(),
    )
    .unwrap();
    let kernel = fx.kernel();
    assert_eq!(
        kernel.load(&built.ko_path, "").unwrap_err().raw_os_error(),
        Some(ENOEXEC)
    );
    let junk = fx.dir.path().join("junk.ko");
    std::fs::write(&junk, "not an elf").unwrap();
    assert_eq!(
        kernel.load(&junk, "").unwrap_err().raw_os_error(),
        Some(ENOEXEC)
    );
    let missing = kernel
        .load(&fx.dir.path().join("missing.ko"), "")
        .unwrap_err();
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    assert!(!status(fx.sim.host()).loaded);
}

#[test]
fn injected_load_failures_apply_to_one_version_until_cleared() {
    let fx = Fixture::new(&["1.0.0"]);
    let ko = built_ko(&fx, "1.0.0");
    let kernel = fx.kernel();
    kernel.fail_load("1.0.0", true).unwrap();
    assert_eq!(
        kernel.load(&ko, "").unwrap_err().raw_os_error(),
        Some(ENOEXEC)
    );
    kernel.fail_load("1.0.0", false).unwrap();
    kernel.fail_load("1.0.0", false).unwrap();
    kernel.load(&ko, "").unwrap();
}

#[test]
fn state_is_shared_by_every_kernel_on_the_same_root_and_stays_consistent_under_concurrency() {
    let fx = Fixture::new(&["1.0.0"]);
    let ko = built_ko(&fx, "1.0.0");
    fx.kernel().load(&ko, "").unwrap();
    let root = fx.sim.host().clone();
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let root = root.clone();
            std::thread::spawn(move || {
                // a separate kernel handle per thread, as separate processes would have
                let kernel = SimKernel::new(root);
                for _ in 0..5 {
                    kernel.hold(1000 + i, "worker").unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let reopened = SimHost::open(root.dir()).unwrap();
    assert_eq!(reopened.release(), RELEASE);
    assert_eq!(status(reopened.host()).refcnt, Some(30));
}

#[test]
fn a_simulated_host_probes_like_a_real_one() {
    let fx = Fixture::new(&[]);
    let facts = HostFacts::probe(fx.sim.host()).unwrap();
    assert_eq!(facts.kernel_release, RELEASE);
    assert_eq!(
        facts.build_tree.host_path,
        Path::new("/lib/modules/6.8.0-sim/build")
    );
    assert_eq!(
        facts.build_tree.usable_dir(),
        Some(
            fx.sim
                .host()
                .path("/usr/src/linux-headers-6.8.0-sim")
                .as_path()
        )
    );
    assert_eq!(facts.devices.len(), 1);
    assert!(facts.signing.unsigned_modules_load());
    assert!(!facts.host_install.is_host_managed());

    fx.sim.add_pci_device("0000:02:00.0", 0xb140).unwrap();
    fx.sim.add_dkms_state(&["1.29.0"]).unwrap();
    fx.sim.add_dkms_source("1.29.0").unwrap();
    fx.sim.remove_headers().unwrap();
    let facts = HostFacts::probe(fx.sim.host()).unwrap();
    assert_eq!(facts.devices.len(), 2);
    assert!(facts.host_install.is_host_managed());
    assert_eq!(facts.host_install.versions(), vec!["1.29.0".to_string()]);
    assert_eq!(facts.build_tree.usable_dir(), None);
}

#[test]
fn one_device_node_per_simulated_pci_device() {
    let fx = Fixture::new(&["1.0.0"]);
    fx.sim.add_pci_device("0000:02:00.0", 0xb140).unwrap();
    let ko = built_ko(&fx, "1.0.0");
    fx.kernel().load(&ko, "").unwrap();
    assert!(fx.sim.host().path("/dev/tenstorrent/0").exists());
    assert!(fx.sim.host().path("/dev/tenstorrent/1").exists());
    assert!(!fx.sim.host().path("/dev/tenstorrent/2").exists());
}
