//! [`SimKernel`]: a simulated kernel kept in files under a host root, so several processes (an
//! agent, a test harness playing workloads, a demo) share one simulated machine.
//!
//! State, all under the host root:
//! - a loaded module is `/sys/module/<name>/{version,srcversion,refcnt,initstate}` plus
//!   `holders/` and `parameters/<key>`; each simulated Tenstorrent PCI function bound to it
//!   (`driver` link, class device `tenstorrent/tenstorrent!<n>`) with its node
//!   `/dev/tenstorrent/<n>` (a host without such functions still gets `/dev/tenstorrent/0`);
//!   [`SimKernel::limit_binding`] makes a version bind fewer functions;
//! - a process holding the device is `/proc/<pid>/comm` plus `/proc/<pid>/fd/<n>` links to
//!   `/dev/tenstorrent/0`; `refcnt` is the number of such links;
//! - fault injection and the lock live in `/run/ttdp-sim/`.
//!
//! Loading reads the real `.modinfo` of the `.ko` and answers like the kernel: ENOEXEC for a file
//! that is not a module or whose vermagic names another kernel release, EEXIST when the module is
//! loaded, EKEYREJECTED (sig_enforce) or EPERM (lockdown) for an unsigned module when the
//! simulated host enforces signing; unloading answers ENOENT when not loaded and EAGAIN while
//! refcnt > 0.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use ttdp_hostprobe::{HostRoot, kernel_release, signing_facts, tenstorrent_devices};

use crate::file_lock::FileLock;
use crate::holders::find_device_holders;
use crate::kernel::Kernel;
use crate::modinfo::{ModInfo, is_signed};
use crate::{DEVICE_DIR, MODULE_NAME};

/// Host directory holding the simulator's lock and fault-injection markers.
pub const SIM_STATE_DIR: &str = "/run/ttdp-sim";
/// The character-device major the simulated driver registers.
const SIM_MAJOR: u32 = 240;
/// How long a simulated syscall waits for another process's simulated syscall.
const SIM_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// A kernel simulated in files under a host root. Cheap to clone; every clone and every process
/// using the same root sees the same state.
#[derive(Debug, Clone)]
pub struct SimKernel {
    host: HostRoot,
}

impl SimKernel {
    /// The simulated kernel of the host root `host` (created with [`crate::SimHost`]).
    pub fn new(host: HostRoot) -> Self {
        Self { host }
    }

    /// The host root this kernel lives in.
    pub fn host(&self) -> &HostRoot {
        &self.host
    }

    /// Simulates process `pid` (command `comm`) opening `/dev/tenstorrent/0`; each call adds one
    /// open descriptor and raises `refcnt` by one. Fails with ENODEV when the module is not loaded.
    pub fn hold(&self, pid: i32, comm: &str) -> io::Result<()> {
        let _lock = self.lock()?;
        if !self.module_dir(MODULE_NAME).join("initstate").exists() {
            return Err(Errno::ENODEV.into());
        }
        let process = self.host.path(format!("/proc/{pid}"));
        std::fs::create_dir_all(process.join("fd"))?;
        write_atomically(&process.join("comm"), &format!("{comm}\n"))?;
        let mut fd = 3;
        while std::fs::symlink_metadata(process.join("fd").join(fd.to_string())).is_ok() {
            fd += 1;
        }
        std::os::unix::fs::symlink(
            Path::new(DEVICE_DIR).join("0"),
            process.join("fd").join(fd.to_string()),
        )?;
        self.refresh_refcnt()
    }

    /// Simulates process `pid` closing every descriptor it holds on the device (the process lives on).
    pub fn release(&self, pid: i32) -> io::Result<()> {
        let _lock = self.lock()?;
        let fd_dir = self.host.path(format!("/proc/{pid}/fd"));
        let entries = match std::fs::read_dir(&fd_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Errno::ESRCH.into()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if std::fs::read_link(entry.path()).is_ok_and(|t| t.starts_with(DEVICE_DIR)) {
                std::fs::remove_file(entry.path())?;
            }
        }
        self.refresh_refcnt()
    }

    /// Simulates process `pid` exiting: its descriptors close and it disappears. Succeeds when
    /// the process does not exist.
    pub fn exit_process(&self, pid: i32) -> io::Result<()> {
        let _lock = self.lock()?;
        match std::fs::remove_dir_all(self.host.path(format!("/proc/{pid}"))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        self.refresh_refcnt()
    }

    /// Whether simulated process `pid` exists (it may have been killed by force unload).
    pub fn process_alive(&self, pid: i32) -> bool {
        self.host.path(format!("/proc/{pid}")).is_dir()
    }

    /// Makes every later load of `version` fail with ENOEXEC (`fail = true`) or stops doing so.
    pub fn fail_load(&self, version: &str, fail: bool) -> io::Result<()> {
        let marker = self.fail_load_marker(version);
        if fail {
            std::fs::create_dir_all(marker.parent().unwrap_or(Path::new("/")))?;
            std::fs::write(marker, "ENOEXEC\n")
        } else {
            match std::fs::remove_file(marker) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }

    /// Makes every later load of `version` bind only the first `limit` Tenstorrent PCI
    /// functions (a driver that loads but cannot see every card), or all of them (`None`).
    pub fn limit_binding(&self, version: &str, limit: Option<usize>) -> io::Result<()> {
        let marker = self.bind_limit_marker(version);
        match limit {
            Some(limit) => {
                std::fs::create_dir_all(marker.parent().unwrap_or(Path::new("/")))?;
                std::fs::write(marker, format!("{limit}\n"))
            }
            None => match std::fs::remove_file(marker) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        }
    }

    /// Makes every later load show parameter `key` in sysfs as `shown` whatever value was
    /// given (a parameter whose kernel type prints it in another form), or as given (`None`).
    pub fn show_parameter_as(&self, key: &str, shown: Option<&str>) -> io::Result<()> {
        let marker = self.shown_parameter_marker(key);
        match shown {
            Some(shown) => {
                std::fs::create_dir_all(marker.parent().unwrap_or(Path::new("/")))?;
                std::fs::write(marker, format!("{shown}\n"))
            }
            None => match std::fs::remove_file(marker) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        }
    }

    fn shown_parameter_marker(&self, key: &str) -> PathBuf {
        self.host
            .path(SIM_STATE_DIR)
            .join("shown-parameter")
            .join(key)
    }

    fn bind_limit_marker(&self, version: &str) -> PathBuf {
        self.host
            .path(SIM_STATE_DIR)
            .join("bind-limit")
            .join(version)
    }

    /// As tt-kmd's probe: binds each Tenstorrent PCI function (up to the limit set for
    /// `version`), registers its class device `tenstorrent!<n>` and creates `/dev/tenstorrent/<n>`.
    /// A host without such functions still gets `/dev/tenstorrent/0`, for simulated holders.
    fn bind_devices(&self, version: &str) -> io::Result<()> {
        let devices = tenstorrent_devices(&self.host).map_err(io::Error::other)?;
        let limit = std::fs::read_to_string(self.bind_limit_marker(version))
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok())
            .unwrap_or(usize::MAX);
        let dev = self.host.path(DEVICE_DIR);
        std::fs::create_dir_all(&dev)?;
        if devices.is_empty() {
            return std::fs::write(dev.join("0"), "");
        }
        for (n, device) in devices.iter().take(limit).enumerate() {
            let sysfs = self.host.path(device.sysfs_path());
            let link = sysfs.join("driver");
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(
                    format!("../../../bus/pci/drivers/{MODULE_NAME}"),
                    &link,
                )?;
            }
            let class = sysfs.join(MODULE_NAME).join(format!("{MODULE_NAME}!{n}"));
            std::fs::create_dir_all(&class)?;
            write_atomically(&class.join("dev"), &format!("{SIM_MAJOR}:{n}\n"))?;
            std::fs::write(dev.join(n.to_string()), "")?;
        }
        Ok(())
    }

    /// Undoes [`SimKernel::bind_devices`] for every function bound to `tenstorrent`.
    fn unbind_devices(&self) -> io::Result<()> {
        for device in tenstorrent_devices(&self.host).map_err(io::Error::other)? {
            let sysfs = self.host.path(device.sysfs_path());
            let bound = std::fs::read_link(sysfs.join("driver"))
                .is_ok_and(|target| target.ends_with(MODULE_NAME));
            if bound {
                std::fs::remove_file(sysfs.join("driver"))?;
                match std::fs::remove_dir_all(sysfs.join(MODULE_NAME)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
        }
        match std::fs::remove_dir_all(self.host.path(DEVICE_DIR)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn fail_load_marker(&self, version: &str) -> PathBuf {
        self.host
            .path(SIM_STATE_DIR)
            .join("fail-load")
            .join(version)
    }

    fn lock(&self) -> io::Result<FileLock> {
        FileLock::acquire(
            &self.host.path(SIM_STATE_DIR).join("lock"),
            SIM_LOCK_TIMEOUT,
        )
        .map_err(io::Error::other)
    }

    fn module_dir(&self, name: &str) -> PathBuf {
        self.host.path("/sys/module").join(name)
    }

    /// Open device descriptors across all simulated processes.
    fn device_refs(&self) -> usize {
        find_device_holders(&self.host, Path::new(DEVICE_DIR), MODULE_NAME)
            .iter()
            .map(|h| h.paths.len())
            .sum()
    }

    fn refresh_refcnt(&self) -> io::Result<()> {
        let dir = self.module_dir(MODULE_NAME);
        if dir.join("initstate").exists() {
            write_atomically(&dir.join("refcnt"), &format!("{}\n", self.device_refs()))?;
        }
        Ok(())
    }
}

impl Kernel for SimKernel {
    fn load(&self, ko: &Path, params: &str) -> io::Result<()> {
        let _lock = self.lock()?;
        std::fs::File::open(ko)?;
        let info = ModInfo::from_file(ko).map_err(|_| io::Error::from(Errno::ENOEXEC))?;
        let version = info.version().unwrap_or_default();
        let release = kernel_release(&self.host).map_err(io::Error::other)?;
        if info.vermagic_release() != Some(release.as_str())
            || self.fail_load_marker(version).exists()
        {
            return Err(Errno::ENOEXEC.into());
        }
        let signing = signing_facts(&self.host).map_err(io::Error::other)?;
        if !signing.unsigned_modules_load() && !is_signed(ko).map_err(io::Error::other)? {
            // sig_enforce answers EKEYREJECTED; lockdown alone answers EPERM
            return Err(if signing.sig_enforce == Some(true) {
                Errno::EKEYREJECTED
            } else {
                Errno::EPERM
            }
            .into());
        }
        let name = info.name().map(str::to_string).unwrap_or_else(|| {
            ko.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        let dir = self.module_dir(&name);
        if dir.join("initstate").exists() {
            return Err(Errno::EEXIST.into());
        }
        std::fs::create_dir_all(dir.join("holders"))?;
        std::fs::create_dir_all(dir.join("parameters"))?;
        for (key, value) in params.split_whitespace().filter_map(|p| p.split_once('=')) {
            let shown = std::fs::read_to_string(self.shown_parameter_marker(key))
                .unwrap_or_else(|_| format!("{value}\n"));
            write_atomically(&dir.join("parameters").join(key), &shown)?;
        }
        if !version.is_empty() {
            write_atomically(&dir.join("version"), &format!("{version}\n"))?;
        }
        if let Some(srcversion) = info.srcversion() {
            write_atomically(&dir.join("srcversion"), &format!("{srcversion}\n"))?;
        }
        write_atomically(&dir.join("refcnt"), "0\n")?;
        if name == MODULE_NAME {
            self.bind_devices(version)?;
        }
        // initstate last: it is what makes the module count as loaded
        write_atomically(&dir.join("initstate"), "live\n")?;
        self.refresh_refcnt()
    }

    fn unload(&self, name: &str) -> io::Result<()> {
        let _lock = self.lock()?;
        let dir = self.module_dir(name);
        if !dir.join("initstate").exists() {
            return Err(Errno::ENOENT.into());
        }
        if name == MODULE_NAME && self.device_refs() > 0 {
            return Err(Errno::EAGAIN.into());
        }
        std::fs::remove_file(dir.join("initstate"))?;
        std::fs::remove_dir_all(&dir)?;
        if name == MODULE_NAME {
            self.unbind_devices()?;
        }
        Ok(())
    }

    fn kill(&self, pid: i32) -> io::Result<()> {
        let _lock = self.lock()?;
        let process = self.host.path(format!("/proc/{pid}"));
        if !process.is_dir() {
            return Err(Errno::ESRCH.into());
        }
        std::fs::remove_dir_all(process)?;
        self.refresh_refcnt()
    }
}

/// Replaces a simulated sysfs file in one step (readers take no lock and must never see it empty).
fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}
