//! [`SimHost`]: creates a simulated host root (kernel release, `/proc/version`, a kernel build
//! tree that really compiles, PCI devices, signing facts), for tests and the demo.
//!
//! The build tree `/lib/modules/<release>/build` is a link to `/usr/src/linux-headers-<release>`
//! (as on Debian and Ubuntu) whose `Makefile` answers `make -C <tree> M=<src> modules` by compiling
//! `<src>/*.c` with `cc -c` and linking them (`cc -r`) into `<src>/tenstorrent.ko`: a real ELF
//! object whose `.modinfo` carries `name=tenstorrent`, `vermagic=<release> SMP mod_unload` and a
//! `srcversion` computed from the sources, next to the `version=` the sources declare.

use std::io;
use std::path::{Path, PathBuf};

use ttdp_hostprobe::{HostRoot, kernel_release};

use crate::sim_kernel::SimKernel;

/// The simulated kbuild script installed in the fake build tree (`scripts/sim-kbuild.sh`).
const SIM_KBUILD: &str = r#"#!/bin/sh
# Simulated kbuild for ttdp tests: compiles $M/*.c into $M/tenstorrent.ko with a modpost-like .modinfo.
set -eu
M="$1"; RELEASE="$2"; TREE="$3"
[ -n "$M" ] || { echo "sim-kbuild: M= is required" >&2; exit 2; }
if [ -e "$TREE/.sim-fail-build" ]; then
  echo "sim-kbuild: simulated build failure (remove $TREE/.sim-fail-build)" >&2
  exit 2
fi
cd "$M"
# what the priority of a background build is, for the tests to read in the build log
echo "sim-kbuild: niceness $(nice)"
srcs=$(ls *.c | grep -v '^tenstorrent\.mod\.c$')
srcversion=$(cat $srcs | md5sum | cut -c1-24 | tr a-f A-F)
cat > tenstorrent.mod.c <<MODC
#define SIM_MODINFO(n, s) static const char n[] __attribute__((section(".modinfo"), used, aligned(1))) = s
SIM_MODINFO(sim_name, "name=tenstorrent");
SIM_MODINFO(sim_vermagic, "vermagic=$RELEASE SMP mod_unload ");
SIM_MODINFO(sim_srcversion, "srcversion=$srcversion");
MODC
objs=""
for f in $srcs tenstorrent.mod.c; do
  echo "  CC [M]  $M/${f%.c}.o"
  ${CC:-cc} -c -o "${f%.c}.o" "$f"
  objs="$objs ${f%.c}.o"
done
echo "  LD [M]  $M/tenstorrent.ko"
${CC:-cc} -r -nostdlib -o tenstorrent.ko $objs
"#;

/// The fake build tree's Makefile, with the release substituted for `@RELEASE@`.
const SIM_MAKEFILE: &str = "# Simulated kernel build tree for ttdp tests (kernel @RELEASE@).
KERNELRELEASE := @RELEASE@
modules:
\t@sh $(CURDIR)/scripts/sim-kbuild.sh \"$(M)\" \"$(KERNELRELEASE)\" \"$(CURDIR)\"
.PHONY: modules
";

/// A simulated host root on disk. Dropping it leaves the files (the directory belongs to the caller).
#[derive(Debug, Clone)]
pub struct SimHost {
    host: HostRoot,
    release: String,
}

impl SimHost {
    /// Creates a simulated host under `dir` running kernel `release` (e.g. `6.8.0-sim`), with
    /// headers installed, one Wormhole device at `0000:01:00.0`, no DKMS install, module signing
    /// not enforced and no module loaded.
    pub fn create(dir: impl Into<PathBuf>, release: &str) -> io::Result<Self> {
        let sim = Self {
            host: HostRoot::new(dir.into()),
            release: release.to_string(),
        };
        sim.write("/proc/sys/kernel/osrelease", &format!("{release}\n"))?;
        sim.write(
            "/proc/version",
            &format!(
                "Linux version {release} (sim@ttdp) (cc (GCC) 12.2.0, GNU ld (GNU Binutils) 2.40) #1 SMP PREEMPT_DYNAMIC\n"
            ),
        )?;
        sim.write("/sys/module/module/parameters/sig_enforce", "N\n")?;
        sim.write(
            "/sys/kernel/security/lockdown",
            "[none] integrity confidentiality\n",
        )?;
        std::fs::create_dir_all(sim.host.path("/var/cache"))?;
        sim.install_headers()?;
        sim.add_pci_device("0000:01:00.0", 0x401e)?;
        Ok(sim)
    }

    /// Opens a simulated host another process created under `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let host = HostRoot::new(dir.into());
        let release = kernel_release(&host).map_err(io::Error::other)?;
        Ok(Self { host, release })
    }

    /// The host root.
    pub fn host(&self) -> &HostRoot {
        &self.host
    }

    /// The simulated kernel release.
    pub fn release(&self) -> &str {
        &self.release
    }

    /// The simulated kernel of this host.
    pub fn kernel(&self) -> SimKernel {
        SimKernel::new(self.host.clone())
    }

    /// Installs (again) the kernel headers: the fake build tree and its `/lib/modules` link.
    pub fn install_headers(&self) -> io::Result<()> {
        self.install_headers_of(&self.release)
    }

    /// Installs another kernel beside the running one, as a package upgrade does before the
    /// reboot: its `/lib/modules/<release>` directory, its headers (a fake build tree that
    /// builds for `release`) when `headers`, and its image `/boot/vmlinuz-<release>` when
    /// `image`.
    pub fn add_kernel(&self, release: &str, headers: bool, image: bool) -> io::Result<()> {
        std::fs::create_dir_all(self.host.path(format!("/lib/modules/{release}/kernel")))?;
        if headers {
            self.install_headers_of(release)?;
        }
        if image {
            self.write(
                &format!("/boot/vmlinuz-{release}"),
                "simulated kernel image\n",
            )?;
        }
        Ok(())
    }

    /// Removes another kernel: its `/lib/modules/<release>`, its headers and its image.
    pub fn remove_kernel(&self, release: &str) -> io::Result<()> {
        for dir in [
            format!("/lib/modules/{release}"),
            format!("/usr/src/linux-headers-{release}"),
        ] {
            match std::fs::remove_dir_all(self.host.path(dir)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        match std::fs::remove_file(self.host.path(format!("/boot/vmlinuz-{release}"))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn install_headers_of(&self, release: &str) -> io::Result<()> {
        let headers = format!("/usr/src/linux-headers-{release}");
        self.write(
            &format!("{headers}/Makefile"),
            &SIM_MAKEFILE.replace("@RELEASE@", release),
        )?;
        self.write(&format!("{headers}/scripts/sim-kbuild.sh"), SIM_KBUILD)?;
        let link = self.host.path(format!("/lib/modules/{release}/build"));
        std::fs::create_dir_all(link.parent().unwrap_or(Path::new("/")))?;
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(&headers, &link)?;
        }
        Ok(())
    }

    /// Makes every later `make modules` against kernel `release`'s build tree fail
    /// (`fail = true`) or not.
    pub fn fail_builds_of(&self, release: &str, fail: bool) -> io::Result<()> {
        let marker = self
            .host
            .path(format!("/usr/src/linux-headers-{release}/.sim-fail-build"));
        if fail {
            std::fs::write(marker, "")
        } else {
            match std::fs::remove_file(marker) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }

    /// Removes the kernel headers, as on a node without `linux-headers-<release>`.
    pub fn remove_headers(&self) -> io::Result<()> {
        std::fs::remove_dir_all(
            self.host
                .path(format!("/usr/src/linux-headers-{}", self.release)),
        )?;
        std::fs::remove_file(
            self.host
                .path(format!("/lib/modules/{}/build", self.release)),
        )
    }

    /// Makes every later `make modules` against this host's build tree fail (`fail = true`) or not.
    pub fn fail_builds(&self, fail: bool) -> io::Result<()> {
        self.fail_builds_of(&self.release, fail)
    }

    /// Makes the simulated kernel enforce module signatures (`sig_enforce=Y`) or not.
    pub fn enforce_signatures(&self, enforce: bool) -> io::Result<()> {
        self.write(
            "/sys/module/module/parameters/sig_enforce",
            if enforce { "Y\n" } else { "N\n" },
        )
    }

    /// Sets the simulated lockdown level (`none`, `integrity` or `confidentiality`).
    pub fn set_lockdown(&self, level: &str) -> io::Result<()> {
        let line: Vec<String> = ["none", "integrity", "confidentiality"]
            .iter()
            .map(|l| {
                if *l == level {
                    format!("[{l}]")
                } else {
                    (*l).to_string()
                }
            })
            .collect();
        self.write(
            "/sys/kernel/security/lockdown",
            &format!("{}\n", line.join(" ")),
        )
    }

    /// Adds a Tenstorrent PCI function (`device_id` e.g. `0x401e` Wormhole, `0xb140` Blackhole).
    pub fn add_pci_device(&self, address: &str, device_id: u16) -> io::Result<()> {
        self.write(
            &format!("/sys/bus/pci/devices/{address}/vendor"),
            "0x1e52\n",
        )?;
        self.write(
            &format!("/sys/bus/pci/devices/{address}/device"),
            &format!("0x{device_id:04x}\n"),
        )
    }

    /// Simulates a DKMS-managed install: `/var/lib/dkms/tenstorrent/<v>/` for each version.
    pub fn add_dkms_state(&self, versions: &[&str]) -> io::Result<()> {
        std::fs::create_dir_all(self.host.path("/var/lib/dkms/tenstorrent"))?;
        for version in versions {
            std::fs::create_dir_all(
                self.host
                    .path(format!("/var/lib/dkms/tenstorrent/{version}")),
            )?;
        }
        Ok(())
    }

    /// Simulates a registered DKMS source: `/usr/src/tenstorrent-<version>/dkms.conf`.
    pub fn add_dkms_source(&self, version: &str) -> io::Result<()> {
        self.write(
            &format!("/usr/src/tenstorrent-{version}/dkms.conf"),
            &format!("PACKAGE_NAME=\"tenstorrent\"\nPACKAGE_VERSION=\"{version}\"\n"),
        )
    }

    fn write(&self, host_path: &str, text: &str) -> io::Result<()> {
        let path = self.host.path(host_path);
        std::fs::create_dir_all(path.parent().unwrap_or(Path::new("/")))?;
        std::fs::write(path, text)
    }
}
