//! [`TtSmiInstaller`]: copies the bundled tt-smi binary to the host's `/usr/local/bin/tt-smi`,
//! atomically (temporary file in the same directory, mode 0755, fsync, rename) and only when the
//! host's copy differs. Never used on host-managed nodes.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use ttdp_hostprobe::HostRoot;

/// Where tt-smi goes on the host.
pub const TT_SMI_HOST_PATH: &str = "/usr/local/bin/tt-smi";
/// The installed binary's mode.
const MODE: u32 = 0o755;

/// Copying tt-smi failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}: {source}; {hint}", .path.display())]
pub struct TtSmiError {
    /// What was being done, e.g. `read`.
    pub action: &'static str,
    /// The path concerned.
    pub path: PathBuf,
    /// What to do about it.
    pub hint: &'static str,
    /// The underlying error.
    #[source]
    pub source: io::Error,
}

/// What [`TtSmiInstaller::ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtSmiOutcome {
    /// The host's copy was already identical (and mode 0755).
    Unchanged,
    /// The binary was copied; `bytes` long, in `elapsed_ms`.
    Copied {
        /// Size of the binary.
        bytes: u64,
        /// Time taken.
        elapsed_ms: u64,
    },
}

/// Size, modification time and inode of a file: when both files keep theirs, the host's copy is
/// still known to be identical without reading them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
    mode: u32,
}

impl Stamp {
    fn of(path: &Path) -> io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        Ok(Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode: meta.ino(),
            mode: meta.permissions().mode() & 0o7777,
        })
    }
}

/// Keeps the host's tt-smi identical to the bundled one.
#[derive(Debug)]
pub struct TtSmiInstaller {
    source: PathBuf,
    dest: PathBuf,
    verified: Option<(Stamp, Stamp)>,
}

impl TtSmiInstaller {
    /// An installer copying `source` (in the agent's image) to `/usr/local/bin/tt-smi` on `host`.
    pub fn new(source: impl Into<PathBuf>, host: &HostRoot) -> Self {
        Self {
            source: source.into(),
            dest: host.path(TT_SMI_HOST_PATH),
            verified: None,
        }
    }

    /// The local path of the host's copy.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Makes the host's copy identical to the bundled binary, copying only when it differs.
    /// Cheap when nothing changed since the last call (two `stat`s).
    pub fn ensure(&mut self) -> Result<TtSmiOutcome, TtSmiError> {
        let source_stamp = Stamp::of(&self.source).map_err(|source| TtSmiError {
            action: "read the bundled tt-smi at",
            path: self.source.clone(),
            hint: "check the agent image (flag --tt-smi-path, env TTDP_TT_SMI_PATH)",
            source,
        })?;
        let dest_stamp = Stamp::of(&self.dest).ok();
        if let (Some((known_source, known_dest)), Some(dest_now)) = (self.verified, dest_stamp)
            && known_source == source_stamp
            && known_dest == dest_now
        {
            return Ok(TtSmiOutcome::Unchanged);
        }
        self.verified = None;
        if let Some(dest_now) = dest_stamp
            && dest_now.len == source_stamp.len
            && self.same_content()?
        {
            if dest_now.mode != MODE {
                std::fs::set_permissions(&self.dest, std::fs::Permissions::from_mode(MODE))
                    .map_err(|source| self.write_error("set the mode of", source))?;
            }
            self.remember(source_stamp);
            return Ok(TtSmiOutcome::Unchanged);
        }
        let started = Instant::now();
        self.copy()?;
        self.remember(source_stamp);
        Ok(TtSmiOutcome::Copied {
            bytes: source_stamp.len,
            elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    }

    fn remember(&mut self, source: Stamp) {
        self.verified = Stamp::of(&self.dest).ok().map(|dest| (source, dest));
    }

    fn write_error(&self, action: &'static str, source: io::Error) -> TtSmiError {
        TtSmiError {
            action,
            path: self.dest.clone(),
            hint: "check that the host's /usr/local/bin is mounted read-write into the agent",
            source,
        }
    }

    /// Whether the host's copy has the same bytes as the bundled one.
    fn same_content(&self) -> Result<bool, TtSmiError> {
        let open = |path: &Path| {
            File::open(path).map_err(|source| TtSmiError {
                action: "read",
                path: path.to_path_buf(),
                hint: "check file permissions",
                source,
            })
        };
        let (mut a, mut b) = (open(&self.source)?, open(&self.dest)?);
        let mut buf_a = vec![0u8; 64 * 1024];
        let mut buf_b = vec![0u8; 64 * 1024];
        loop {
            let n = read_full(&mut a, &mut buf_a).map_err(|source| TtSmiError {
                action: "read",
                path: self.source.clone(),
                hint: "check file permissions",
                source,
            })?;
            let m = read_full(&mut b, &mut buf_b).map_err(|source| TtSmiError {
                action: "read",
                path: self.dest.clone(),
                hint: "check file permissions",
                source,
            })?;
            if n != m || buf_a[..n] != buf_b[..m] {
                return Ok(false);
            }
            if n == 0 {
                return Ok(true);
            }
        }
    }

    /// Copies through a temporary file next to the destination, then renames it over.
    fn copy(&self) -> Result<(), TtSmiError> {
        let dir = self.dest.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(dir).map_err(|source| self.write_error("create", source))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".tt-smi.")
            .tempfile_in(dir)
            .map_err(|source| self.write_error("create a temporary file next to", source))?;
        let mut input = File::open(&self.source).map_err(|source| TtSmiError {
            action: "read the bundled tt-smi at",
            path: self.source.clone(),
            hint: "check the agent image",
            source,
        })?;
        io::copy(&mut input, tmp.as_file_mut())
            .and_then(|_| {
                tmp.as_file()
                    .set_permissions(std::fs::Permissions::from_mode(MODE))
            })
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|source| self.write_error("write a temporary copy for", source))?;
        tmp.persist(&self.dest)
            .map_err(|e| self.write_error("rename a temporary copy over", e.error))?;
        Ok(())
    }
}

/// Reads until `buf` is full or the file ends; returns how many bytes were read.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(content: &[u8]) -> (tempfile::TempDir, HostRoot, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path().join("host"));
        std::fs::create_dir_all(host.dir()).unwrap();
        let source = dir.path().join("tt-smi");
        std::fs::write(&source, content).unwrap();
        (dir, host, source)
    }

    #[test]
    fn copies_once_with_mode_0755_then_leaves_it_alone() {
        let (_dir, host, source) = setup(b"#!/bin/sh\necho tt-smi 3.0\n");
        let mut installer = TtSmiInstaller::new(&source, &host);
        assert!(matches!(
            installer.ensure().unwrap(),
            TtSmiOutcome::Copied { bytes: 26, .. }
        ));
        let dest = host.path(TT_SMI_HOST_PATH);
        assert_eq!(
            std::fs::read(&dest).unwrap(),
            std::fs::read(&source).unwrap()
        );
        assert_eq!(
            std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        let inode = std::fs::metadata(&dest).unwrap().ino();
        assert_eq!(installer.ensure().unwrap(), TtSmiOutcome::Unchanged);
        // a fresh installer (agent restart) finds the identical copy and does not rewrite it
        let mut again = TtSmiInstaller::new(&source, &host);
        assert_eq!(again.ensure().unwrap(), TtSmiOutcome::Unchanged);
        assert_eq!(std::fs::metadata(&dest).unwrap().ino(), inode);
        // no temporary files are left behind
        let names: Vec<_> = std::fs::read_dir(dest.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("tt-smi")]);
    }

    #[test]
    fn a_modified_or_wrong_mode_host_copy_is_repaired() {
        let (_dir, host, source) = setup(b"tt-smi v1");
        let mut installer = TtSmiInstaller::new(&source, &host);
        installer.ensure().unwrap();
        let dest = host.path(TT_SMI_HOST_PATH);
        std::fs::write(&dest, b"tt-smi v0").unwrap(); // same size, other bytes
        assert!(matches!(
            installer.ensure().unwrap(),
            TtSmiOutcome::Copied { .. }
        ));
        assert_eq!(std::fs::read(&dest).unwrap(), b"tt-smi v1");
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(installer.ensure().unwrap(), TtSmiOutcome::Unchanged);
        assert_eq!(
            std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        // a new bundled binary is copied over the old one
        std::fs::write(&source, b"tt-smi v2 longer").unwrap();
        assert!(matches!(
            installer.ensure().unwrap(),
            TtSmiOutcome::Copied { .. }
        ));
        assert_eq!(std::fs::read(&dest).unwrap(), b"tt-smi v2 longer");
    }

    #[test]
    fn a_missing_bundled_binary_is_an_error_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let err = TtSmiInstaller::new(dir.path().join("nope"), &host)
            .ensure()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nope") && err.contains("TTDP_TT_SMI_PATH"),
            "{err}"
        );
        assert!(!host.path(TT_SMI_HOST_PATH).exists());
    }
}
