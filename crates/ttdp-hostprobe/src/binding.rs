//! [`DeviceBinding`]: what the kernel made of each Tenstorrent PCI function: the driver bound to
//! it (`/sys/bus/pci/devices/<address>/driver`) and the character devices that driver registered
//! for it (`<address>/tenstorrent/tenstorrent!<n>`, whose node is `/dev/tenstorrent/<n>`).
//!
//! tt-kmd names each device `tenstorrent/<ordinal>` in its class `tenstorrent` with the PCI
//! function as parent; sysfs shows the `/` of that name as `!`, devtmpfs creates the node at the
//! name as given.

use std::path::{Path, PathBuf};

use crate::HostRoot;
use crate::error::{ProbeError, list_optional};
use crate::pci::{PciDevice, tenstorrent_devices};

/// The name of tt-kmd's PCI driver, and of its device class.
pub const TENSTORRENT_DRIVER: &str = "tenstorrent";

/// A character device the driver registered for a PCI function.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CharDevice {
    /// The device node as the host sees it, e.g. `/dev/tenstorrent/0`.
    pub path: PathBuf,
    /// Whether the node exists on the host.
    pub present: bool,
}

/// One Tenstorrent PCI function and what the kernel made of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceBinding {
    /// The PCI function.
    pub device: PciDevice,
    /// The driver bound to it (the name its `driver` link points at), `None` when unbound.
    pub driver: Option<String>,
    /// The character devices registered for it in the `tenstorrent` class, sorted.
    pub char_devices: Vec<CharDevice>,
}

impl DeviceBinding {
    /// Whether tt-kmd's driver is bound to the function.
    pub fn bound_to_tenstorrent(&self) -> bool {
        self.driver.as_deref() == Some(TENSTORRENT_DRIVER)
    }

    /// Whether the function has at least one character device and every one of them has its
    /// node on the host.
    pub fn char_devices_present(&self) -> bool {
        !self.char_devices.is_empty() && self.char_devices.iter().all(|c| c.present)
    }
}

/// Every Tenstorrent PCI function (as [`tenstorrent_devices`]) with its driver and character
/// devices, sorted by address. Empty when sysfs has no PCI bus.
pub fn device_bindings(host: &HostRoot) -> Result<Vec<DeviceBinding>, ProbeError> {
    tenstorrent_devices(host)?
        .into_iter()
        .map(|device| {
            let local = host.path(device.sysfs_path());
            Ok(DeviceBinding {
                driver: bound_driver(&local.join("driver"))?,
                char_devices: char_devices(host, &local.join(TENSTORRENT_DRIVER))?,
                device,
            })
        })
        .collect()
}

/// The last component of the `driver` link, `None` when there is no link (no driver bound).
fn bound_driver(link: &Path) -> Result<Option<String>, ProbeError> {
    match std::fs::read_link(link) {
        Ok(target) => Ok(target
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ProbeError::Read {
            path: link.to_path_buf(),
            source,
        }),
    }
}

/// The class devices under `<function>/tenstorrent/` and whether their nodes exist.
fn char_devices(host: &HostRoot, class_dir: &Path) -> Result<Vec<CharDevice>, ProbeError> {
    let names = list_optional(class_dir)?.unwrap_or_default();
    Ok(names
        .into_iter()
        .map(|name| {
            let path = Path::new("/dev").join(name.replace('!', "/"));
            // devtmpfs only ever makes character nodes here; a simulated host writes plain
            // files, so "exists and is not a directory" is the test that holds for both
            let present = std::fs::metadata(host.path(&path)).is_ok_and(|m| !m.is_dir());
            CharDevice { path, present }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PCI_DEVICES_DIR;

    fn write(root: &HostRoot, path: &str, text: &str) {
        let p = root.path(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn add_device(root: &HostRoot, address: &str, driver: Option<&str>, ordinal: Option<u32>) {
        let dir = format!("{PCI_DEVICES_DIR}/{address}");
        write(root, &format!("{dir}/vendor"), "0x1e52\n");
        write(root, &format!("{dir}/device"), "0x401e\n");
        if let Some(driver) = driver {
            std::os::unix::fs::symlink(
                format!("../../../bus/pci/drivers/{driver}"),
                root.path(format!("{dir}/driver")),
            )
            .unwrap();
        }
        if let Some(n) = ordinal {
            write(
                root,
                &format!("{dir}/tenstorrent/tenstorrent!{n}/dev"),
                &format!("240:{n}\n"),
            );
        }
    }

    #[test]
    fn drivers_and_char_devices_are_read_per_function() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        add_device(&root, "0000:01:00.0", Some("tenstorrent"), Some(0));
        add_device(&root, "0000:02:00.0", Some("tenstorrent"), Some(1));
        add_device(&root, "0000:03:00.0", Some("vfio-pci"), None);
        add_device(&root, "0000:04:00.0", None, None);
        write(&root, "/dev/tenstorrent/0", "");

        let found = device_bindings(&root).unwrap();
        let summary: Vec<_> = found
            .iter()
            .map(|b| {
                (
                    b.device.address.as_str(),
                    b.driver.as_deref(),
                    b.bound_to_tenstorrent(),
                    b.char_devices_present(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("0000:01:00.0", Some("tenstorrent"), true, true),
                ("0000:02:00.0", Some("tenstorrent"), true, false),
                ("0000:03:00.0", Some("vfio-pci"), false, false),
                ("0000:04:00.0", None, false, false),
            ]
        );
        assert_eq!(
            found[1].char_devices,
            vec![CharDevice {
                path: PathBuf::from("/dev/tenstorrent/1"),
                present: false
            }]
        );
    }

    #[test]
    fn a_host_without_devices_has_no_bindings() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            device_bindings(&HostRoot::new(dir.path()))
                .unwrap()
                .is_empty()
        );
    }
}
