//! Fetching a tt-kmd release tag and building it against the host's kernel build tree.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ttdp_hostprobe::{HostRoot, build_tree};

use crate::KmdVersion;
use crate::modinfo::ModInfo;
use crate::timed_command::{log_tail, run_logged};
use crate::udev_rule::ShippedUdevRule;
use crate::{KO_FILE_NAME, KmodError};

/// The public tt-kmd repository.
pub const DEFAULT_REPOSITORY: &str = "https://github.com/tenstorrent/tt-kmd.git";
/// How many log lines an error message quotes.
const LOG_TAIL_LINES: usize = 25;

/// Where to fetch sources from and how to build them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildOptions {
    /// Git repository URL or local path (`file://` URLs and plain paths work).
    pub repository: String,
    /// The commit the release tag must point at (full hex object name); `None`: whatever it
    /// points at. A tag that moved fails the build with [`KmodError::SourceCommitMoved`].
    pub commit: Option<String>,
    /// `make -j` job count.
    pub jobs: usize,
    /// Limit for `git clone`.
    pub fetch_timeout: Duration,
    /// Limit for `make modules`.
    pub build_timeout: Duration,
    /// Extra `make` arguments, e.g. `CC=x86_64-linux-gnu-gcc-12`.
    pub make_args: Vec<String>,
    /// Where to create the temporary source directory (`None`: the system temporary directory).
    pub work_dir: Option<PathBuf>,
    /// Local directory passed to `make -C` instead of the host root's
    /// `/lib/modules/<release>/build`. Debian's and Ubuntu's header packages contain absolute
    /// paths, so a pod that mounts the host's `/lib/modules` and `/usr/src` at their own paths
    /// sets this to `/lib/modules/<release>/build`.
    pub build_dir: Option<PathBuf>,
    /// Run `make` (and the compilers it starts) under `nice -n <niceness>`: a background build
    /// for a kernel the node does not run yet must not slow what runs now. `None`: as is.
    pub niceness: Option<u8>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            repository: DEFAULT_REPOSITORY.to_string(),
            commit: None,
            jobs: std::thread::available_parallelism()
                .map(usize::from)
                .unwrap_or(1),
            fetch_timeout: Duration::from_secs(300),
            build_timeout: Duration::from_secs(900),
            make_args: Vec::new(),
            work_dir: None,
            build_dir: None,
            niceness: None,
        }
    }
}

/// A freshly built module, in a temporary directory removed on drop.
#[derive(Debug)]
pub struct BuiltModule {
    /// The tt-kmd version built.
    pub version: KmdVersion,
    /// The kernel release built against.
    pub release: String,
    /// The built `.ko`.
    pub ko_path: PathBuf,
    /// Its `.modinfo`.
    pub modinfo: ModInfo,
    /// The repository fetched from.
    pub repository: String,
    /// The commit the tag pointed at.
    pub source_commit: String,
    /// git's and make's output.
    pub log: String,
    /// Time spent fetching, in milliseconds.
    pub fetch_ms: u64,
    /// Time spent building, in milliseconds.
    pub build_ms: u64,
    /// The udev rule the source tree ships.
    pub udev_rule: ShippedUdevRule,
    _work: tempfile::TempDir,
}

/// Clones tag `ttkmd-<version>` of `repository` (depth 1) into `dest`, which must not exist, and
/// returns the commit it points at plus git's output.
pub fn fetch_source(
    repository: &str,
    version: &KmdVersion,
    dest: &Path,
    timeout: Duration,
) -> Result<(String, String), KmodError> {
    let tag = version.release_tag();
    let mut clone = Command::new("git");
    clone
        .args([
            "clone", "--quiet", "--depth", "1", "--branch", &tag, "--", repository,
        ])
        .arg(dest)
        .env("GIT_TERMINAL_PROMPT", "0");
    let run = run_logged(clone, "git", timeout)?;
    if run.timed_out {
        return Err(KmodError::Timeout {
            action: format!("fetching tag {tag} from {repository}"),
            seconds: timeout.as_secs(),
            log_tail: log_tail(&run.log, LOG_TAIL_LINES),
        });
    }
    if !run.success {
        return Err(KmodError::Fetch {
            version: version.to_string(),
            repository: repository.to_string(),
            status: run.status,
            log_tail: log_tail(&run.log, LOG_TAIL_LINES),
        });
    }
    let mut rev_parse = Command::new("git");
    rev_parse.arg("-C").arg(dest).args(["rev-parse", "HEAD"]);
    let head = run_logged(rev_parse, "git", timeout)?;
    if !head.success {
        return Err(KmodError::Fetch {
            version: version.to_string(),
            repository: repository.to_string(),
            status: head.status,
            log_tail: log_tail(&head.log, LOG_TAIL_LINES),
        });
    }
    // stdout and stderr share the log: pick the object name out of any warnings
    let commit = head
        .log
        .lines()
        .map(str::trim)
        .find(|l| matches!(l.len(), 40 | 64) && l.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_default()
        .to_string();
    Ok((commit, run.log))
}

/// Fetches tag `ttkmd-<version>` and runs `make -C <build tree> M=<source> -j<jobs> modules`
/// against the host's build tree for `release` (never the source's own Makefile, which would ask
/// the container's `uname -r`). Checks that the result declares `version` and was built for
/// `release`.
pub fn build_module(
    host: &HostRoot,
    release: &str,
    version: &KmdVersion,
    options: &BuildOptions,
) -> Result<BuiltModule, KmodError> {
    let tree_dir = kernel_build_dir(host, release, options)?;
    let work = work_dir(options)?;
    let src = work.path().join("tt-kmd");
    let started = std::time::Instant::now();
    let (commit, fetch_log) =
        fetch_source(&options.repository, version, &src, options.fetch_timeout)?;
    let fetch_ms = millis(started.elapsed());
    check_pin(options, version, &commit)?;

    let mut make = match options.niceness {
        Some(niceness) => {
            let mut nice = Command::new("nice");
            nice.arg("-n").arg(niceness.to_string()).arg("make");
            nice
        }
        None => Command::new("make"),
    };
    make.arg("-C")
        .arg(&tree_dir)
        .arg(format!("M={}", src.display()))
        .arg(format!("-j{}", options.jobs.max(1)))
        .args(&options.make_args)
        .arg("modules");
    let run = run_logged(make, "make", options.build_timeout)?;
    let log = format!("{fetch_log}{}", run.log);
    if run.timed_out {
        return Err(KmodError::Timeout {
            action: format!("building tt-kmd {version} for kernel {release}"),
            seconds: options.build_timeout.as_secs(),
            log_tail: log_tail(&run.log, LOG_TAIL_LINES),
        });
    }
    let ko_path = src.join(KO_FILE_NAME);
    if !run.success || !ko_path.is_file() {
        let status = if run.success {
            format!("no {KO_FILE_NAME} produced")
        } else {
            run.status
        };
        return Err(KmodError::Build {
            version: version.to_string(),
            release: release.to_string(),
            status,
            log_tail: log_tail(&run.log, LOG_TAIL_LINES),
        });
    }
    let modinfo = ModInfo::from_file(&ko_path)?;
    modinfo.check_built_for(version, release)?;
    let udev_rule = ShippedUdevRule::from_source_tree(&src)?;
    Ok(BuiltModule {
        version: version.clone(),
        release: release.to_string(),
        ko_path,
        modinfo,
        repository: options.repository.clone(),
        source_commit: commit,
        log,
        fetch_ms,
        build_ms: millis(run.elapsed),
        udev_rule,
        _work: work,
    })
}

/// The kernel build tree `make -C` runs in: `options.build_dir` when given, else the host's for
/// `release`; [`KmodError::HeadersMissing`] when it has no Makefile.
fn kernel_build_dir(
    host: &HostRoot,
    release: &str,
    options: &BuildOptions,
) -> Result<PathBuf, KmodError> {
    let missing = |host_path: PathBuf| KmodError::HeadersMissing {
        release: release.to_string(),
        host_path,
    };
    match &options.build_dir {
        Some(dir) if dir.join("Makefile").is_file() => Ok(dir.clone()),
        Some(dir) => Err(missing(dir.clone())),
        None => {
            let tree = build_tree(host, release);
            match tree.usable_dir() {
                Some(dir) => Ok(dir.to_path_buf()),
                None => Err(missing(tree.host_path)),
            }
        }
    }
}

/// A fresh temporary directory for the source and build, in `options.work_dir` when given.
pub(crate) fn work_dir(options: &BuildOptions) -> Result<tempfile::TempDir, KmodError> {
    match &options.work_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| KmodError::io("create", dir, e))?;
            tempfile::Builder::new()
                .prefix("tt-kmd-build-")
                .tempdir_in(dir)
        }
        None => tempfile::Builder::new().prefix("tt-kmd-build-").tempdir(),
    }
    .map_err(|e| {
        KmodError::io(
            "create a temporary directory in",
            options.work_dir.clone().unwrap_or_default(),
            e,
        )
    })
}

/// Fails with [`KmodError::SourceCommitMoved`] when `options` pins a commit and the tag was
/// found at another one (`found`): a moved release tag is never built.
fn check_pin(options: &BuildOptions, version: &KmdVersion, found: &str) -> Result<(), KmodError> {
    match &options.commit {
        Some(pinned) if !pinned.eq_ignore_ascii_case(found) => Err(KmodError::SourceCommitMoved {
            version: version.to_string(),
            repository: options.repository.clone(),
            pinned: pinned.clone(),
            found: found.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Whole milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
