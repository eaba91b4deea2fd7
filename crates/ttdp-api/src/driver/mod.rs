//! The `driver.tenstorrent.com` API group, one file per version.

pub mod module_settings;
pub mod node_kernels;
pub mod policy_status;
pub mod rollout_guards;
pub mod source_settings;
pub mod v1alpha1;
