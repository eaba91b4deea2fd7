//! Host facts for kernel-module installers: kernel release, headers, DKMS install, PCI devices.
//!
//! What it is for: reading, under a [`HostRoot`] (`/host` in a pod, a temporary directory in
//! tests, `/` on a bare host), the facts a tt-kmd installer needs before it touches a node:
//!
//! - the running kernel release and the compiler it was built with ([`kernel_release`],
//!   [`kernel_compiler`], its [`CompilerFamily`]), and the kernel's build tree ([`build_tree`]);
//! - every kernel installed on the host, the running one and those it may boot next
//!   ([`installed_kernels`]);
//! - whether the host manages tt-kmd itself through DKMS ([`detect_host_install`], the spec's
//!   "Mixed mode" signals);
//! - the Tenstorrent PCI devices ([`tenstorrent_devices`]), the driver bound to each and the
//!   character devices it registered ([`device_bindings`]);
//! - whether an unsigned module can load ([`signing_facts`]);
//! - all of it at once: [`HostFacts::probe`].
//!
//! What it must not do: change the host in any way (it only reads), read the container's own
//! `/proc` or call `uname` (always the host root), or depend on Kubernetes or an async runtime.
//!
//! ```no_run
//! use ttdp_hostprobe::{HostFacts, HostRoot};
//! let facts = HostFacts::probe(&HostRoot::new("/host"))?;
//! if facts.host_install.is_host_managed() {
//!     println!("host-managed tt-kmd on kernel {}", facts.kernel_release);
//! }
//! # Ok::<(), ttdp_hostprobe::ProbeError>(())
//! ```
#![deny(missing_docs)]

mod binding;
mod dkms;
mod error;
mod facts;
mod host_root;
mod installed_kernels;
mod kernel;
mod pci;
mod signing;

pub use binding::{CharDevice, DeviceBinding, TENSTORRENT_DRIVER, device_bindings};
pub use dkms::{DKMS_SOURCE_PARENT, DKMS_STATE_DIR, DkmsSignal, HostInstall, detect_host_install};
pub use error::ProbeError;
pub use facts::HostFacts;
pub use host_root::HostRoot;
pub use installed_kernels::{
    BOOT_DIR, InstalledKernel, MODULES_DIR, installed_kernels, is_release_name,
};
pub use kernel::{
    BuildTree, CompilerFamily, KernelCompiler, OSRELEASE_PATH, PROC_VERSION_PATH, build_tree,
    build_tree_compiler, kernel_compiler, kernel_release,
};
pub use pci::{PCI_DEVICES_DIR, PciDevice, TENSTORRENT_VENDOR_ID, tenstorrent_devices};
pub use signing::{
    KEYS_PATH, KernelKeys, LOCKDOWN_PATH, Lockdown, SIG_ENFORCE_PATH, SigningFacts,
    TRUSTED_KEYRINGS, kernel_keys, signing_facts,
};
