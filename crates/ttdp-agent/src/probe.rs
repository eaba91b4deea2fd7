//! The readiness probe (`ttdp-agent probe`): re-derives readiness from the host alone, without
//! the running agent and without any API call, so it is fast and works when the API is down.
//!
//! Ready when the host manages the driver (DKMS signals), or when `/sys/module/tenstorrent` is
//! live and reports exactly the target version.

use ttdp_api::names::MODULE_NAME;
use ttdp_hostprobe::{HostRoot, detect_host_install};
use ttdp_kmod::KmdVersion;

/// The probe's answer, with a one-line reason for the kubelet's probe message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The pod is ready.
    Ready(String),
    /// The pod is not ready.
    NotReady(String),
}

impl Readiness {
    /// Whether this is [`Readiness::Ready`].
    pub fn is_ready(&self) -> bool {
        matches!(self, Self::Ready(_))
    }

    /// The reason text.
    pub fn reason(&self) -> &str {
        match self {
            Self::Ready(r) | Self::NotReady(r) => r,
        }
    }
}

/// Whether the node is ready for `target_version`, read from the host under `host`.
pub fn readiness(host: &HostRoot, target_version: &KmdVersion) -> Readiness {
    match detect_host_install(host) {
        Ok(install) if install.is_host_managed() => {
            return Readiness::Ready(
                "host-managed tt-kmd install (DKMS); not managed by ttdp".into(),
            );
        }
        Ok(_) => {}
        Err(e) => return Readiness::NotReady(format!("cannot check for a DKMS install: {e}")),
    }
    let dir = host.path(format!("/sys/module/{MODULE_NAME}"));
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .map(|t| t.trim().to_string())
    };
    match (read("initstate").as_deref(), read("version")) {
        (None, _) => Readiness::NotReady(format!(
            "module {MODULE_NAME} is not loaded; want {target_version}"
        )),
        (Some("live"), Some(version)) if version == target_version.as_str() => {
            Readiness::Ready(format!("module {MODULE_NAME} {version} is loaded"))
        }
        (Some("live"), version) => Readiness::NotReady(format!(
            "module {MODULE_NAME} {} is loaded; want {target_version}",
            version.as_deref().unwrap_or("(no version)")
        )),
        (Some(state), _) => Readiness::NotReady(format!(
            "module {MODULE_NAME} is {state}; want {target_version} live"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(host: &HostRoot, path: &str, text: &str) {
        let p = host.path(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn ready_only_with_the_target_version_live() {
        let target: KmdVersion = "2.8.0".parse().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let r = readiness(&host, &target);
        assert!(!r.is_ready() && r.reason().contains("not loaded"), "{r:?}");

        write(&host, "/sys/module/tenstorrent/initstate", "live\n");
        write(&host, "/sys/module/tenstorrent/version", "2.7.0\n");
        let r = readiness(&host, &target);
        assert!(
            !r.is_ready() && r.reason().contains("2.7.0 is loaded; want 2.8.0"),
            "{r:?}"
        );

        write(&host, "/sys/module/tenstorrent/version", "2.8.0\n");
        assert!(readiness(&host, &target).is_ready());

        write(&host, "/sys/module/tenstorrent/initstate", "going\n");
        assert!(!readiness(&host, &target).is_ready());
    }

    #[test]
    fn a_host_managed_node_is_always_ready() {
        let target: KmdVersion = "2.8.0".parse().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        write(
            &host,
            "/usr/src/tenstorrent-1.29/dkms.conf",
            "PACKAGE_NAME=tenstorrent\n",
        );
        let r = readiness(&host, &target);
        assert!(r.is_ready() && r.reason().contains("host-managed"), "{r:?}");
    }
}
