//! [`HostRoot`]: where the host's file system is mounted, and how host paths map into it.

use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

/// How many symbolic links [`HostRoot::resolve`] follows before giving up (the kernel's limit).
const MAX_SYMLINKS: usize = 40;

/// The directory where the host's root file system is visible.
///
/// `/host` in the agent pod, a temporary directory in tests, `/` on a bare host. Every host path
/// goes through [`HostRoot::path`], so code never touches the container's own `/proc`, `/sys` or
/// `/lib/modules` by accident.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct HostRoot(PathBuf);

impl HostRoot {
    /// A host root at `dir` (for example `/host`).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self(dir.into())
    }

    /// The host root `/`: the current machine itself.
    pub fn system() -> Self {
        Self(PathBuf::from("/"))
    }

    /// The directory this host root points at.
    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// Whether this root is `/`, so host paths and local paths are the same.
    pub fn is_system(&self) -> bool {
        self.0 == Path::new("/")
    }

    /// Maps a host path (absolute, as seen on the host) to where it is visible from here.
    ///
    /// `HostRoot::new("/host").path("/sys/module/tenstorrent")` is `/host/sys/module/tenstorrent`.
    /// `..` components are dropped so the result never leaves the root.
    pub fn path(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let mut out = self.0.clone();
        for component in host_path.as_ref().components() {
            if let Component::Normal(part) = component {
                out.push(part);
            }
        }
        out
    }

    /// Maps a host path to a local path, following symbolic links the way the host would.
    ///
    /// An absolute link target (for example `/lib/modules/<release>/build -> /usr/src/linux-headers-<release>`)
    /// is taken relative to the host root, not to this process's `/`. The returned path exists.
    pub fn resolve(&self, host_path: impl AsRef<Path>) -> io::Result<PathBuf> {
        // Host-side path being built, and the components still to walk (in reverse order).
        let mut resolved = PathBuf::from("/");
        let mut pending: Vec<PathBuf> = reversed_parts(host_path.as_ref());
        let mut links = 0;
        while let Some(part) = pending.pop() {
            if part == Path::new("..") {
                resolved.pop();
                continue;
            }
            let candidate = resolved.join(&part);
            let local = self.path(&candidate);
            let meta = std::fs::symlink_metadata(&local)?;
            if !meta.file_type().is_symlink() {
                resolved = candidate;
                continue;
            }
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("too many symbolic links resolving {}", candidate.display()),
                ));
            }
            let target = std::fs::read_link(&local)?;
            if target.is_absolute() {
                resolved = PathBuf::from("/");
            }
            pending.extend(reversed_parts(&target));
        }
        Ok(self.path(&resolved))
    }
}

/// The normal and `..` components of `path`, last first (ready to be popped in order).
fn reversed_parts(path: &Path) -> Vec<PathBuf> {
    let mut parts: Vec<PathBuf> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(PathBuf::from(p)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect();
    parts.reverse();
    parts
}

impl fmt::Display for HostRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.display().fmt(f)
    }
}

impl From<PathBuf> for HostRoot {
    fn from(dir: PathBuf) -> Self {
        Self(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_joins_under_root_and_never_escapes() {
        let root = HostRoot::new("/host");
        assert_eq!(
            root.path("/sys/module/x"),
            PathBuf::from("/host/sys/module/x")
        );
        assert_eq!(root.path("relative/y"), PathBuf::from("/host/relative/y"));
        assert_eq!(
            root.path("/../../etc/passwd"),
            PathBuf::from("/host/etc/passwd")
        );
        assert_eq!(
            HostRoot::system().path("/proc/version"),
            PathBuf::from("/proc/version")
        );
    }

    #[test]
    fn resolve_follows_absolute_links_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        std::fs::create_dir_all(root.path("/usr/src/linux-headers-1/include")).unwrap();
        std::fs::create_dir_all(root.path("/lib/modules/1")).unwrap();
        std::os::unix::fs::symlink(
            "/usr/src/linux-headers-1",
            root.path("/lib/modules/1/build"),
        )
        .unwrap();
        std::os::unix::fs::symlink("../src/linux-headers-1/include", root.path("/usr/src/inc"))
            .unwrap();
        assert_eq!(
            root.resolve("/lib/modules/1/build/include").unwrap(),
            root.path("/usr/src/linux-headers-1/include")
        );
        assert_eq!(
            root.resolve("/usr/src/inc").unwrap(),
            root.path("/usr/src/linux-headers-1/include")
        );
    }

    #[test]
    fn resolve_reports_missing_paths_and_loops() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        let missing = root.resolve("/lib/modules/none/build").unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        std::os::unix::fs::symlink("/loop", root.path("/loop")).unwrap();
        let looped = root.resolve("/loop").unwrap_err();
        assert!(
            looped.to_string().contains("too many symbolic links"),
            "{looped}"
        );
    }
}
