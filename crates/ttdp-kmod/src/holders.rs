//! [`DeviceHolder`]: processes holding the module's device nodes open, found by walking
//! `/proc/*/fd` under the host root.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use procfs::FromRead;
use ttdp_hostprobe::HostRoot;

/// A process with at least one open file descriptor on the device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceHolder {
    /// Host process id.
    pub pid: i32,
    /// Command name (`/proc/<pid>/comm`).
    pub comm: String,
    /// The device paths it holds open (one entry per open descriptor).
    pub paths: Vec<PathBuf>,
}

/// Every process under `host` holding a file at or under `device_dir` (e.g. `/dev/tenstorrent`),
/// sorted by pid.
///
/// A descriptor counts when its link target is at or under `device_dir`, or, for targets under
/// `/dev`, when it is a character device whose major number is the one `/proc/devices` lists for
/// `chrdev_name` (this catches containers that see the device under another path). Processes that
/// vanish or cannot be read during the walk are skipped.
pub fn find_device_holders(
    host: &HostRoot,
    device_dir: &Path,
    chrdev_name: &str,
) -> Vec<DeviceHolder> {
    let proc_dir = host.path("/proc");
    let major = chrdev_major(host, chrdev_name);
    let Ok(entries) = std::fs::read_dir(&proc_dir) else {
        return Vec::new();
    };
    let mut holders: Vec<DeviceHolder> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let paths = held_paths(&proc_dir.join(pid.to_string()), device_dir, major);
            if paths.is_empty() {
                return None;
            }
            let comm = std::fs::read_to_string(proc_dir.join(pid.to_string()).join("comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default();
            Some(DeviceHolder { pid, comm, paths })
        })
        .collect();
    holders.sort_by_key(|h| h.pid);
    holders
}

/// The device paths one process holds, in fd order.
fn held_paths(process_dir: &Path, device_dir: &Path, major: Option<u64>) -> Vec<PathBuf> {
    let Ok(fds) = std::fs::read_dir(process_dir.join("fd")) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, PathBuf)> = fds
        .filter_map(Result::ok)
        .filter_map(|fd| {
            let number = fd.file_name().to_str()?.parse::<u64>().ok()?;
            let target = std::fs::read_link(fd.path()).ok()?;
            let holds = target.starts_with(device_dir)
                || (target.starts_with("/dev")
                    && major.is_some_and(|m| is_char_device_of(&fd.path(), m)));
            holds.then_some((number, target))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, target)| target).collect()
}

/// Whether the file behind an fd link is a character device with major number `major`.
fn is_char_device_of(fd_link: &Path, major: u64) -> bool {
    std::fs::metadata(fd_link)
        .is_ok_and(|m| m.file_type().is_char_device() && nix::sys::stat::major(m.rdev()) == major)
}

/// The character-device major number registered under `name` in the host's `/proc/devices`.
pub fn chrdev_major(host: &HostRoot, name: &str) -> Option<u64> {
    let devices = procfs::Devices::from_file(host.path("/proc/devices")).ok()?;
    devices
        .char_devices
        .iter()
        .find(|d| d.name == name)
        .map(|d| u64::from(d.major))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(root: &HostRoot, pid: i32, comm: &str, fds: &[(u32, &str)]) {
        let dir = root.path(format!("/proc/{pid}"));
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
        for (n, target) in fds {
            std::os::unix::fs::symlink(target, dir.join("fd").join(n.to_string())).unwrap();
        }
    }

    #[test]
    fn holders_are_processes_with_fds_under_the_device_dir() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        process(
            &root,
            300,
            "python3",
            &[
                (0, "/dev/null"),
                (7, "/dev/tenstorrent/1"),
                (5, "/dev/tenstorrent/0"),
            ],
        );
        process(&root, 20, "tt-smi", &[(3, "/dev/tenstorrent")]);
        process(
            &root,
            40,
            "bash",
            &[
                (0, "/dev/pts/0"),
                (1, "/dev/tenstorrentx"),
                (2, "socket:[1234]"),
            ],
        );
        std::fs::create_dir_all(root.path("/proc/sys/kernel")).unwrap();
        std::fs::write(root.path("/proc/self"), "not a pid").unwrap();
        let found = find_device_holders(&root, Path::new("/dev/tenstorrent"), "tenstorrent");
        assert_eq!(
            found,
            vec![
                DeviceHolder {
                    pid: 20,
                    comm: "tt-smi".into(),
                    paths: vec!["/dev/tenstorrent".into()]
                },
                DeviceHolder {
                    pid: 300,
                    comm: "python3".into(),
                    paths: vec!["/dev/tenstorrent/0".into(), "/dev/tenstorrent/1".into()]
                },
            ]
        );
    }

    #[test]
    fn no_proc_means_no_holders() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            find_device_holders(
                &HostRoot::new(dir.path()),
                Path::new("/dev/tenstorrent"),
                "tenstorrent"
            )
            .is_empty()
        );
    }

    #[test]
    fn chrdev_major_comes_from_proc_devices() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        std::fs::create_dir_all(root.path("/proc")).unwrap();
        std::fs::write(
            root.path("/proc/devices"),
            "Character devices:\n  1 mem\n240 tenstorrent\n\nBlock devices:\n  8 sd\n",
        )
        .unwrap();
        assert_eq!(chrdev_major(&root, "tenstorrent"), Some(240));
        assert_eq!(chrdev_major(&root, "nvidia"), None);
    }

    #[test]
    fn a_real_character_device_is_matched_by_major_number() {
        // /dev/null is char 1:3 on every Linux machine: pretend "mem" (major 1) is our driver.
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        let me = std::process::id();
        std::fs::create_dir_all(root.path("/proc")).unwrap();
        std::fs::write(root.path("/proc/devices"), "Character devices:\n  1 mem\n").unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let fd_dir = root.path(format!("/proc/{me}/fd"));
        std::fs::create_dir_all(&fd_dir).unwrap();
        // the link's target is the real /dev/null, so metadata() sees the real device
        std::os::unix::fs::symlink("/dev/null", fd_dir.join("9")).unwrap();
        let found = find_device_holders(&root, Path::new("/dev/tenstorrent"), "mem");
        drop(null);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].paths, vec![PathBuf::from("/dev/null")]);
    }
}
