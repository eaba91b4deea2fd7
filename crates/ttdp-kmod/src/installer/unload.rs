//! Unloading the module, waiting for its holders to let go or killing them.

use std::io;
use std::time::Instant;

use nix::errno::Errno;

use super::{ModuleInstaller, REFCNT_POLL, errno};
use crate::KmodError;
use crate::holders::DeviceHolder;
use crate::install_report::{UnloadOptions, UnloadReport};
use crate::kernel::Kernel;
use crate::source_build::millis;
use crate::status::ModuleStatus;

impl<K: Kernel> ModuleInstaller<K> {
    /// Unloads the module. With holders: waits up to `options.wait` for refcnt 0, first sending
    /// SIGKILL to every holder found in `/proc/*/fd` when `options.force`; fails with
    /// [`KmodError::InUse`] (not forced) or [`KmodError::HoldersRemain`] (forced) if it stays in use.
    pub fn unload(&self, options: &UnloadOptions) -> Result<UnloadReport, KmodError> {
        let module = self.config.module.clone();
        let status = self.status()?;
        if !status.loaded {
            return Err(KmodError::NotLoaded { module });
        }
        let version = status.version.clone();
        let started = Instant::now();
        let (killed, kill_error) = if status.in_use() && options.force {
            self.kill_holders(&status)
        } else {
            (Vec::new(), None)
        };
        let mut status = status;
        while status.in_use() && started.elapsed() < options.wait {
            std::thread::sleep(REFCNT_POLL.min(options.wait.saturating_sub(started.elapsed())));
            status = self.status()?;
        }
        if status.in_use()
            && let Some(e) = kill_error
        {
            return Err(kill_failed(e, module, version));
        }
        let killed_pids: Vec<i32> = killed.iter().map(|h| h.pid).collect();
        let in_use_error = |status: ModuleStatus| in_use(status, options.force, &killed_pids);
        if status.in_use() {
            return Err(in_use_error(status));
        }
        let waited_ms = millis(started.elapsed());
        match self.kernel.unload(&module) {
            Ok(()) => Ok(UnloadReport {
                version,
                killed,
                waited_ms,
            }),
            Err(e) => Err(match errno(&e) {
                Some(Errno::EAGAIN) => in_use_error(self.status()?),
                Some(Errno::ENOENT) => KmodError::NotLoaded { module },
                Some(Errno::EPERM) => KmodError::PermissionDenied {
                    action: "unload",
                    module,
                    version,
                },
                _ => KmodError::Syscall {
                    action: "unload",
                    module,
                    version,
                    source: e,
                },
            }),
        }
    }

    /// Sends SIGKILL to every process holding the device in `status`: the ones killed, and the
    /// first error, which matters only if the module stays in use.
    fn kill_holders(&self, status: &ModuleStatus) -> (Vec<DeviceHolder>, Option<io::Error>) {
        let own_pid = i32::try_from(std::process::id()).unwrap_or(0);
        let (mut killed, mut kill_error) = (Vec::new(), None);
        // never init (killing it panics the host) and never ourselves: those stay as holders
        for holder in status
            .device_holders
            .iter()
            .filter(|h| h.pid > 1 && h.pid != own_pid)
        {
            match self.kernel.kill(holder.pid) {
                Ok(()) => killed.push(holder.clone()),
                Err(e) if errno(&e) == Some(Errno::ESRCH) => {} // already gone
                Err(e) => {
                    kill_error.get_or_insert(e);
                }
            }
        }
        (killed, kill_error)
    }
}

/// The error of a module still in use: its holders when not forced, what was killed and what
/// is left when forced.
fn in_use(status: ModuleStatus, forced: bool, killed: &[i32]) -> KmodError {
    if forced {
        KmodError::HoldersRemain {
            module: status.name,
            version: status.version,
            refcnt: status.refcnt.unwrap_or(0),
            killed: killed.to_vec(),
            left: status.device_holders,
        }
    } else {
        KmodError::InUse {
            module: status.name,
            version: status.version,
            refcnt: status.refcnt.unwrap_or(0),
            holders: status.device_holders,
        }
    }
}

/// The error of holders that could not be killed.
fn kill_failed(e: io::Error, module: String, version: Option<String>) -> KmodError {
    if errno(&e) == Some(Errno::EPERM) || e.kind() == io::ErrorKind::PermissionDenied {
        KmodError::PermissionDenied {
            action: "kill holders of",
            module,
            version,
        }
    } else {
        KmodError::Syscall {
            action: "kill holders",
            module,
            version,
            source: e,
        }
    }
}
