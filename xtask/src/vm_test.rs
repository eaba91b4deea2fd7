//! `cargo xtask vm-test`: runs the real-kernel tests inside a Debian 12 kernel booted under QEMU.
//!
//! What it does, in order (each step prints its time):
//! 1. checks the host tools and fails with the exact install command when one is missing (it never
//!    skips): `bash .ci/vm-deps` installs them all on Debian 12;
//! 2. takes the newest installed `linux-headers-6.1.0-<abi>-amd64` and fetches the matching
//!    `linux-image-6.1.0-<abi>-amd64` with `apt-get download` (only `boot/vmlinuz-*` and the
//!    virtio/9p modules are unpacked), cached under `<target dir>/vm/kernel/`;
//! 3. builds the stub `tenstorrent` module (`tests/vm/stub-module/`) against those headers at every
//!    version in [`STUB_MODULES`] (one of them fails its init on purpose), cached under
//!    `<target dir>/vm/modules/` and rebuilt only when its source changes;
//! 4. builds each scenario's test and binary targets as static executables;
//! 5. packs one gzip initramfs per scenario (busybox, `tests/vm/init.sh` as `/init`, the `.ko`
//!    files, a git repository of the stub module, the executables, the scenario script) and boots
//!    it with `qemu-system-x86_64 -accel tcg` (never KVM), no network, under `timeout`;
//! 6. prints each scenario's output and fails when a scenario failed, timed out, or ran no test.
//!
//! Usage: `cargo xtask vm-test [--scenario NAME]... [--timeout SECS] [--list] [-- ARGS...]`.
//! `ARGS` go to the scenario script inside the VM (for the test scenarios: to the libtest harness,
//! e.g. `-- swap --nocapture`). Serial logs of the last run of each scenario stay in
//! `<target dir>/vm/runs/<scenario>/` (`console.log`, `output.log`, `status.log`).
//!
//! # The guest
//! `/init` mounts proc, sysfs, securityfs, devtmpfs and tmpfs, sources `/etc/ttdp-vm.env` (the
//! variables below, exported) and runs `/scenario.sh ARGS` with its output on the second serial
//! port; the third serial port gets its exit status; then `poweroff -f`. Inside the VM (host root
//! `/`, writable, in RAM):
//! - `TTDP_VM_KO_DIR` (`/ko`) holds `<version>/tenstorrent.ko` for each stub version;
//! - `TTDP_VM_KO_VERSIONS` lists the versions that load (space separated, oldest first) and
//!   `TTDP_VM_KO_BROKEN_VERSION` the one whose init fails with EINVAL;
//! - `TTDP_VM_STUB_REPO` (`/srv/tt-kmd-stub.git`) is a bare git repository of the stub module with
//!   one tag `ttkmd-<version>` per stub version, built the way tt-kmd is (`make -C <build tree>
//!   M=<src> modules`, nothing else): use it as the tt-kmd repository URL;
//! - test targets are at `/tests/<package>/<test>`, binary targets at `/opt/ttdp/bin/<bin>`;
//! - `TTDP_VM_KERNEL_RELEASE` is the running release (the one the modules were built for);
//! - `TTDP_VM_HOST_USR` is `1` when the scenario has the host's `/usr` (see [`Scenario::host_usr`]):
//!   git, make, gcc and `/lib/modules/<release>/build` then work in the guest.
//!
//! # Adding a scenario
//! Add a [`Scenario`] to [`SCENARIOS`]: its integration tests (`tests`), binaries (`bins`) and
//! examples (`examples`) are built static (and copied in without their debug info), `files` are copied from the repository
//! to the given guest paths, `host_usr` gives it a toolchain, and `script` (a busybox `sh` script
//! under `tests/vm/scenarios/`) is the workload. The script's exit status decides, and it must
//! report what ran: either libtest's `test result:` lines or a plain `N passed, N failed` line of
//! its own; a scenario that reports no passed test fails. The VM has no network: give a binary its
//! inputs as files (the stub repository stands in for tt-kmd's) and let it report on stdout or in
//! files the script checks. Scenario `agent` is the example of a binary: it lists
//! `("ttdp-agent", "ttdp-agent")` in `bins`, sets `host_usr` for its cache miss, and its script
//! (`tests/vm/scenarios/agent.sh`) drives the long-running agent against `TTDP_VM_STUB_REPO`,
//! with `TTDP_REPORT=file:...` standing in for the Kubernetes API, and checks the module, the
//! probe, the report file and the agent's JSON log.
//!
//! [`SWAP_TIMING`] is a scenario outside [`SCENARIOS`]: `cargo xtask bench` boots it through
//! [`Vm`] for the real-kernel load and unload times.

#[path = "vm_boot.rs"]
mod vm_boot;
#[path = "vm_host_tools.rs"]
mod vm_host_tools;
#[path = "vm_initramfs.rs"]
mod vm_initramfs;
#[path = "vm_kernel.rs"]
mod vm_kernel;
#[path = "vm_static_build.rs"]
mod vm_static_build;
#[path = "vm_stub_module.rs"]
mod vm_stub_module;
#[path = "vm_stub_repo.rs"]
mod vm_stub_repo;
#[path = "vm_test_report.rs"]
mod vm_test_report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::tools::{repo_root, target_dir};
use anyhow::{Context, Result, bail};
pub use vm_boot::Boot;

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
        script: "agent.sh",
        // one in-VM build (as kmod-build) plus ~30 s of agent runs
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
}

/// The stub module versions every scenario gets.
pub const STUB_MODULES: &[StubModule] = &[
    StubModule {
        version: "1.0.0",
        fail_init: false,
    },
    StubModule {
        version: "2.0.0",
        fail_init: false,
    },
    StubModule {
        version: "3.0.0",
        fail_init: true,
    },
];

/// Parsed `cargo xtask vm-test` arguments.
#[derive(Debug, Default)]
struct Args {
    scenarios: Vec<String>,
    timeout: Option<Duration>,
    list: bool,
    guest_args: Vec<String>,
}

const USAGE: &str =
    "usage: cargo xtask vm-test [--scenario NAME]... [--timeout SECS] [--list] [-- ARGS...]
  --scenario NAME  run only this scenario (repeatable; default: all)
  --timeout SECS   override every scenario's boot timeout
  --list           list the scenarios and exit
  -- ARGS          passed to the scenario inside the VM (test name filter, --nocapture, ...)";

fn parse_args(args: &[String]) -> Result<Args> {
    let mut parsed = Args::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--scenario" => {
                let name = iter.next().context("--scenario needs a name")?;
                parsed.scenarios.push(name.clone());
            }
            "--timeout" => {
                let secs = iter.next().context("--timeout needs a number of seconds")?;
                let secs: u64 = secs
                    .parse()
                    .with_context(|| format!("--timeout {secs:?} is not a number of seconds"))?;
                parsed.timeout = Some(Duration::from_secs(secs));
            }
            "--list" => parsed.list = true,
            "--" => {
                parsed.guest_args = iter.cloned().collect();
                break;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown vm-test argument {other:?}\n\n{USAGE}"),
        }
    }
    Ok(parsed)
}

fn selected_scenarios(names: &[String]) -> Result<Vec<&'static Scenario>> {
    if names.is_empty() {
        return Ok(SCENARIOS.iter().collect());
    }
    names
        .iter()
        .map(|name| {
            SCENARIOS.iter().find(|s| s.name == name).with_context(|| {
                let known: Vec<_> = SCENARIOS.iter().map(|s| s.name).collect();
                format!("unknown scenario {name:?}; known: {}", known.join(", "))
            })
        })
        .collect()
}

/// `<target dir>/vm`, honouring `CARGO_TARGET_DIR`.
fn vm_cache_dir(root: &Path) -> Result<PathBuf> {
    Ok(target_dir(root)?.join("vm"))
}

fn step<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let start = Instant::now();
    println!("vm-test: {what} ...");
    let value = f()?;
    println!(
        "vm-test: {what}: done in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(value)
}

/// Entry point of `cargo xtask vm-test`.
pub fn run(args: &[String]) -> Result<()> {
    let args = parse_args(args)?;
    if args.list {
        for s in SCENARIOS {
            println!("{:<10} {}", s.name, s.description);
        }
        return Ok(());
    }
    let scenarios = selected_scenarios(&args.scenarios)?;
    let started = Instant::now();
    let vm = Vm::prepare()?;
    let mut reports = Vec::new();
    for scenario in scenarios {
        let boot = vm.boot(scenario, &args.guest_args, args.timeout)?;
        let report = vm_test_report::ScenarioReport::new(scenario.name, boot);
        report.print();
        reports.push(report);
    }
    vm_test_report::judge(&reports, started.elapsed())
}

/// What every scenario's VM shares: the host tools, the kernel and the stub modules (steps 1 to 3
/// of the module documentation).
pub struct Vm {
    root: PathBuf,
    cache: PathBuf,
    host: vm_host_tools::HostTools,
    kernel: vm_kernel::Kernel,
    modules: Vec<vm_stub_module::BuiltModule>,
}

impl Vm {
    /// Checks the host tools, fetches the kernel and builds the stub modules.
    pub fn prepare() -> Result<Self> {
        let root = repo_root()?;
        let cache = vm_cache_dir(&root)?;
        let host = step("checking host tools", vm_host_tools::check)?;
        let kernel = step("fetching the kernel image", || {
            vm_kernel::ensure(&cache, &host.headers)
        })?;
        println!(
            "vm-test: kernel {} ({})",
            kernel.release,
            kernel.vmlinuz.display()
        );
        let modules = step("building the stub tenstorrent module", || {
            vm_stub_module::build_all(&root, &cache, &host.headers)
        })?;
        Ok(Self {
            root,
            cache,
            host,
            kernel,
            modules,
        })
    }

    /// Builds the scenario's executables, packs its initramfs and boots it (steps 4 and 5), with
    /// `guest_args` for its script and `timeout` instead of the scenario's own when given.
    pub fn boot(
        &self,
        scenario: &'static Scenario,
        guest_args: &[String],
        timeout: Option<Duration>,
    ) -> Result<Boot> {
        let executables = step(
            &format!("[{}] building static executables", scenario.name),
            || vm_static_build::build(&self.root, scenario),
        )?;
        let initrd = step(
            &format!("[{}] packing the initramfs", scenario.name),
            || {
                vm_initramfs::pack(&vm_initramfs::Contents {
                    root: &self.root,
                    cache: &self.cache,
                    scenario,
                    busybox: &self.host.busybox,
                    kernel: &self.kernel,
                    modules: &self.modules,
                    executables: &executables,
                    guest_args,
                })
            },
        )?;
        let timeout = timeout.unwrap_or(scenario.timeout);
        let run_dir = self.cache.join("runs").join(scenario.name);
        step(
            &format!(
                "[{}] booting the VM (timeout {} s)",
                scenario.name,
                timeout.as_secs()
            ),
            || {
                vm_boot::boot(&vm_boot::Machine {
                    vmlinuz: &self.kernel.vmlinuz,
                    initrd: &initrd,
                    run_dir: &run_dir,
                    limit: timeout,
                    host_usr: scenario.host_usr,
                })
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn arguments_after_the_separator_go_to_the_guest_untouched() {
        let args = parse_args(&strings(&[
            "--scenario",
            "kmod",
            "--timeout",
            "30",
            "--",
            "swap",
            "--scenario",
            "x",
        ]))
        .unwrap();
        assert_eq!(args.scenarios, vec!["kmod"]);
        assert_eq!(args.timeout, Some(Duration::from_secs(30)));
        assert_eq!(args.guest_args, vec!["swap", "--scenario", "x"]);
    }

    #[test]
    fn bad_arguments_and_unknown_scenarios_are_errors() {
        assert!(parse_args(&strings(&["--timeout", "soon"])).is_err());
        assert!(parse_args(&strings(&["--scenario"])).is_err());
        assert!(parse_args(&strings(&["--frobnicate"])).is_err());
        let err = selected_scenarios(&strings(&["nope"])).unwrap_err();
        assert!(err.to_string().contains("known: kmod"), "{err}");
        assert_eq!(selected_scenarios(&[]).unwrap().len(), SCENARIOS.len());
    }

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
        assert!(STUB_MODULES.iter().filter(|m| !m.fail_init).count() >= 2);
    }
}
