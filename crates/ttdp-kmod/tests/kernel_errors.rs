//! How the kernel's answers become typed errors, with a kernel that answers what a test scripts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::io;
use std::path::Path;
use std::time::Duration;

use fixture::{Fixture, v};
use ttdp_kmod::{Kernel, ModuleInstaller, SimKernel, SwapOptions, UnloadOptions};

/// Answers scripted errnos, and otherwise behaves like the simulated kernel underneath.
#[derive(Debug)]
struct ScriptedKernel {
    sim: SimKernel,
    load_errno: Option<i32>,
    unload_errno: Option<i32>,
    refuse_kill_of: Option<i32>,
}

impl Kernel for ScriptedKernel {
    fn load(&self, ko: &Path, params: &str) -> io::Result<()> {
        match self.load_errno {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => self.sim.load(ko, params),
        }
    }
    fn unload(&self, name: &str) -> io::Result<()> {
        match self.unload_errno {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => self.sim.unload(name),
        }
    }
    fn kill(&self, pid: i32) -> io::Result<()> {
        if self.refuse_kill_of == Some(pid) {
            return Err(io::Error::from_raw_os_error(1));
        }
        self.sim.kill(pid)
    }
}

fn installer(
    fx: &Fixture,
    load_errno: Option<i32>,
    unload_errno: Option<i32>,
) -> ModuleInstaller<ScriptedKernel> {
    let kernel = ScriptedKernel {
        sim: fx.kernel(),
        load_errno,
        unload_errno,
        refuse_kill_of: None,
    };
    ModuleInstaller::new(
        fx.sim.host().clone(),
        kernel,
        fx.installer().config().clone(),
    )
    .unwrap()
}

#[test]
fn load_errnos_map_to_typed_errors_naming_module_and_version() {
    let fx = Fixture::new(&["1.0.0"]);
    let ko = fx.installer().ensure_ko(&v("1.0.0")).unwrap().ko;
    let cases = [
        (1, "PermissionDenied", "CAP_SYS_MODULE"),
        (22, "BadModule", "rebuild it against the running kernel"),
        (129, "SignatureRejected", "sign the module"),
        (5, "SyscallFailed", "dmesg"),
    ];
    for (errno, reason, hint) in cases {
        let err = installer(&fx, Some(errno), None).load(&ko, "").unwrap_err();
        assert_eq!(err.reason(), reason, "errno {errno}: {err}");
        let msg = err.to_string();
        assert!(
            msg.contains("tenstorrent") && msg.contains("1.0.0") && msg.contains(hint),
            "errno {errno}: {msg}"
        );
    }
}

#[test]
fn unload_errnos_map_to_typed_errors() {
    let fx = Fixture::new(&["1.0.0"]);
    fx.installer()
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    let no_wait = UnloadOptions {
        force: false,
        wait: Duration::ZERO,
    };
    let cases = [
        (1, "PermissionDenied"),
        (16, "SyscallFailed"),
        (2, "ModuleNotLoaded"),
        (11, "ModuleInUse"),
    ];
    for (errno, reason) in cases {
        let err = installer(&fx, None, Some(errno))
            .unload(&no_wait)
            .unwrap_err();
        assert_eq!(err.reason(), reason, "errno {errno}: {err}");
    }
}

#[test]
fn a_holder_that_cannot_be_killed_is_reported_after_the_others_are_killed() {
    let fx = Fixture::new(&["1.0.0"]);
    fx.installer()
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.kernel().hold(300, "protected").unwrap();
    fx.kernel().hold(301, "train").unwrap();
    let kernel = ScriptedKernel {
        sim: fx.kernel(),
        load_errno: None,
        unload_errno: None,
        refuse_kill_of: Some(300),
    };
    let installer = ModuleInstaller::new(
        fx.sim.host().clone(),
        kernel,
        fx.installer().config().clone(),
    )
    .unwrap();
    let err = installer
        .unload(&UnloadOptions {
            force: true,
            wait: Duration::from_millis(100),
        })
        .unwrap_err();
    assert_eq!(err.reason(), "PermissionDenied", "{err}");
    assert!(err.to_string().contains("host PID namespace"), "{err}");
    assert!(fx.kernel().process_alive(300));
    assert!(
        !fx.kernel().process_alive(301),
        "the killable holder was still killed"
    );
    assert!(installer.status().unwrap().loaded);
}
