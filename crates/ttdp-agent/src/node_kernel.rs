//! [`NodeKernel`]: the kernel chosen at startup (`TTDP_KERNEL`): real, or simulated in files
//! under the host root (builds with the `sim` feature only).

use std::io;
use std::path::Path;

use ttdp_hostprobe::HostRoot;
#[cfg(feature = "sim")]
use ttdp_kmod::SimKernel;
use ttdp_kmod::{Kernel, RealKernel};

use crate::config::KernelKind;

/// The real kernel or the file-backed simulated one.
#[derive(Debug, Clone)]
pub enum NodeKernel {
    /// `finit_module` / `delete_module` / `kill` for real.
    Real(RealKernel),
    /// The simulated kernel under the host root.
    #[cfg(feature = "sim")]
    Sim(SimKernel),
}

impl NodeKernel {
    /// The kernel of kind `kind` for the host at `host`.
    pub fn new(kind: KernelKind, host: &HostRoot) -> Self {
        match kind {
            KernelKind::Real => Self::Real(RealKernel::new(host.clone())),
            #[cfg(feature = "sim")]
            KernelKind::Sim => Self::Sim(SimKernel::new(host.clone())),
        }
    }
}

impl Kernel for NodeKernel {
    fn load(&self, ko: &Path, params: &str) -> io::Result<()> {
        match self {
            Self::Real(k) => k.load(ko, params),
            #[cfg(feature = "sim")]
            Self::Sim(k) => k.load(ko, params),
        }
    }

    fn unload(&self, name: &str) -> io::Result<()> {
        match self {
            Self::Real(k) => k.unload(name),
            #[cfg(feature = "sim")]
            Self::Sim(k) => k.unload(name),
        }
    }

    fn kill(&self, pid: i32) -> io::Result<()> {
        match self {
            Self::Real(k) => k.kill(pid),
            #[cfg(feature = "sim")]
            Self::Sim(k) => k.kill(pid),
        }
    }
}
