//! The part of a node's simulated kernel the simulated kubelet uses: workload processes opening
//! and closing `/dev/tenstorrent`, and finding out whether the host killed them.

use std::fmt::Debug;
use std::io;

use k8s_openapi::api::core::v1::Pod;
use ttdp_kmod::{DEVICE_DIR, SimKernel};

/// Prefix of the extended resources that give a pod Tenstorrent devices.
pub const DEVICE_RESOURCE_PREFIX: &str = "tenstorrent.com/";

/// A node's simulated kernel as workload containers see it: their processes opening and closing
/// the device, and whether the host killed them. (The agent's kernel, which loads and unloads the
/// module, is `ttdp_kmod::Kernel`.)
pub trait WorkloadKernel: Send + Sync + Debug {
    /// Simulated process `pid` (command `comm`) opens the device; fails when the module is not loaded.
    fn open_device(&self, pid: i32, comm: &str) -> io::Result<()>;
    /// Simulated process `pid` closes the device and exits.
    fn exit_process(&self, pid: i32) -> io::Result<()>;
    /// Whether simulated process `pid` still exists (the host may have killed it).
    fn process_alive(&self, pid: i32) -> bool;
}

impl WorkloadKernel for SimKernel {
    fn open_device(&self, pid: i32, comm: &str) -> io::Result<()> {
        self.hold(pid, comm)
    }

    fn exit_process(&self, pid: i32) -> io::Result<()> {
        match self.release(pid) {
            Ok(()) => {}
            Err(err) if err.raw_os_error() == Some(nix::errno::Errno::ESRCH as i32) => {}
            Err(err) => return Err(err),
        }
        match std::fs::remove_dir_all(self.host().path(format!("/proc/{pid}"))) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ => Ok(()),
        }
    }

    fn process_alive(&self, pid: i32) -> bool {
        self.host().path(format!("/proc/{pid}")).exists()
    }
}

/// Whether a pod uses the Tenstorrent device: a `hostPath` volume at or under `/dev/tenstorrent`,
/// or a `tenstorrent.com/*` resource request or limit on any container.
pub fn pod_uses_device(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let host_path = spec
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.host_path.as_ref())
        .any(|h| h.path == DEVICE_DIR || h.path.starts_with(&format!("{DEVICE_DIR}/")));
    let resource = spec.containers.iter().any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            [r.requests.as_ref(), r.limits.as_ref()]
                .into_iter()
                .flatten()
                .any(|m| m.keys().any(|k| k.starts_with(DEVICE_RESOURCE_PREFIX)))
        })
    });
    host_path || resource
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, HostPathVolumeSource, PodSpec, ResourceRequirements, Volume,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn pod(volumes: Vec<&str>, resource: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                volumes: Some(
                    volumes
                        .into_iter()
                        .map(|p| Volume {
                            name: "v".to_owned(),
                            host_path: Some(HostPathVolumeSource {
                                path: p.to_owned(),
                                type_: None,
                            }),
                            ..Volume::default()
                        })
                        .collect(),
                ),
                containers: vec![Container {
                    resources: resource.map(|r| ResourceRequirements {
                        limits: Some(BTreeMap::from([(r.to_owned(), Quantity("1".to_owned()))])),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn device_use_is_a_host_path_or_a_resource() {
        assert!(pod_uses_device(&pod(vec!["/dev/tenstorrent"], None)));
        assert!(pod_uses_device(&pod(vec!["/dev/tenstorrent/0"], None)));
        assert!(!pod_uses_device(&pod(
            vec!["/dev/tenstorrentx", "/dev"],
            None
        )));
        assert!(pod_uses_device(&pod(vec![], Some("tenstorrent.com/n300"))));
        assert!(!pod_uses_device(&pod(vec![], Some("nvidia.com/gpu"))));
    }
}
