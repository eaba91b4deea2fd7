//! The `driver.tenstorrent.com` API group, one file per version.

pub mod rollout_guards;
pub mod v1alpha1;
