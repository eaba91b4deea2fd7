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
}
