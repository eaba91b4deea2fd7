//! [`HostFacts`]: every host fact in one probe.

use crate::dkms::{HostInstall, detect_host_install};
use crate::kernel::{BuildTree, KernelCompiler, build_tree, kernel_compiler, kernel_release};
use crate::pci::{PciDevice, tenstorrent_devices};
use crate::signing::{SigningFacts, signing_facts};
use crate::{HostRoot, ProbeError};

/// Everything a tt-kmd installer needs to know about a host before touching it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostFacts {
    /// The running kernel release, e.g. `6.8.0-111-generic`.
    pub kernel_release: String,
    /// The compiler the kernel was built with, when `/proc/version` names one.
    pub kernel_compiler: Option<KernelCompiler>,
    /// The kernel's build tree for out-of-tree modules.
    pub build_tree: BuildTree,
    /// DKMS signals: when any is present the host manages tt-kmd itself.
    pub host_install: HostInstall,
    /// Tenstorrent PCI functions.
    pub devices: Vec<PciDevice>,
    /// Module signing and lockdown.
    pub signing: SigningFacts,
}

impl HostFacts {
    /// Reads every fact under `host`. Only a missing kernel release or an unreadable file is an
    /// error; missing headers, devices or DKMS state are facts.
    pub fn probe(host: &HostRoot) -> Result<Self, ProbeError> {
        let kernel_release = kernel_release(host)?;
        Ok(Self {
            kernel_compiler: kernel_compiler(host)?,
            build_tree: build_tree(host, &kernel_release),
            host_install: detect_host_install(host)?,
            devices: tenstorrent_devices(host)?,
            signing: signing_facts(host)?,
            kernel_release,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_collects_every_fact() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        let files = [
            ("/proc/sys/kernel/osrelease", "6.8.0-sim\n"),
            (
                "/proc/version",
                "Linux version 6.8.0-sim (sim@sim) (cc (GCC) 12.2.0, GNU ld 2.40) #1 SMP\n",
            ),
            ("/lib/modules/6.8.0-sim/build/Makefile", "modules:\n"),
            ("/sys/bus/pci/devices/0000:01:00.0/vendor", "0x1e52\n"),
            ("/sys/bus/pci/devices/0000:01:00.0/device", "0x401e\n"),
        ];
        for (path, text) in files {
            let p = root.path(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let facts = HostFacts::probe(&root).unwrap();
        assert_eq!(facts.kernel_release, "6.8.0-sim");
        assert_eq!(
            facts.kernel_compiler.as_ref().map(|c| c.command.as_str()),
            Some("cc")
        );
        assert!(facts.build_tree.usable_dir().is_some());
        assert!(!facts.host_install.is_host_managed());
        assert_eq!(facts.devices.len(), 1);
        assert!(facts.signing.unsigned_modules_load());
        let json = serde_json::to_value(&facts).unwrap();
        assert_eq!(json["kernelRelease"], "6.8.0-sim");
        assert_eq!(json["buildTree"]["hasMakefile"], true);
        assert_eq!(json["signing"]["sigEnforce"], serde_json::Value::Null);
        assert_eq!(json["devices"][0]["address"], "0000:01:00.0");
    }

    #[test]
    fn probe_fails_without_a_kernel_release() {
        let dir = tempfile::tempdir().unwrap();
        let err = HostFacts::probe(&HostRoot::new(dir.path())).unwrap_err();
        assert!(matches!(err, ProbeError::NoKernelRelease { .. }));
    }
}
