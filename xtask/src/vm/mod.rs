//! `cargo xtask vm-test`: runs the real-kernel tests inside a Debian 12 kernel booted under QEMU.
//!
//! What it does, in order (each step prints its time):
//! 1. checks the host tools and fails with the exact install command when one is missing (it never
//!    skips): `bash .ci/vm-deps` installs them all on Debian 12;
//! 2. takes the newest installed `linux-headers-6.1.0-<abi>-amd64` and fetches the matching
//!    `linux-image-6.1.0-<abi>-amd64` with `apt-get download` (only `boot/vmlinuz-*` and the
//!    virtio/9p modules are unpacked), cached under `<target dir>/vm/kernel/`;
//! 3. builds the stub `tenstorrent` module (`tests/vm/stub-module/`) against those headers at every
//!    version in [`STUB_MODULES`](scenarios::STUB_MODULES) (one of them fails its init on
//!    purpose), cached under `<target dir>/vm/modules/` and rebuilt only when its source changes;
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
//! Add a [`Scenario`] to [`SCENARIOS`] (in `scenarios.rs`): its integration tests (`tests`), binaries (`bins`) and
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
//!
//! # Layout
//! This module parses the command line and drives the steps above; one submodule per step does
//! the work, and imports between them only go one way (no cycles):
//! - [`scenarios`] (the scenarios and the stub module versions, plain data), [`elf`] (is a file a
//!   static executable?), [`headers`] (the installed kernel headers) and [`boot`] (step 5's QEMU
//!   run) import no sibling;
//! - [`host_tools`] (step 1) uses [`elf`] and [`headers`]; [`kernel`] (step 2) uses [`headers`];
//!   [`stub_module`] (step 3) uses [`headers`] and [`scenarios`]; [`static_build`] (step 4) uses
//!   [`elf`] and [`scenarios`]; [`stub_repo`] uses [`scenarios`];
//! - [`initramfs`] (step 5) packs what [`kernel`], [`stub_module`], [`static_build`] and
//!   [`stub_repo`] produce;
//! - [`test_report`] (step 6) reads what [`boot`] returns;
//! - [`prebuilt_tree`] runs `cargo xtask prebuild` on [`stub_repo`] for scenario `prebuilt`;
//! - [`next_kernel`] boots scenario `next-kernel` twice (a second Debian 12 kernel from
//!   [`debian_kernel`], the cache kept over 9p between the boots).

mod agent_image;
mod boot;
mod builder_kernel;
pub mod debian_kernel;
mod elf;
mod headers;
mod host_tools;
mod initramfs;
mod kernel;
mod next_kernel;
mod prebuilt_tree;
mod scenarios;
pub mod static_build;
mod stub_module;
mod stub_repo;
mod test_report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::tools::{repo_root, target_dir};
pub use boot::Boot;
pub use elf::is_static_elf;
pub use scenarios::{SCENARIOS, SWAP_TIMING, Scenario};

/// Parsed `cargo xtask vm-test` arguments.
#[derive(Debug, Default)]
struct Args {
    scenarios: Vec<String>,
    timeout: Option<Duration>,
    list: bool,
    build_only: bool,
    guest_args: Vec<String>,
}

const USAGE: &str =
    "usage: cargo xtask vm-test [--scenario NAME]... [--timeout SECS] [--list] [--build-only] [-- ARGS...]
  --scenario NAME  run only this scenario (repeatable; default: all)
  --timeout SECS   override every scenario's boot timeout
  --list           list the scenarios and exit
  --build-only     only build the scenarios' static executables (the test script does this
                   while the end-to-end suites run, when the CPUs mostly wait)
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
            "--build-only" => parsed.build_only = true,
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

/// The newest installed Debian 12 kernel headers (those of the kernel the VM boots), or how to
/// install them.
pub fn newest_headers() -> Result<headers::Headers> {
    headers::newest_installed().context(
        "no linux-headers-6.1.0-<abi>-amd64 under /usr/src: run `bash .ci/vm-deps` (Debian 12)",
    )
}

/// `<target dir>/vm`, honouring `CARGO_TARGET_DIR`.
fn vm_cache_dir(root: &Path) -> Result<PathBuf> {
    Ok(target_dir(root)?.join("vm"))
}

fn build_executables(root: &Path, scenario: &Scenario) -> Result<Vec<static_build::Executable>> {
    step(
        &format!("[{}] building static executables", scenario.name),
        || static_build::build(root, scenario),
    )
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
    if args.build_only {
        let root = repo_root()?;
        for scenario in scenarios {
            build_executables(&root, scenario)?;
        }
        return Ok(());
    }
    let started = Instant::now();
    let vm = Vm::prepare()?;
    let mut reports = Vec::new();
    for scenario in scenarios {
        let boots = if scenario.name == next_kernel::SCENARIO {
            vm.boot_next_kernel(scenario, &args.guest_args, args.timeout)?
        } else {
            vec![(
                scenario.name,
                vm.boot(scenario, &args.guest_args, args.timeout)?,
            )]
        };
        for (name, boot) in boots {
            let report = test_report::ScenarioReport::new(name, boot);
            report.print();
            reports.push(report);
        }
    }
    test_report::judge(&reports, started.elapsed())
}

/// What every scenario's VM shares: the host tools, the kernel and the stub modules (steps 1 to 3
/// of the module documentation).
pub struct Vm {
    root: PathBuf,
    cache: PathBuf,
    host: host_tools::HostTools,
    kernel: kernel::Kernel,
    modules: Vec<stub_module::BuiltModule>,
}

impl Vm {
    /// Checks the host tools, fetches the kernel and builds the stub modules.
    pub fn prepare() -> Result<Self> {
        let root = repo_root()?;
        let cache = vm_cache_dir(&root)?;
        let host = step("checking host tools", host_tools::check)?;
        let kernel = step("fetching the kernel image", || {
            kernel::ensure(&cache, &host.headers)
        })?;
        println!(
            "vm-test: kernel {} ({})",
            kernel.release,
            kernel.vmlinuz.display()
        );
        let modules = step("building the stub tenstorrent module", || {
            stub_module::build_all(&root, &cache, &host.headers)
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
        let executables = build_executables(&self.root, scenario)?;
        let image = if scenario.agent_image {
            Some(step(
                &format!("[{}] preparing the agent image", scenario.name),
                || agent_image::prepare(&self.root, &self.cache),
            )?)
        } else {
            None
        };
        let (mut extra_files, mut extra_env) = match &image {
            Some(i) => (
                vec![(i.ko.clone(), "/image-ko/tenstorrent.ko".to_owned())],
                i.guest_env.clone(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        let builder = match builder_kernel::family_of(scenario.name) {
            Some(gcc) => Some(step(
                &format!(
                    "[{}] the gcc {gcc} builder's kernel and module",
                    scenario.name
                ),
                || builder_kernel::prepare(&self.root, &self.cache, gcc),
            )?),
            None => None,
        };
        if let Some(b) = &builder {
            extra_files.push((b.ko.clone(), "/image-ko/tenstorrent.ko".to_owned()));
            extra_env.extend(b.guest_env.iter().cloned());
        }
        let kernel = builder.as_ref().map_or(&self.kernel, |b| &b.kernel);
        if scenario.prebuilt_tree {
            let tree = step(
                &format!("[{}] prebuilding the served modules", scenario.name),
                || prebuilt_tree::prepare(&self.root, &self.cache, &self.host.headers),
            )?;
            extra_files.extend(tree.files);
            extra_env.extend(tree.env);
        }
        let initrd = step(
            &format!("[{}] packing the initramfs", scenario.name),
            || {
                initramfs::pack(&initramfs::Contents {
                    root: &self.root,
                    cache: &self.cache,
                    scenario,
                    busybox: &self.host.busybox,
                    kernel,
                    modules: &self.modules,
                    executables: &executables,
                    guest_args,
                    extra_files: &extra_files,
                    extra_env: &extra_env,
                    host_usr: scenario.host_usr,
                    ninep: scenario.host_usr,
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
                boot::boot(&boot::Machine {
                    vmlinuz: &kernel.vmlinuz,
                    initrd: &initrd,
                    run_dir: &run_dir,
                    limit: timeout,
                    host_usr: scenario.host_usr,
                    agent_image: image.as_ref().map(|i| i.rootfs.as_path()),
                    shares: &[],
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
}
