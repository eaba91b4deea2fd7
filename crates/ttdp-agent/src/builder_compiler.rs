//! [`BuilderCompiler`]: whether this agent's image may build modules for the node's kernel.
//!
//! kbuild wants modules built by the compiler (and major version) that built the kernel: a
//! module built by another GCC may not load, or may load with mismatched structure layouts.
//! Builder images say which GCC they carry (`TTDP_BUILDER_GCC`); the kernel says which built it
//! (`/proc/version`). When both are known and differ, the agent builds nothing and says why;
//! the controller then runs the node's agent from its family's image. Prebuilt modules need no
//! compiler, so they are still downloaded, but a missing one is not built.

use ttdp_hostprobe::CompilerFamily;

/// The kernel's compiler family and the GCC major version of this agent's image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuilderCompiler {
    /// Which compiler built the running kernel.
    pub kernel: CompilerFamily,
    /// The GCC major version of this image (`TTDP_BUILDER_GCC`), `None` when it does not say.
    pub image_gcc: Option<u32>,
}

impl BuilderCompiler {
    /// Why this image must not build for this kernel, `None` when it may (the families match,
    /// or the image does not declare its compiler, as custom images may not).
    pub fn mismatch(&self) -> Option<String> {
        let image = self.image_gcc?;
        if self.kernel.gcc_major() == Some(image) {
            return None;
        }
        let what_to_do = match self.kernel {
            CompilerFamily::Gcc(major) => format!(
                "the node waits for its agent to run the gcc {major} builder image (driver.builderImages[\"{major}\"] in the chart)"
            ),
            CompilerFamily::Clang(_) | CompilerFamily::Unknown => {
                "no builder image serves this kernel".to_owned()
            }
        };
        Some(format!(
            "the kernel was built by {} and this agent image builds with gcc {image}, so nothing is built; {what_to_do}; or set spec.installer.image to an image with the kernel's compiler, or use spec.source.prebuilt",
            self.kernel
        ))
    }
}

/// Why this agent's image (GCC `image_gcc`, `None` when it does not say) must not build ahead
/// of the reboot for the installed kernel `release` built by `kernel` (`None`: not known, as
/// for a kernel older than 5.8): `None` when it may. Unlike the running kernel's, a next
/// kernel's unknown compiler is no mismatch: it is built as before, and a build that fails says
/// why.
pub fn next_kernel_mismatch(
    release: &str,
    kernel: Option<CompilerFamily>,
    image_gcc: Option<u32>,
) -> Option<String> {
    let (kernel, image) = (kernel?, image_gcc?);
    if kernel == CompilerFamily::Unknown || kernel.gcc_major() == Some(image) {
        return None;
    }
    let at_boot = match kernel {
        CompilerFamily::Gcc(major) => format!(
            "after a boot into it the node's agent runs the gcc {major} builder image (driver.builderImages[\"{major}\"] in the chart) and builds it then, while the node waits"
        ),
        CompilerFamily::Clang(_) | CompilerFamily::Unknown => {
            "no builder image serves this kernel".to_owned()
        }
    };
    Some(format!(
        "kernel {release} was built by {kernel} and this agent image builds with gcc {image} (the running kernel's), so its module is not built before the reboot; {at_boot}; or use spec.source.prebuilt to have it ready"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_declared_other_compiler_is_a_mismatch() {
        let check = |kernel, image_gcc| BuilderCompiler { kernel, image_gcc }.mismatch();
        assert_eq!(check(CompilerFamily::Gcc(13), Some(13)), None);
        assert_eq!(check(CompilerFamily::Gcc(13), None), None);
        assert_eq!(check(CompilerFamily::Unknown, None), None);
        let other = check(CompilerFamily::Gcc(13), Some(12)).unwrap();
        assert!(
            other.contains("gcc-13") && other.contains("gcc 12") && other.contains("\"13\""),
            "{other}"
        );
        let clang = check(CompilerFamily::Clang(18), Some(12)).unwrap();
        assert!(
            clang.contains("clang-18") && clang.contains("no builder image"),
            "{clang}"
        );
        assert!(check(CompilerFamily::Unknown, Some(12)).is_some());
    }

    #[test]
    fn a_next_kernel_mismatches_only_for_a_known_other_compiler() {
        let release = "6.1.0-58-amd64";
        let gcc = |major| Some(CompilerFamily::Gcc(major));
        assert_eq!(next_kernel_mismatch(release, gcc(12), Some(12)), None);
        assert_eq!(next_kernel_mismatch(release, gcc(13), None), None);
        assert_eq!(next_kernel_mismatch(release, None, Some(12)), None);
        let unknown = Some(CompilerFamily::Unknown);
        assert_eq!(next_kernel_mismatch(release, unknown, Some(12)), None);
        let other = next_kernel_mismatch(release, gcc(13), Some(12)).unwrap();
        assert!(
            other.contains(release)
                && other.contains("gcc-13")
                && other.contains("gcc 12")
                && other.contains("\"13\""),
            "{other}"
        );
    }
}
