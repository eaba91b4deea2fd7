//! Which container images the simulated kubelet runs as local programs.

use std::path::{Path, PathBuf};

/// Maps image-name prefixes to local binaries, e.g. `ghcr.io/tenstorrent/ttdp-agent` to the
/// `ttdp-agent` binary cargo built. The longest matching prefix wins. Images that map to nothing
/// run as "workload" containers without a process.
#[derive(Debug, Clone, Default)]
pub struct ImageMap {
    entries: Vec<(String, PathBuf)>,
}

impl ImageMap {
    /// An empty map: every container is a workload container.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a mapping from images starting with `image_prefix` to `binary`.
    pub fn with(mut self, image_prefix: impl Into<String>, binary: impl Into<PathBuf>) -> Self {
        self.entries.push((image_prefix.into(), binary.into()));
        self
    }

    /// The binary for `image`, if any prefix matches.
    pub fn binary_for(&self, image: &str) -> Option<&Path> {
        self.entries
            .iter()
            .filter(|(prefix, _)| image.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, binary)| binary.as_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins() {
        let map = ImageMap::new()
            .with("ghcr.io/tenstorrent/", "/bin/generic")
            .with("ghcr.io/tenstorrent/ttdp-agent", "/bin/agent");
        assert_eq!(
            map.binary_for("ghcr.io/tenstorrent/ttdp-agent:0.1.0"),
            Some(Path::new("/bin/agent"))
        );
        assert_eq!(
            map.binary_for("ghcr.io/tenstorrent/tt-telemetry:1"),
            Some(Path::new("/bin/generic"))
        );
        assert_eq!(map.binary_for("docker.io/library/busybox"), None);
    }
}
