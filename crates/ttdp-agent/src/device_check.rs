//! [`DeviceVerdict`]: whether tt-kmd sees the node's cards, from the host probe's
//! [`DeviceBinding`]s. Pure: facts in, verdict and message out.
//!
//! A card works when its PCI function is bound to the `tenstorrent` driver and the character
//! device the driver registered for it has its node under `/dev/tenstorrent/`. A node without
//! Tenstorrent PCI functions passes, and says so.

use ttdp_hostprobe::{DeviceBinding, TENSTORRENT_DRIVER, TENSTORRENT_VENDOR_ID};

/// What the device check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceVerdict {
    /// Tenstorrent PCI functions on the node.
    pub devices: usize,
    /// Of those, bound to the `tenstorrent` driver.
    pub bound: usize,
    /// Of the bound ones, with every character device node present.
    pub with_node: usize,
    /// One entry per function that does not work, e.g. `0000:03:00.0 is bound to vfio-pci`.
    pub problems: Vec<String>,
}

impl DeviceVerdict {
    /// The verdict for `bindings`.
    pub fn of(bindings: &[DeviceBinding]) -> Self {
        let mut verdict = Self {
            devices: bindings.len(),
            bound: 0,
            with_node: 0,
            problems: Vec::new(),
        };
        for binding in bindings {
            let address = &binding.device.address;
            if !binding.bound_to_tenstorrent() {
                verdict.problems.push(match &binding.driver {
                    Some(other) => format!("{address} is bound to {other}"),
                    None => format!("{address} is bound to no driver"),
                });
                continue;
            }
            verdict.bound += 1;
            let missing: Vec<String> = binding
                .char_devices
                .iter()
                .filter(|c| !c.present)
                .map(|c| c.path.display().to_string())
                .collect();
            if binding.char_devices.is_empty() {
                verdict.problems.push(format!(
                    "{address} has no character device registered by {TENSTORRENT_DRIVER}"
                ));
            } else if !missing.is_empty() {
                verdict
                    .problems
                    .push(format!("{address}: {} missing", missing.join(", ")));
            } else {
                verdict.with_node += 1;
            }
        }
        verdict
    }

    /// Whether every card works (trivially when there are none).
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }

    /// One line for the report, an Event and the readiness probe.
    pub fn message(&self) -> String {
        if self.devices == 0 {
            return format!(
                "no Tenstorrent PCI device (vendor {TENSTORRENT_VENDOR_ID:04x}) on this node: no device to validate"
            );
        }
        let bound = format!(
            "{} of {} devices bound to {TENSTORRENT_DRIVER}",
            self.bound, self.devices
        );
        if self.passed() {
            return format!("{bound}, each with its /dev/tenstorrent node");
        }
        let nodes = if self.with_node < self.bound {
            format!(
                ", {} of {} bound with their /dev/tenstorrent node",
                self.with_node, self.bound
            )
        } else {
            String::new()
        };
        format!("{bound}{nodes} ({})", self.problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use ttdp_hostprobe::{CharDevice, PciDevice};

    use super::*;

    fn binding(address: &str, driver: Option<&str>, nodes: &[(u32, bool)]) -> DeviceBinding {
        DeviceBinding {
            device: PciDevice {
                address: address.into(),
                vendor: TENSTORRENT_VENDOR_ID,
                device: 0x401e,
            },
            driver: driver.map(str::to_string),
            char_devices: nodes
                .iter()
                .map(|(n, present)| CharDevice {
                    path: PathBuf::from(format!("/dev/tenstorrent/{n}")),
                    present: *present,
                })
                .collect(),
        }
    }

    #[test]
    fn a_node_without_cards_passes_and_says_so() {
        let verdict = DeviceVerdict::of(&[]);
        assert!(verdict.passed());
        assert!(
            verdict
                .message()
                .starts_with("no Tenstorrent PCI device (vendor 1e52) on this node"),
            "{}",
            verdict.message()
        );
    }

    #[test]
    fn one_working_card_passes() {
        let verdict =
            DeviceVerdict::of(&[binding("0000:01:00.0", Some("tenstorrent"), &[(0, true)])]);
        assert!(verdict.passed());
        assert_eq!(
            verdict.message(),
            "1 of 1 devices bound to tenstorrent, each with its /dev/tenstorrent node"
        );
    }

    #[test]
    fn one_unbound_card_fails() {
        let verdict = DeviceVerdict::of(&[binding("0000:01:00.0", None, &[])]);
        assert!(!verdict.passed());
        assert_eq!(
            verdict.message(),
            "0 of 1 devices bound to tenstorrent (0000:01:00.0 is bound to no driver)"
        );
    }

    #[test]
    fn several_cards_name_each_one_that_does_not_work() {
        let verdict = DeviceVerdict::of(&[
            binding("0000:01:00.0", Some("tenstorrent"), &[(0, true)]),
            binding("0000:02:00.0", Some("tenstorrent"), &[(1, false)]),
            binding("0000:03:00.0", Some("vfio-pci"), &[]),
            binding("0000:04:00.0", None, &[]),
        ]);
        assert!(!verdict.passed());
        assert_eq!(
            (verdict.devices, verdict.bound, verdict.with_node),
            (4, 2, 1)
        );
        assert_eq!(
            verdict.message(),
            "2 of 4 devices bound to tenstorrent, 1 of 2 bound with their /dev/tenstorrent node \
             (0000:02:00.0: /dev/tenstorrent/1 missing; 0000:03:00.0 is bound to vfio-pci; \
             0000:04:00.0 is bound to no driver)"
        );
    }

    #[test]
    fn a_bound_card_without_a_registered_char_device_fails() {
        let verdict = DeviceVerdict::of(&[binding("0000:01:00.0", Some("tenstorrent"), &[])]);
        assert!(!verdict.passed());
        assert!(
            verdict
                .message()
                .contains("0000:01:00.0 has no character device registered by tenstorrent"),
            "{}",
            verdict.message()
        );
    }
}
