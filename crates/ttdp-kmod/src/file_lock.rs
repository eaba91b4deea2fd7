//! [`FileLock`]: an exclusive `flock` on a file, taken with a bounded wait.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use crate::KmodError;

/// An exclusive lock held until dropped. Works across processes and across threads of one process
/// (each acquisition opens its own file description).
#[derive(Debug)]
pub struct FileLock {
    _lock: Flock<std::fs::File>,
    path: PathBuf,
}

impl FileLock {
    /// Takes the lock on `path` (created if needed), waiting at most `timeout`.
    pub fn acquire(path: &Path, timeout: Duration) -> Result<Self, KmodError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| KmodError::io("create", parent, e))?;
        }
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
                .map_err(|e| KmodError::io("open", path, e))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    return Ok(Self {
                        _lock: lock,
                        path: path.to_path_buf(),
                    });
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) if started.elapsed() < timeout => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(KmodError::LockTimeout {
                        path: path.to_path_buf(),
                        seconds: timeout.as_secs(),
                    });
                }
                Err((_, errno)) => return Err(KmodError::io("lock", path, errno.into())),
            }
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_waits_then_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/.lock");
        let first = FileLock::acquire(&path, Duration::from_secs(1)).unwrap();
        assert_eq!(first.path(), path);
        let err = FileLock::acquire(&path, Duration::from_millis(30)).unwrap_err();
        assert_eq!(err.reason(), "LockTimeout");
        drop(first);
        FileLock::acquire(&path, Duration::from_millis(30)).unwrap();
    }
}
