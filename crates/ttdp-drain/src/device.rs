//! [`DevicePredicate`]: which pods use a host device, for a drain restricted to device users.

use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

/// Recognises pods that use a host device, configured by the caller.
///
/// A pod uses the device when any of these holds:
/// - it has a `hostPath` volume at or under one of [`host_path_prefixes`](Self::host_path_prefixes)
///   (e.g. `/dev/foo` or `/dev/foo/0` for the prefix `/dev/foo`);
/// - a privileged container mounts a `hostPath` volume that *contains* a prefix (e.g. `/dev` or
///   `/` for the prefix `/dev/foo`): a privileged container sees every device node below it;
/// - a regular or init container requests or limits a resource whose name starts
///   with one of [`resource_prefixes`](Self::resource_prefixes) (e.g. `example.com/`).
///
/// Paths are compared component by component (`/dev/foobar` is not under `/dev/foo`); `..` is
/// not resolved. The predicate cannot see devices a container runtime adds on its own (e.g. a
/// privileged container without any `hostPath`): catching those is what a full-node pass is for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevicePredicate {
    /// Device directories or files on the host, e.g. `/dev/tenstorrent`.
    pub host_path_prefixes: Vec<String>,
    /// Prefixes of extended resource names, e.g. `tenstorrent.com/`.
    pub resource_prefixes: Vec<String>,
}

impl DevicePredicate {
    /// Whether `pod` uses the device.
    pub fn matches(&self, pod: &Pod) -> bool {
        let Some(spec) = &pod.spec else {
            return false;
        };
        self.uses_host_path(spec) || self.requests_resource(spec)
    }

    fn uses_host_path(&self, spec: &PodSpec) -> bool {
        let prefixes: Vec<&Path> = self.host_path_prefixes.iter().map(Path::new).collect();
        for volume in spec.volumes.iter().flatten() {
            let Some(host_path) = &volume.host_path else {
                continue;
            };
            let path = Path::new(&host_path.path);
            if prefixes.iter().any(|prefix| path.starts_with(prefix)) {
                return true;
            }
            let contains_device = prefixes.iter().any(|prefix| prefix.starts_with(path));
            if contains_device && privileged_mounts(spec).any(|name| name == volume.name) {
                return true;
            }
        }
        false
    }

    fn requests_resource(&self, spec: &PodSpec) -> bool {
        let matches = |name: &String| {
            self.resource_prefixes
                .iter()
                .any(|prefix| name.starts_with(prefix.as_str()))
        };
        containers(spec).any(|c| {
            let Some(resources) = &c.resources else {
                return false;
            };
            let requests = resources.requests.iter().flat_map(|r| r.keys());
            let limits = resources.limits.iter().flat_map(|l| l.keys());
            requests.chain(limits).any(matches)
        })
    }
}

/// The regular and init containers of a pod (ephemeral containers have a different type and
/// cannot request resources or be privileged beyond their pod).
fn containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
}

/// Names of the volumes mounted by privileged containers.
fn privileged_mounts(spec: &PodSpec) -> impl Iterator<Item = &str> {
    let privileged = |c: &&Container| {
        c.security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
    };
    let regular = containers(spec)
        .filter(privileged)
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| m.name.as_str());
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .filter(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        })
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| m.name.as_str());
    regular.chain(ephemeral)
}
