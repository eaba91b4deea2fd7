//! [`Kernel`]: the three system calls module management needs, and [`RealKernel`], the one that
//! makes them for real through `nix`.

use std::ffi::CString;
use std::io;
use std::path::Path;

use procfs::FromRead;
use ttdp_hostprobe::HostRoot;

/// The kernel operations behind module management. Errors are `io::Error`s carrying the kernel's
/// errno (`raw_os_error()`), which [`crate::ModuleInstaller`] turns into [`crate::KmodError`]s.
pub trait Kernel {
    /// Loads the module file `ko` with the parameter string `params` (`finit_module`).
    fn load(&self, ko: &Path, params: &str) -> io::Result<()>;
    /// Unloads module `name` without waiting for its users (`delete_module`, `O_NONBLOCK`).
    fn unload(&self, name: &str) -> io::Result<()>;
    /// Sends SIGKILL to host process `pid`.
    fn kill(&self, pid: i32) -> io::Result<()>;
}

impl<K: Kernel + ?Sized> Kernel for &K {
    fn load(&self, ko: &Path, params: &str) -> io::Result<()> {
        (**self).load(ko, params)
    }
    fn unload(&self, name: &str) -> io::Result<()> {
        (**self).unload(name)
    }
    fn kill(&self, pid: i32) -> io::Result<()> {
        (**self).kill(pid)
    }
}

impl<K: Kernel + ?Sized> Kernel for Box<K> {
    fn load(&self, ko: &Path, params: &str) -> io::Result<()> {
        (**self).load(ko, params)
    }
    fn unload(&self, name: &str) -> io::Result<()> {
        (**self).unload(name)
    }
    fn kill(&self, pid: i32) -> io::Result<()> {
        (**self).kill(pid)
    }
}

impl<K: Kernel + ?Sized> Kernel for std::sync::Arc<K> {
    fn load(&self, ko: &Path, params: &str) -> io::Result<()> {
        (**self).load(ko, params)
    }
    fn unload(&self, name: &str) -> io::Result<()> {
        (**self).unload(name)
    }
    fn kill(&self, pid: i32) -> io::Result<()> {
        (**self).kill(pid)
    }
}

/// The real kernel: `finit_module`, `delete_module` and `kill` through `nix`.
///
/// Needs `CAP_SYS_MODULE` to load and unload, and `CAP_KILL` in the host PID namespace to kill
/// holders. Holder pids come from the host root's `/proc`, so before killing it checks that the
/// same pid in this process's `/proc` is the same process (same start time): a pod without
/// `hostPID: true` gets an error instead of killing an unrelated process.
#[derive(Debug, Clone)]
pub struct RealKernel {
    host: HostRoot,
}

impl RealKernel {
    /// The real kernel, with holder pids taken from `host`'s `/proc`.
    pub fn new(host: HostRoot) -> Self {
        Self { host }
    }
}

impl Kernel for RealKernel {
    fn load(&self, ko: &Path, params: &str) -> io::Result<()> {
        let file = std::fs::File::open(ko)?;
        let params =
            CString::new(params).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        nix::kmod::finit_module(&file, &params, nix::kmod::ModuleInitFlags::empty())
            .map_err(io::Error::from)
    }

    fn unload(&self, name: &str) -> io::Result<()> {
        let name =
            CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        nix::kmod::delete_module(&name, nix::kmod::DeleteModuleFlags::O_NONBLOCK)
            .map_err(io::Error::from)
    }

    fn kill(&self, pid: i32) -> io::Result<()> {
        if !self.host.is_system() {
            let start = |proc_dir: &Path| {
                procfs::process::Stat::from_file(proc_dir.join(pid.to_string()).join("stat"))
                    .map(|s| s.starttime)
            };
            let host_start = start(&self.host.path("/proc"))
                .map_err(|_| io::Error::from_raw_os_error(libc_esrch()))?;
            match start(Path::new("/proc")) {
                Ok(own) if own == host_start => {}
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "pid {pid} under {} is not the same process as pid {pid} here; run the agent with hostPID: true",
                            self.host
                        ),
                    ));
                }
            }
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .map_err(io::Error::from)
    }
}

/// `ESRCH`: no such process.
fn libc_esrch() -> i32 {
    nix::errno::Errno::ESRCH as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_kernel_refuses_to_kill_a_pid_from_another_pid_namespace() {
        // A fake host root whose pid 1 started at another time than ours: killing must be refused.
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        std::fs::create_dir_all(root.path("/proc/1")).unwrap();
        let stat = "1 (init) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 999999999 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";
        std::fs::write(root.path("/proc/1/stat"), stat).unwrap();
        let err = RealKernel::new(root.clone()).kill(1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains("hostPID"), "{err}");
        let gone = RealKernel::new(root).kill(424242).unwrap_err();
        assert_eq!(gone.raw_os_error(), Some(libc_esrch()));
    }

    #[test]
    fn real_kernel_load_reports_a_missing_file() {
        let err = RealKernel::new(HostRoot::system())
            .load(Path::new("/nonexistent/x.ko"), "")
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
