//! tt-kmd's release version and how the kernel reads module-parameter values: plain values and
//! pure functions, no I/O.
//!
//! What it is for: the facts about the tt-kmd module that the controller and the node side both
//! need, in one place neither has to link the other for:
//!
//! - [`KmdVersion`]: a tt-kmd release version (`MAJOR.MINOR.PATCH`), checked once where it
//!   enters the program;
//! - [`parameters`]: the `name=value` pairs of a module-parameter string and whether the values
//!   sysfs shows are the wanted ones, the way the kernel reads and prints them back.
//!
//! What it must not do: read or write anything, or depend on Kubernetes, an async runtime or a
//! host library. `ttdp-kmod` (embedded by tools without Kubernetes) and `ttdp-controller` (which
//! must not link the host code) both depend on it, so it stays this small.
#![deny(missing_docs)]

pub mod parameters;
mod version;

pub use version::{InvalidVersion, KmdVersion, RELEASE_TAG_PREFIX};

/// The README's example, compiled as a doctest so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;
