//! Tenstorrent PCI devices, from `/sys/bus/pci/devices/*/{vendor,device}`.

use std::path::PathBuf;

use crate::HostRoot;
use crate::error::{ProbeError, list_optional, read_optional};

/// Tenstorrent's PCI vendor id.
pub const TENSTORRENT_VENDOR_ID: u16 = 0x1e52;
/// Host directory listing every PCI function.
pub const PCI_DEVICES_DIR: &str = "/sys/bus/pci/devices";

/// One Tenstorrent PCI function.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PciDevice {
    /// PCI address, e.g. `0000:01:00.0`.
    pub address: String,
    /// Vendor id (always [`TENSTORRENT_VENDOR_ID`] for devices returned by this crate).
    pub vendor: u16,
    /// Device id, e.g. `0x401e`.
    pub device: u16,
}

impl PciDevice {
    /// The chip family for well-known device ids, e.g. `Some("wormhole")` for `0x401e`.
    pub fn family(&self) -> Option<&'static str> {
        match self.device {
            0xfaca => Some("grayskull"),
            0x401e => Some("wormhole"),
            0xb140 => Some("blackhole"),
            _ => None,
        }
    }

    /// The host sysfs directory of this device.
    pub fn sysfs_path(&self) -> PathBuf {
        PathBuf::from(PCI_DEVICES_DIR).join(&self.address)
    }
}

/// Every PCI function whose vendor is Tenstorrent, sorted by address. Empty when sysfs has no PCI bus.
pub fn tenstorrent_devices(host: &HostRoot) -> Result<Vec<PciDevice>, ProbeError> {
    let dir = host.path(PCI_DEVICES_DIR);
    let mut found = Vec::new();
    for address in list_optional(&dir)?.unwrap_or_default() {
        let Some(vendor) = read_id(&dir.join(&address).join("vendor"))? else {
            continue;
        };
        if vendor != TENSTORRENT_VENDOR_ID {
            continue;
        }
        let device = read_id(&dir.join(&address).join("device"))?.unwrap_or(0);
        found.push(PciDevice {
            address,
            vendor,
            device,
        });
    }
    Ok(found)
}

/// Reads a sysfs id file like `0x1e52\n`; `None` when missing or not a hex id.
fn read_id(path: &std::path::Path) -> Result<Option<u16>, ProbeError> {
    Ok(read_optional(path)?.and_then(|text| {
        let text = text.trim();
        u16::from_str_radix(text.strip_prefix("0x").unwrap_or(text), 16).ok()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(root: &HostRoot, address: &str, vendor: &str, device: &str) {
        let dir = root.path(PCI_DEVICES_DIR).join(address);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vendor"), vendor).unwrap();
        std::fs::write(dir.join("device"), device).unwrap();
    }

    #[test]
    fn only_tenstorrent_functions_are_reported_with_ids() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        add(&root, "0000:02:00.0", "0x1e52\n", "0xb140\n");
        add(&root, "0000:00:1f.0", "0x8086\n", "0x7a04\n");
        add(&root, "0000:01:00.0", "0x1e52\n", "0x401e\n");
        let found = tenstorrent_devices(&root).unwrap();
        let summary: Vec<_> = found
            .iter()
            .map(|d| (d.address.as_str(), d.device, d.family()))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("0000:01:00.0", 0x401e, Some("wormhole")),
                ("0000:02:00.0", 0xb140, Some("blackhole"))
            ]
        );
        assert_eq!(
            found[0].sysfs_path(),
            PathBuf::from("/sys/bus/pci/devices/0000:01:00.0")
        );
    }

    #[test]
    fn an_unreadable_pci_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        std::fs::create_dir_all(root.path("/sys/bus/pci")).unwrap();
        std::fs::write(root.path(PCI_DEVICES_DIR), "not a directory").unwrap();
        let err = tenstorrent_devices(&root).unwrap_err();
        assert!(matches!(err, ProbeError::Read { .. }), "{err}");
    }

    #[test]
    fn no_pci_bus_means_no_devices() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            tenstorrent_devices(&HostRoot::new(dir.path()))
                .unwrap()
                .is_empty()
        );
    }
}
