//! [`ProbeError`]: what can go wrong while reading host facts.

use std::path::PathBuf;

/// A host fact could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A host file or directory exists but could not be read.
    #[error("cannot read {path}: {source}; check that the host root is mounted and readable")]
    Read {
        /// The local path that failed.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Neither `/proc/sys/kernel/osrelease` nor `/proc/version` gave a kernel release.
    #[error(
        "cannot tell the host's kernel release from {osrelease} or {version}; mount the host's /proc under the host root"
    )]
    NoKernelRelease {
        /// The `osrelease` path tried.
        osrelease: PathBuf,
        /// The `/proc/version` path tried.
        version: PathBuf,
    },
}

/// Reads a file to a string, `Ok(None)` when it does not exist.
pub(crate) fn read_optional(path: &std::path::Path) -> Result<Option<String>, ProbeError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ProbeError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Lists a directory's entry names (sorted), `Ok(None)` when it does not exist.
pub(crate) fn list_optional(path: &std::path::Path) -> Result<Option<Vec<String>>, ProbeError> {
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ProbeError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| ProbeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(Some(names))
}
