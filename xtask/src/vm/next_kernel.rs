//! Scenario `next-kernel`: a node's next kernel prepared before the reboot, then booted.
//!
//! A second Debian 12 kernel of another 6.1 ABI ([`NEXT_KERNEL_BASE`] at the pinned
//! [`NEXT_KERNEL_VERSION`]) is fetched with `apt-get download` through [`PinnedKernel`]: its
//! headers (`linux-headers-<release>` and `-common`) are unpacked, not installed, with
//! `usr/lib/linux-kbuild-6.1` leading to the host's kbuild (one package serves every 6.1 ABI,
//! and Debian's mirrors keep only its newest version); its image gives the `vmlinuz` and the
//! 9p modules. The scenario boots twice, its `.ko` cache a host folder shared read-write over
//! 9p ([`CACHE_TAG`], emptied before the first boot) so the second boot sees what the first
//! left:
//! 1. the kernel every scenario boots, with the host's `/usr` and the second kernel's headers
//!    shared read-only ([`HEADERS_TAG`]): the agent builds for both kernels;
//! 2. the second kernel, without the host's `/usr` (nothing could be built): the agent loads the
//!    cached module.
//!
//! The second boot runs only when the first passed. The script learns the boot from
//! `TTDP_VM_BOOT` (`1`, `2`) and the kernels from `TTDP_VM_FIRST_RELEASE` and
//! `TTDP_VM_NEXT_RELEASE`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};

use super::boot::{self, Boot, Share};
use super::debian_kernel::{HeadersTree, PinnedKernel};
use super::kernel::{self, Kernel};
use super::scenarios::Scenario;
use super::{Vm, build_executables, initramfs, step};

/// The scenario's name.
pub const SCENARIO: &str = "next-kernel";
/// The second kernel: `linux-image-<base>-amd64` and its headers.
pub const NEXT_KERNEL_BASE: &str = "6.1.0-56";
/// The pinned version of the second kernel's packages (in `bookworm-security`, which keeps
/// each ABI's packages: their names carry the ABI).
pub const NEXT_KERNEL_VERSION: &str = "6.1.192-2";
/// The suite whose mirrors have it (from `deploy/docker/image-pins.yaml`).
const SUITE: &str = "bookworm";
/// The kbuild package every 6.1 ABI's headers lead to (`scripts`, `tools`).
const KBUILD: &str = "usr/lib/linux-kbuild-6.1";
/// The 9p tag of the second kernel's unpacked headers.
pub const HEADERS_TAG: &str = "nextheaders";
/// The 9p tag of the shared `.ko` cache.
pub const CACHE_TAG: &str = "kocache";
/// The two boots, as their reports are named.
const BOOTS: [&str; 2] = [
    "next-kernel (boot 1: prepare both kernels)",
    "next-kernel (boot 2: into the next kernel)",
];

/// The second kernel, ready to boot, and its headers.
#[derive(Debug)]
pub struct NextKernel {
    /// Its image and 9p modules.
    pub kernel: Kernel,
    /// Its unpacked headers.
    pub headers: HeadersTree,
}

/// Fetches and unpacks the second kernel (once; cached), which must not be `running`.
pub fn prepare(cache: &Path, running: &str) -> Result<NextKernel> {
    let pinned = PinnedKernel::new(NEXT_KERNEL_BASE, NEXT_KERNEL_VERSION, SUITE, None)?;
    let release = pinned.release();
    if release == running {
        bail!(
            "the second kernel {release} is the one the VM boots first: pin another ABI in NEXT_KERNEL_BASE"
        );
    }
    let headers = pinned.headers()?;
    let kbuild = headers.root.join(KBUILD);
    if std::fs::symlink_metadata(&kbuild).is_err() {
        std::fs::create_dir_all(headers.root.join("usr/lib"))?;
        std::os::unix::fs::symlink(Path::new("/").join(KBUILD), &kbuild)?;
    }
    let deb = pinned.image_deb()?;
    let kernel = kernel::from_image_deb(&deb, &release, &cache.join("kernel").join(&release))?;
    Ok(NextKernel { kernel, headers })
}

impl Vm {
    /// Boots scenario `next-kernel` twice (see the module docs); returns each boot that ran,
    /// named.
    pub fn boot_next_kernel(
        &self,
        scenario: &'static Scenario,
        guest_args: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<(&'static str, Boot)>> {
        let next = step(
            "[next-kernel] fetching the second kernel and its headers",
            || prepare(&self.cache, &self.kernel.release),
        )?;
        let executables = build_executables(&self.root, scenario)?;
        let runs = self.cache.join("runs").join(SCENARIO);
        let shared_cache = runs.join("ko-cache");
        if shared_cache.exists() {
            std::fs::remove_dir_all(&shared_cache)?;
        }
        std::fs::create_dir_all(&shared_cache)?;
        let mut boots = Vec::new();
        for (index, name) in BOOTS.into_iter().enumerate() {
            let first = index == 0;
            let kernel = if first { &self.kernel } else { &next.kernel };
            let mut shares = vec![Share {
                path: shared_cache.clone(),
                tag: CACHE_TAG,
                read_only: false,
            }];
            if first {
                shares.push(Share {
                    path: next.headers.root.clone(),
                    tag: HEADERS_TAG,
                    read_only: true,
                });
            }
            let env: Vec<(String, String)> = [
                ("TTDP_VM_BOOT", (index + 1).to_string()),
                ("TTDP_VM_FIRST_RELEASE", self.kernel.release.clone()),
                ("TTDP_VM_NEXT_RELEASE", next.kernel.release.clone()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            let initrd = step(&format!("[{name}] packing the initramfs"), || {
                initramfs::pack(&initramfs::Contents {
                    root: &self.root,
                    cache: &self.cache,
                    scenario,
                    busybox: &self.host.busybox,
                    kernel,
                    modules: &self.modules,
                    executables: &executables,
                    guest_args,
                    extra_files: &[],
                    extra_env: &env,
                    host_usr: first,
                    ninep: true,
                })
            })?;
            let run_dir = runs.join(format!("boot-{}", index + 1));
            let limit = timeout.unwrap_or(scenario.timeout);
            let boot = boot_one(name, kernel, &initrd, &run_dir, limit, first, &shares)?;
            let passed = boot.exit_code == Some(0);
            boots.push((name, boot));
            if !passed {
                // the second boot stands on what the first left in the cache
                break;
            }
        }
        Ok(boots)
    }
}

fn boot_one(
    name: &str,
    kernel: &Kernel,
    initrd: &Path,
    run_dir: &Path,
    limit: Duration,
    host_usr: bool,
    shares: &[Share],
) -> Result<Boot> {
    step(
        &format!(
            "[{name}] booting {} (timeout {} s)",
            kernel.release,
            limit.as_secs()
        ),
        || {
            boot::boot(&boot::Machine {
                vmlinuz: &kernel.vmlinuz,
                initrd,
                run_dir,
                limit,
                host_usr,
                agent_image: None,
                shares,
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::SCENARIOS;

    #[test]
    fn the_scenario_exists_and_shares_the_cache_between_its_boots() {
        let scenario = SCENARIOS.iter().find(|s| s.name == SCENARIO).unwrap();
        assert!(scenario.host_usr, "the first boot builds");
        assert!(scenario.bins.contains(&("ttdp-agent", "ttdp-agent")));
        assert_ne!(HEADERS_TAG, CACHE_TAG);
        assert!(NEXT_KERNEL_BASE.starts_with("6.1.0-"));
    }
}
