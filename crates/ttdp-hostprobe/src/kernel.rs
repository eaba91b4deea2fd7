//! The running kernel: its release, the compiler it was built with, and its build tree (headers).

use std::path::PathBuf;

use crate::HostRoot;
use crate::error::{ProbeError, read_optional};

/// Host path of the kernel release file.
pub const OSRELEASE_PATH: &str = "/proc/sys/kernel/osrelease";
/// Host path of the kernel version banner.
pub const PROC_VERSION_PATH: &str = "/proc/version";

/// The host's running kernel release (`uname -r` on the host, e.g. `6.8.0-111-generic`).
///
/// Read from `/proc/sys/kernel/osrelease` under the host root, falling back to the third word of
/// `/proc/version`. Never the container's own `uname`.
pub fn kernel_release(host: &HostRoot) -> Result<String, ProbeError> {
    let osrelease = host.path(OSRELEASE_PATH);
    if let Some(text) = read_optional(&osrelease)? {
        let release = text.trim();
        if !release.is_empty() {
            return Ok(release.to_string());
        }
    }
    let version = host.path(PROC_VERSION_PATH);
    if let Some(banner) = read_optional(&version)?
        && let Some(release) = release_from_banner(&banner)
    {
        return Ok(release);
    }
    Err(ProbeError::NoKernelRelease { osrelease, version })
}

/// The release in a `/proc/version` banner: `Linux version <release> (...`.
fn release_from_banner(banner: &str) -> Option<String> {
    let mut words = banner.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("Linux"), Some("version"), Some(release)) => Some(release.to_string()),
        _ => None,
    }
}

/// The compiler the running kernel was built with, from `/proc/version`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelCompiler {
    /// The whole compiler description, e.g. `x86_64-linux-gnu-gcc-12 (Debian 12.2.0-14) 12.2.0`.
    pub description: String,
    /// Its first word, usually the compiler command, e.g. `x86_64-linux-gnu-gcc-12`.
    pub command: String,
}

impl KernelCompiler {
    /// The compiler family: GCC or clang with its major version, or [`CompilerFamily::Unknown`].
    pub fn family(&self) -> CompilerFamily {
        family_of(&self.description)
    }
}

/// Which compiler built the kernel, as far as out-of-tree modules care: kbuild wants the same
/// compiler and major version for modules as for the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CompilerFamily {
    /// GCC of this major version (`gcc-13`).
    Gcc(u32),
    /// clang of this major version (`clang-18`).
    Clang(u32),
    /// Neither could be told from the banner.
    Unknown,
}

impl CompilerFamily {
    /// The major version when it is GCC.
    pub fn gcc_major(self) -> Option<u32> {
        match self {
            Self::Gcc(major) => Some(major),
            Self::Clang(_) | Self::Unknown => None,
        }
    }

    /// The form used in node labels: `gcc-13`, `clang-18`, `unknown`.
    pub fn label_value(self) -> String {
        match self {
            Self::Gcc(major) => format!("gcc-{major}"),
            Self::Clang(major) => format!("clang-{major}"),
            Self::Unknown => "unknown".to_owned(),
        }
    }
}

impl std::fmt::Display for CompilerFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label_value())
    }
}

/// The family in a compiler description such as `gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0`,
/// `x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0`, `cc (GCC) 12.2.0` or
/// `Ubuntu clang version 18.1.3 (1ubuntu1)`. The version is the first word that starts with
/// `<major>.`, after the vendor's parenthesised note (which holds a package version too).
fn family_of(description: &str) -> CompilerFamily {
    let lower = description.to_ascii_lowercase();
    let is_clang = lower.contains("clang");
    let is_gcc =
        !is_clang && (lower.contains("gcc") || lower.split_whitespace().next() == Some("cc"));
    if !is_clang && !is_gcc {
        return CompilerFamily::Unknown;
    }
    let outside_notes = strip_parenthesised(&lower);
    let major = outside_notes.split_whitespace().find_map(|word| {
        let (major, rest) = word.split_once('.')?;
        let minor_is_number = rest.chars().next().is_some_and(|c| c.is_ascii_digit());
        major.parse::<u32>().ok().filter(|_| minor_is_number)
    });
    match (major, is_gcc) {
        (Some(major), true) => CompilerFamily::Gcc(major),
        (Some(major), false) => CompilerFamily::Clang(major),
        (None, _) => CompilerFamily::Unknown,
    }
}

/// `text` without its parenthesised parts (nested ones included).
fn strip_parenthesised(text: &str) -> String {
    let mut depth = 0usize;
    let mut kept = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.saturating_sub(1);
                kept.push(' ');
            }
            _ if depth == 0 => kept.push(c),
            _ => {}
        }
    }
    kept
}

/// The compiler an installed kernel was built with, from the `.config` of its build tree
/// `tree_dir` (a local path): its `CONFIG_CC_VERSION_TEXT` line, which kernels since 5.8 write.
/// `None` when the file or the line is missing (the compiler is then not known, not another).
pub fn build_tree_compiler(tree_dir: &std::path::Path) -> Option<KernelCompiler> {
    let config = std::fs::read_to_string(tree_dir.join(".config")).ok()?;
    compiler_from_config(&config)
}

/// Parses `CONFIG_CC_VERSION_TEXT="gcc-12 (Debian 12.2.0-14) 12.2.0"` out of a kernel `.config`.
fn compiler_from_config(config: &str) -> Option<KernelCompiler> {
    let value = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("CONFIG_CC_VERSION_TEXT="))?;
    let description = value.trim().trim_matches('"').trim().to_string();
    let command = description.split_whitespace().next()?.to_string();
    Some(KernelCompiler {
        description,
        command,
    })
}

/// The compiler named in the host's `/proc/version`, `None` when the file or the field is missing.
pub fn kernel_compiler(host: &HostRoot) -> Result<Option<KernelCompiler>, ProbeError> {
    Ok(read_optional(&host.path(PROC_VERSION_PATH))?
        .and_then(|banner| compiler_from_banner(&banner)))
}

/// Parses `Linux version R (builder) (COMPILER, LINKER) #1 ...`: the second parenthesised group,
/// up to its first top-level comma.
fn compiler_from_banner(banner: &str) -> Option<KernelCompiler> {
    let mut depth = 0usize;
    let mut group = 0usize;
    let mut start = None;
    for (i, c) in banner.char_indices() {
        match c {
            '(' => {
                if depth == 0 {
                    group += 1;
                    if group == 2 {
                        start = Some(i + 1);
                    }
                }
                depth += 1;
            }
            ')' | ',' if depth == 1 && group == 2 => {
                let description = banner[start?..i].trim().to_string();
                let command = description.split_whitespace().next()?.to_string();
                return Some(KernelCompiler {
                    description,
                    command,
                });
            }
            ')' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// The kernel's build tree, needed to build out-of-tree modules (`make -C <tree> M=<src> modules`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildTree {
    /// The host path `/lib/modules/<release>/build`.
    pub host_path: PathBuf,
    /// Where the tree is visible from here, with symbolic links followed inside the host root;
    /// `None` when it does not exist (headers not installed).
    pub local_path: Option<PathBuf>,
    /// Whether the tree has a `Makefile` (a usable tree, not a dangling or empty directory).
    pub has_makefile: bool,
}

impl BuildTree {
    /// The local directory to pass to `make -C`, when the tree is usable.
    pub fn usable_dir(&self) -> Option<&std::path::Path> {
        match (&self.local_path, self.has_makefile) {
            (Some(dir), true) => Some(dir),
            _ => None,
        }
    }
}

/// Finds `/lib/modules/<release>/build` for `release` under the host root.
pub fn build_tree(host: &HostRoot, release: &str) -> BuildTree {
    let host_path = PathBuf::from(format!("/lib/modules/{release}/build"));
    let local_path = host.resolve(&host_path).ok().filter(|p| p.is_dir());
    let has_makefile = local_path
        .as_ref()
        .is_some_and(|dir| dir.join("Makefile").is_file());
    BuildTree {
        host_path,
        local_path,
        has_makefile,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBIAN: &str = "Linux version 6.1.0-31-amd64 (debian-kernel@lists.debian.org) (x86_64-linux-gnu-gcc-12 (Debian 12.2.0-14) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.128-1 (2025-02-07)\n";
    const CLANG: &str = "Linux version 6.6.30-android15 (build-user@build-host) (Android (11368308, +pgo) clang version 18.0.1, LLD 18.0.1) #1 SMP PREEMPT\n";

    fn root_with(files: &[(&str, &str)]) -> (tempfile::TempDir, HostRoot) {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        for (path, text) in files {
            let p = root.path(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        (dir, root)
    }

    #[test]
    fn release_prefers_osrelease_then_falls_back_to_banner() {
        let (_d, root) = root_with(&[
            (OSRELEASE_PATH, "6.8.0-111-generic\n"),
            (PROC_VERSION_PATH, DEBIAN),
        ]);
        assert_eq!(kernel_release(&root).unwrap(), "6.8.0-111-generic");
        let (_d, root) = root_with(&[(PROC_VERSION_PATH, DEBIAN)]);
        assert_eq!(kernel_release(&root).unwrap(), "6.1.0-31-amd64");
    }

    #[test]
    fn release_missing_is_an_error_naming_both_files() {
        let (_d, root) = root_with(&[(PROC_VERSION_PATH, "garbage")]);
        let err = kernel_release(&root).unwrap_err().to_string();
        assert!(
            err.contains("osrelease") && err.contains("proc/version"),
            "{err}"
        );
    }

    #[test]
    fn an_unreadable_release_file_is_a_read_error_naming_it() {
        let (_d, root) = root_with(&[(PROC_VERSION_PATH, DEBIAN)]);
        std::fs::create_dir_all(root.path(OSRELEASE_PATH)).unwrap();
        let err = kernel_release(&root).unwrap_err();
        assert!(
            matches!(&err, ProbeError::Read { path, .. } if path.ends_with("osrelease")),
            "{err}"
        );
        assert!(err.to_string().contains("host root is mounted"), "{err}");
    }

    #[test]
    fn an_installed_kernels_compiler_is_read_from_its_config() {
        let config = "CONFIG_CC_IS_GCC=y\nCONFIG_CC_VERSION_TEXT=\"gcc-13 (Debian 13.2.0-25) 13.2.0\"\nCONFIG_GCC_VERSION=130200\n";
        let compiler = compiler_from_config(config).unwrap();
        assert_eq!(compiler.description, "gcc-13 (Debian 13.2.0-25) 13.2.0");
        assert_eq!(compiler.command, "gcc-13");
        assert_eq!(compiler.family(), CompilerFamily::Gcc(13));
        assert_eq!(compiler_from_config("CONFIG_CC_IS_GCC=y\n"), None);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(build_tree_compiler(dir.path()), None);
        std::fs::write(dir.path().join(".config"), config).unwrap();
        assert_eq!(
            build_tree_compiler(dir.path()).map(|c| c.family()),
            Some(CompilerFamily::Gcc(13))
        );
    }

    #[test]
    fn compiler_is_read_from_the_banner() {
        let (_d, root) = root_with(&[(PROC_VERSION_PATH, DEBIAN)]);
        let gcc = kernel_compiler(&root).unwrap().unwrap();
        assert_eq!(
            gcc.description,
            "x86_64-linux-gnu-gcc-12 (Debian 12.2.0-14) 12.2.0"
        );
        assert_eq!(gcc.command, "x86_64-linux-gnu-gcc-12");
        let clang = compiler_from_banner(CLANG).unwrap();
        assert_eq!(
            clang.description,
            "Android (11368308, +pgo) clang version 18.0.1"
        );
        assert_eq!(compiler_from_banner("Linux version 1.0"), None);
        let (_d, empty) = root_with(&[]);
        assert_eq!(kernel_compiler(&empty).unwrap(), None);
    }

    /// `/proc/version` of the hosts ttdp serves, and the family each must give.
    const BANNERS: [(&str, CompilerFamily); 5] = [
        (
            "Linux version 5.15.0-131-generic (buildd@lcy02-amd64-057) (gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #141-Ubuntu SMP Fri Jan 10 21:18:28 UTC 2025\n",
            CompilerFamily::Gcc(11),
        ),
        (
            "Linux version 6.8.0-51-generic (buildd@lcy02-amd64-091) (x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0, GNU ld (GNU Binutils for Ubuntu) 2.42) #52-Ubuntu SMP PREEMPT_DYNAMIC Thu Dec  5 13:09:44 UTC 2024\n",
            CompilerFamily::Gcc(13),
        ),
        (
            "Linux version 6.1.0-31-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.128-1 (2025-02-07)\n",
            CompilerFamily::Gcc(12),
        ),
        (
            "Linux version 6.12.12-amd64 (debian-kernel@lists.debian.org) (x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0, GNU ld (GNU Binutils for Debian) 2.44) #1 SMP PREEMPT_DYNAMIC Debian 6.12.12-1 (2025-02-02)\n",
            CompilerFamily::Gcc(14),
        ),
        (
            "Linux version 6.8.0-sim (sim@ttdp) (cc (GCC) 12.2.0, GNU ld (GNU Binutils) 2.40) #1 SMP\n",
            CompilerFamily::Gcc(12),
        ),
    ];

    #[test]
    fn the_family_is_the_gcc_major_of_each_served_host() {
        for (banner, family) in BANNERS {
            let compiler = compiler_from_banner(banner).unwrap();
            assert_eq!(compiler.family(), family, "{banner}");
        }
        assert_eq!(CompilerFamily::Gcc(13).label_value(), "gcc-13");
        assert_eq!(CompilerFamily::Gcc(13).gcc_major(), Some(13));
    }

    #[test]
    fn clang_and_garbage_are_not_gcc() {
        let clang = compiler_from_banner(CLANG).unwrap().family();
        assert_eq!(clang, CompilerFamily::Clang(18));
        assert_eq!(clang.gcc_major(), None);
        assert_eq!(clang.label_value(), "clang-18");
        for garbage in [
            "",
            "gcc",
            "gcc (GCC)",
            "tcc 0.9.27",
            "gcc (Debian 12.2.0-14) x.y",
            "zig cc 0.13",
        ] {
            assert_eq!(family_of(garbage), CompilerFamily::Unknown, "{garbage:?}");
        }
        assert_eq!(CompilerFamily::Unknown.label_value(), "unknown");
    }

    #[test]
    fn build_tree_follows_the_headers_link_and_needs_a_makefile() {
        let (_d, root) = root_with(&[("/usr/src/linux-headers-6.8.0-1/Makefile", "all:\n")]);
        std::fs::create_dir_all(root.path("/lib/modules/6.8.0-1")).unwrap();
        std::os::unix::fs::symlink(
            "/usr/src/linux-headers-6.8.0-1",
            root.path("/lib/modules/6.8.0-1/build"),
        )
        .unwrap();
        let tree = build_tree(&root, "6.8.0-1");
        assert_eq!(tree.host_path, PathBuf::from("/lib/modules/6.8.0-1/build"));
        assert_eq!(
            tree.usable_dir(),
            Some(root.path("/usr/src/linux-headers-6.8.0-1").as_path())
        );

        std::fs::create_dir_all(root.path("/lib/modules/6.8.0-2/build")).unwrap();
        let empty = build_tree(&root, "6.8.0-2");
        assert!(empty.local_path.is_some() && !empty.has_makefile && empty.usable_dir().is_none());
        let missing = build_tree(&root, "6.8.0-3");
        assert_eq!(missing.local_path, None);
    }
}
