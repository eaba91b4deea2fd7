//! Scenarios that boot another Debian kernel than the host's: the kernel a builder image's
//! pinned kbuild serves (Debian 13's 6.12 for the gcc 14 builder), with the stub module that
//! image's toolchain built against that kernel's headers (the image test's build, with its
//! checks: no compiler warning, `.comment` naming only the family's gcc). The guest finds it at
//! `/image-ko/tenstorrent.ko`; only `boot/vmlinuz-<release>` of the kernel package is unpacked
//! (these scenarios need no 9p, so no module of the kernel package).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::debian_kernel::PinnedKernel;
use super::kernel::Kernel;
use crate::image::{self, Which};
use crate::image_test::builders::{module_check, target_for};
use crate::image_test::container::Container;
use crate::image_test::{IMAGE_STUB_VERSION, scratch};

/// The scenarios that boot a builder's kernel, by name, with the builder's compiler family.
pub const BUILDER_KERNEL_SCENARIOS: &[(&str, u8)] = &[("trixie-kernel", 14)];

/// The compiler family whose kernel `scenario` boots, if it boots one.
pub fn family_of(scenario: &str) -> Option<u8> {
    BUILDER_KERNEL_SCENARIOS
        .iter()
        .find(|(name, _)| *name == scenario)
        .map(|(_, gcc)| *gcc)
}

/// A builder's kernel, ready to boot, and the module its image built.
#[derive(Debug)]
pub struct BuilderKernel {
    /// The kernel (no 9p modules).
    pub kernel: Kernel,
    /// The image-built stub module, for `/image-ko/tenstorrent.ko`.
    pub ko: PathBuf,
    /// Variables for the guest.
    pub guest_env: Vec<(String, String)>,
}

/// Fetches the gcc `gcc` builder's kernel and builds the stub module with that builder image.
pub fn prepare(root: &Path, cache: &Path, gcc: u8) -> Result<BuilderKernel> {
    let pinned = PinnedKernel::of_builder(gcc)?;
    let release = pinned.release();
    let vmlinuz = pinned.dir.join(format!("vmlinuz-{release}"));
    if !vmlinuz.is_file() {
        unpack_vmlinuz(&pinned.image_deb()?, &release, &vmlinuz)?;
    }
    let built = image::build(Which::Builder(gcc), None)?;
    let storage = image::image_dir(root)?.join("buildah");
    let ctr = Container::from_archive(&storage, &built.archive.path)?;
    let target = target_for(gcc)?;
    let dir = scratch(&cache.join("builder-kernel"), &format!("gcc{gcc}"))?;
    let ko = module_check(root, &dir, &ctr, &target, gcc)?;
    Ok(BuilderKernel {
        kernel: Kernel {
            release: release.clone(),
            vmlinuz,
            ninep_modules: Vec::new(),
        },
        ko,
        guest_env: vec![
            ("TTDP_VM_IMAGE_KO_VERSION".into(), IMAGE_STUB_VERSION.into()),
            ("TTDP_VM_BUILDER_GCC".into(), gcc.to_string()),
            ("TTDP_VM_BUILDER_RELEASE".into(), release),
        ],
    })
}

/// `dpkg-deb --fsys-tarfile DEB | tar -xO ./boot/vmlinuz-<release> > vmlinuz`.
fn unpack_vmlinuz(deb: &Path, release: &str, vmlinuz: &Path) -> Result<()> {
    let mut unpack = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("running dpkg-deb")?;
    let tar_input = unpack.stdout.take().context("dpkg-deb has no stdout")?;
    let partial = vmlinuz.with_extension("partial");
    let out = std::fs::File::create(&partial)?;
    let tar = Command::new("tar")
        .args(["-xOf", "-"])
        .arg(format!("./boot/vmlinuz-{release}"))
        .stdin(tar_input)
        .stdout(out)
        .status()
        .context("running tar")?;
    let dpkg = unpack.wait().context("waiting for dpkg-deb")?;
    if !tar.success() || !dpkg.success() {
        bail!("no boot/vmlinuz-{release} in {}", deb.display());
    }
    std::fs::rename(&partial, vmlinuz)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::SCENARIOS;

    #[test]
    fn every_builder_kernel_scenario_exists_and_boots_a_served_family() {
        for (name, gcc) in BUILDER_KERNEL_SCENARIOS {
            assert!(SCENARIOS.iter().any(|s| s.name == *name), "{name}");
            assert!(crate::image::pins::FAMILIES.contains(gcc));
        }
        assert_eq!(family_of("trixie-kernel"), Some(14));
        assert_eq!(family_of("kmod"), None);
    }
}
