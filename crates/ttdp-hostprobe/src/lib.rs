//! Host facts for kernel-module installers: kernel release, headers, DKMS install, PCI devices.
//!
//! Not yet implemented: this crate is a placeholder until its issue lands.
#![deny(missing_docs)]
