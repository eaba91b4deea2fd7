//! The `driver.tenstorrent.com` API group, one file per version.

pub mod v1alpha1;
