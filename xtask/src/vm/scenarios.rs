//! The scenarios `cargo xtask vm-test` boots (what goes into each VM and what runs there) and the
//! stub `tenstorrent` module versions every scenario gets. Plain data: the other `vm` modules read
//! it, it reads none of them.

use std::time::Duration;

/// One VM boot: what goes into its initramfs and what runs there.
#[derive(Debug)]
pub struct Scenario {
    /// Name used on the command line and in the output.
    pub name: &'static str,
    /// What the scenario proves, for `--list`.
    pub description: &'static str,
    /// Integration-test targets (package, test target name), built static, at `/tests/<package>/<test>`.
    pub tests: &'static [(&'static str, &'static str)],
    /// Binary targets (package, bin name), built static, at `/opt/ttdp/bin/<bin>` (on `PATH`).
    pub bins: &'static [(&'static str, &'static str)],
    /// Example targets (package, example name), built static, at `/opt/ttdp/bin/<example>`.
    pub examples: &'static [(&'static str, &'static str)],
    /// Extra files: (path relative to the repository root, absolute path in the guest); they keep
    /// their permissions.
    pub files: &'static [(&'static str, &'static str)],
    /// Share the host's `/usr` read-only over 9p as the guest's `/usr` (with `/lib`, `/lib64`
    /// leading into it): gcc, make, git and the kernel headers, so the guest can build modules.
    /// Costs about 1 s at boot; a stub module build then takes ~35 s in the guest (2 s on the host).
    pub host_usr: bool,
    /// Share the agent image's unpacked root filesystem read-only over 9p (mount tag
    /// [`AGENT_IMAGE_TAG`](super::boot::AGENT_IMAGE_TAG)) and put the stub module its
    /// toolchain built at `/image-ko/tenstorrent.ko` (see [`agent_image`](super::agent_image)).
    pub agent_image: bool,
    /// Put a tree of prebuilt modules, made by `cargo xtask prebuild` from the stub module's
    /// repository against the host's headers, at `TTDP_VM_PREBUILT_DIR` in the guest, for a web
    /// server there (its version in `TTDP_VM_PREBUILT_VERSION`).
    pub prebuilt_tree: bool,
    /// The workload: a script relative to `tests/vm/scenarios/`, run as `/scenario.sh`.
    pub script: &'static str,
    /// Wall-clock limit for the whole boot-run-poweroff cycle under TCG.
    pub timeout: Duration,
}

/// Every scenario, run in this order by default.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "kmod",
        description: "ttdp-kmod against a real kernel: status, load, unload, busy unload and holders, \
                      force unload, swap, rollback, .ko cache",
        tests: &[("ttdp-kmod", "real_kernel")],
        bins: &[],
        examples: &[],
        files: &[],
        host_usr: false,
        agent_image: false,
        prebuilt_tree: false,
        script: "kmod.sh",
        timeout: Duration::from_secs(240),
    },
    Scenario {
        name: "kmod-build",
        description: "ttdp-kmod building inside the VM: a cache miss fetches tag ttkmd-<version> from \
                      the stub git repository and builds it with the host's /usr over 9p, loads it, \
                      then hits the cache; a missing tag fails before anything is unloaded; a \
                      module loaded from outside the cache is built from its tag before the \
                      unload and loaded back when the new version fails",
        tests: &[("ttdp-kmod", "real_kernel")],
        bins: &[],
        examples: &[],
        files: &[],
        host_usr: true,
        agent_image: false,
        prebuilt_tree: false,
        script: "kmod-build.sh",
        // one in-VM build: ~35 s on an idle machine, 180 s seen with the 2 cores shared 6 ways
        timeout: Duration::from_secs(600),
    },
    Scenario {
        name: "agent",
        description: "the real ttdp-agent binary (report in a file, no cluster): fresh install built \
                      in the VM from the stub repository, upgrade from the cache, busy module \
                      waiting for its holder then swapping, module removed behind its back, force \
                      unload, cache hit on a second run, SIGTERM leaves the module loaded, two \
                      agents on one node take turns (one module lock), SIGKILL before the unload, \
                      between unload and load and after the load converges on restart, no \
                      rollback path refuses to unload until the node opts in",
        tests: &[],
        bins: &[("ttdp-agent", "ttdp-agent")],
        examples: &[],
        files: &[],
        host_usr: true,
        agent_image: false,
        prebuilt_tree: false,
        script: "agent.sh",
        // one in-VM build (as kmod-build) plus ~30 s of agent runs
        timeout: Duration::from_secs(600),
    },
    Scenario {
        name: "validation",
        description: "post-load validation by the real ttdp-agent binary (report in a file): a \
                      node without cards validates trivially; a validation command that fails, \
                      or holds the device past its timeout (killed with its process group), \
                      gets the new version unloaded and the previous one loaded back on the real \
                      kernel; a passing command lets the upgrade through and the readiness probe \
                      requires its record",
        tests: &[],
        bins: &[("ttdp-agent", "ttdp-agent")],
        examples: &[],
        files: &[],
        host_usr: false,
        agent_image: false,
        prebuilt_tree: false,
        script: "validation.sh",
        // no build in the guest (the cache is seeded from the host-built stubs); ~20 s of agent runs
        timeout: Duration::from_secs(240),
    },
    Scenario {
        name: "parameters",
        description: "module parameters by the real ttdp-agent binary (report in a file): \
                      TT_KMD_PARAMETERS reaches finit_module and the stub module's parameters \
                      read back from /sys/module/tenstorrent/parameters/ in the report and the \
                      readiness probe; a change of the parameters alone reloads the same version; \
                      a boolean shown as Y/N converges without reloading again; dropping the \
                      parameters reloads the module with its defaults",
        tests: &[],
        bins: &[("ttdp-agent", "ttdp-agent")],
        examples: &[],
        files: &[],
        host_usr: false,
        agent_image: false,
        prebuilt_tree: false,
        script: "parameters.sh",
        // no build in the guest (the cache is seeded from the host-built stubs); ~15 s of agent runs
        timeout: Duration::from_secs(240),
    },
    Scenario {
        name: "swap-journal",
        description: "the real ttdp-agent binary SIGKILLed at every point of an upgrade (before \
                      the unload, between unload and load, after a load that fails validation, \
                      during the validation rollback), then the target made unobtainable (cache \
                      entry corrupt, no repository): the restarted agent loads the previous \
                      version back from the cache every time and settles the swap journal",
        tests: &[],
        bins: &[("ttdp-agent", "ttdp-agent")],
        examples: &[],
        files: &[],
        host_usr: false,
        agent_image: false,
        prebuilt_tree: false,
        script: "swap-journal.sh",
        // no build in the guest; twelve short agent runs
        timeout: Duration::from_secs(240),
    },
    Scenario {
        name: "prebuilt",
        description: "prebuilt modules (TT_KMD_PREBUILT_URL, the DaemonSet's rendering of \
                      spec.source.prebuilt) by the real ttdp-agent binary, from busybox httpd on \
                      the guest's loopback serving what `cargo xtask prebuild` wrote: a wrong \
                      checksum, a wrong vermagic and a missing file (fallback Fail) each fail the \
                      node with the driver left loaded and nothing cached; the right file is \
                      downloaded, cached with its URL and loaded, with no build",
        tests: &[],
        bins: &[("ttdp-agent", "ttdp-agent")],
        examples: &[],
        files: &[],
        host_usr: false,
        agent_image: false,
        prebuilt_tree: true,
        script: "prebuilt.sh",
        // no build in the guest; four short agent runs
        timeout: Duration::from_secs(240),
    },
    Scenario {
        name: "agent-image",
        description: "the agent image users get (`cargo xtask image agent`), unpacked from its OCI \
                      archive: the stub module its toolchain built against this kernel's headers \
                      loads; the agent run from the image's root filesystem (chroot, the image's \
                      environment, the DaemonSet's mounts) fetches and builds tt-kmd with the \
                      image's git, make and gcc, loads it, passes the readiness probe and installs \
                      the image's tt-smi on the host",
        tests: &[],
        bins: &[],
        examples: &[],
        files: &[],
        // the 9p modules and the kernel headers (the host's /usr stands in for the node's)
        host_usr: true,
        agent_image: true,
        prebuilt_tree: false,
        script: "agent-image.sh",
        // one in-VM build, as in scenario agent
        timeout: Duration::from_secs(600),
    },
    Scenario {
        name: "trixie-kernel",
        description: "Debian 13's kernel (6.12, the one the gcc 14 builder image's kbuild \
                      serves) boots instead of Debian 12's, and the stub module the gcc 14 \
                      image built against that kernel's downloaded headers loads in it, reports \
                      its version and unloads",
        tests: &[],
        bins: &[],
        examples: &[],
        files: &[],
        host_usr: false,
        agent_image: false,
        prebuilt_tree: false,
        script: "trixie-kernel.sh",
        // no build in the guest: a boot, an insmod and an rmmod
        timeout: Duration::from_secs(240),
    },
    Scenario {
        name: "udev",
        description: "tt-kmd's udev rule by the real ttdp-agent binary (report in a file) with \
                      the host's udevd running in the guest: each install puts the rule its \
                      version ships (read from the stub repository's tag) in \
                      /etc/udev/rules.d/50-tenstorrent.rules, `udevadm test` reads it without \
                      complaint, and the stub's device node gets the rule's mode; an upgrade \
                      replaces the rule, a version whose load fails is rolled back with the \
                      previous rule, a rollback after a SIGKILL between unload and load puts the \
                      previous rule back, and a version whose rule is unknown leaves the file",
        tests: &[],
        bins: &[("ttdp-agent", "ttdp-agent")],
        examples: &[],
        files: &[],
        // udevadm and systemd-udevd (the host's, from Debian's udev package) and git
        host_usr: true,
        agent_image: false,
        prebuilt_tree: false,
        script: "udev.sh",
        // no build in the guest (the cache is seeded); five short agent runs
        timeout: Duration::from_secs(300),
    },
    Scenario {
        name: "signing",
        description: "signed modules by the real ttdp-agent binary (report in a file) with a key \
                      made in the guest: the seeded stub is signed with the kernel's sign-file, \
                      modinfo shows the signer, the appended PKCS#7 verifies against the \
                      certificate (openssl smime), the report names the signer; with \
                      sig_enforce on, an unsigned module and one signed by a key the kernel does \
                      not list are refused before anything is unloaded, with the MOK steps, and \
                      the kernel's own refusal leaves the old module loaded",
        tests: &[],
        bins: &[("ttdp-agent", "ttdp-agent")],
        examples: &[],
        files: &[],
        // openssl, kmod's modinfo and the kernel's sign-file (the host's) over 9p
        host_usr: true,
        agent_image: false,
        prebuilt_tree: false,
        script: "signing.sh",
        // no build in the guest (the cache is seeded); two key pairs and three short agent runs
        timeout: Duration::from_secs(300),
    },
    Scenario {
        name: "next-kernel",
        description: "a node's next kernel prepared before the reboot, by the real ttdp-agent \
                      binary (report in a file), in two boots sharing the .ko cache over 9p: \
                      on Debian 12's kernel, with a second 6.1 ABI's headers unpacked beside it, \
                      the agent loads the stub module it built for the running kernel, then \
                      builds it in the background for the second kernel (Ready in the report), \
                      and reports a third kernel without headers Failed/HeadersMissing, the \
                      loaded module untouched; booted into the second kernel without any \
                      toolchain, the agent loads the cached module at once (the cache-hit log \
                      line, startLoad.cacheHit, the time from its start to Ready), and prunes \
                      the first kernel's entry once that kernel is removed",
        tests: &[],
        bins: &[("ttdp-agent", "ttdp-agent")],
        examples: &[],
        files: &[],
        // the first boot builds (the second boots without it: see next_kernel.rs)
        host_usr: true,
        agent_image: false,
        prebuilt_tree: false,
        script: "next-kernel.sh",
        // per boot: two in-VM builds in the first (~35 s each on an idle machine)
        timeout: Duration::from_secs(600),
    },
];

/// Not a test: `cargo xtask bench` boots it for the real-kernel load and unload times
/// (`crates/ttdp-kmod/examples/swap_timing.rs`, which prints one `BENCH-RESULT` line).
pub const SWAP_TIMING: Scenario = Scenario {
    name: "swap-timing",
    description: "times ttdp-kmod's swap on the real kernel: cache hit with nothing loaded, \
                  cache hit replacing a loaded version",
    tests: &[],
    bins: &[],
    examples: &[("ttdp-kmod", "swap_timing")],
    files: &[],
    host_usr: false,
    agent_image: false,
    prebuilt_tree: false,
    script: "swap-timing.sh",
    timeout: Duration::from_secs(240),
};

/// One build of the stub `tenstorrent` module.
#[derive(Debug)]
pub struct StubModule {
    /// `MODULE_VERSION`, also the directory name under `/ko` in the guest.
    pub version: &'static str,
    /// Built with `TT_STUB_FAIL_INIT=1`: its init returns -EINVAL, so loading it fails.
    pub fail_init: bool,
    /// The `MODE` of the udev rule its tag ships (`udev-50-tenstorrent.rules`, shaped like
    /// tt-kmd's): one per version, none the kernel's own 0666, so a node's mode tells which
    /// version's rule udev applied.
    pub udev_mode: &'static str,
}

/// The stub module versions every scenario gets.
pub const STUB_MODULES: &[StubModule] = &[
    StubModule {
        version: "1.0.0",
        fail_init: false,
        udev_mode: "0660",
    },
    StubModule {
        version: "2.0.0",
        fail_init: false,
        udev_mode: "0640",
    },
    StubModule {
        version: "3.0.0",
        fail_init: true,
        udev_mode: "0600",
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::repo_root;

    #[test]
    fn every_scenario_has_a_unique_name_and_an_executable_script() {
        use std::os::unix::fs::PermissionsExt;
        let root = repo_root().unwrap();
        for (i, scenario) in SCENARIOS.iter().enumerate() {
            assert!(
                SCENARIOS[..i].iter().all(|s| s.name != scenario.name),
                "duplicate scenario {}",
                scenario.name
            );
            let script = root.join("tests/vm/scenarios").join(scenario.script);
            let mode = std::fs::metadata(&script).unwrap().permissions().mode();
            assert!(mode & 0o111 != 0, "{} is not executable", script.display());
            for (host, _) in scenario.files {
                assert!(
                    root.join(host).is_file(),
                    "scenario {} lists missing file {host}",
                    scenario.name
                );
            }
        }
    }

    #[test]
    fn stub_versions_are_distinct_release_versions_with_one_broken() {
        for (i, module) in STUB_MODULES.iter().enumerate() {
            let parts: Vec<&str> = module.version.split('.').collect();
            assert!(
                parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()),
                "{} is not MAJOR.MINOR.PATCH",
                module.version
            );
            assert!(
                STUB_MODULES[..i]
                    .iter()
                    .all(|m| m.version != module.version)
            );
        }
        assert_eq!(STUB_MODULES.iter().filter(|m| m.fail_init).count(), 1);
        for (i, module) in STUB_MODULES.iter().enumerate() {
            assert!(
                module.udev_mode != "0666",
                "the stub's devnode already gives 0666"
            );
            assert!(
                STUB_MODULES[..i]
                    .iter()
                    .all(|m| m.udev_mode != module.udev_mode),
                "each version's rule gives its own mode"
            );
        }
        assert!(STUB_MODULES.iter().filter(|m| !m.fail_init).count() >= 2);
    }
}
