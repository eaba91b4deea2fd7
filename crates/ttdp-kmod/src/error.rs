//! [`KmodError`]: every way managing the module can fail, each naming the module, the version and
//! what to do next.

use std::path::PathBuf;

use crate::holders::DeviceHolder;

/// Something went wrong while inspecting, building, caching, loading or unloading the module.
#[derive(Debug, thiserror::Error)]
pub enum KmodError {
    /// The requested version is not `MAJOR.MINOR.PATCH`.
    #[error(transparent)]
    InvalidVersion(#[from] ttdp_kmd_types::InvalidVersion),
    /// The host's kernel release could not be read.
    #[error(transparent)]
    Probe(#[from] ttdp_hostprobe::ProbeError),
    /// The module is in use: the kernel refuses to unload it (EAGAIN/EWOULDBLOCK).
    #[error(
        "module {module} {} is in use (refcnt {refcnt}; {}); drain the workloads using the device or enable force unload",
        shown(.version), holder_list(.holders)
    )]
    InUse {
        /// Module name.
        module: String,
        /// Loaded version, when sysfs reports one.
        version: Option<String>,
        /// Reference count at the time of the failure.
        refcnt: u32,
        /// Processes found holding the device.
        holders: Vec<DeviceHolder>,
    },
    /// Unloading a module that is not loaded (ENOENT).
    #[error(
        "module {module} is not loaded, so there is nothing to unload; load the wanted version directly"
    )]
    NotLoaded {
        /// Module name.
        module: String,
    },
    /// Loading while the module is already loaded (EEXIST).
    #[error("cannot load {module} {wanted}: module {module} {} is already loaded; unload it first", shown(.loaded))]
    AlreadyLoaded {
        /// Module name.
        module: String,
        /// The version already loaded, when sysfs reports one.
        loaded: Option<String>,
        /// The version we tried to load.
        wanted: String,
    },
    /// The kernel refused the operation for lack of privilege (EPERM).
    #[error("permission denied to {action} module {module} {}; run privileged with CAP_SYS_MODULE (and, to kill holders, in the host PID namespace)", shown(.version))]
    PermissionDenied {
        /// `load`, `unload` or `kill`.
        action: &'static str,
        /// Module name.
        module: String,
        /// Version concerned.
        version: Option<String>,
    },
    /// The kernel requires signed modules (sig_enforce or lockdown) and refused ours.
    #[error(
        "kernel refused unsigned module {module} {version} ({source}); module signing is enforced (sig_enforce=Y or lockdown): sign the module with the host's key or disable enforcement"
    )]
    SignatureRejected {
        /// Module name.
        module: String,
        /// Version concerned.
        version: String,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// The kernel only loads signed modules and ours is not signed; nothing was unloaded.
    #[error(
        "module {module} {version} is not signed and kernel {release} only loads signed modules ({enforcement}); nothing was unloaded: set spec.module.signing to a Secret with a signing key and certificate, and enroll the certificate on the node (mokutil --import cert.der, reboot, confirm the enrollment in the MOK manager), or turn enforcement off"
    )]
    SignatureRequired {
        /// Module name.
        module: String,
        /// Version concerned.
        version: String,
        /// Running kernel release.
        release: String,
        /// What enforces signing, e.g. `sig_enforce=Y` or `lockdown=integrity`.
        enforcement: String,
    },
    /// The kernel only loads signed modules and ours is signed by a certificate its key list
    /// (`/proc/keys`) does not hold; nothing was unloaded.
    #[error(
        "module {module} {version} is signed by {signer}, which {distrust}; nothing was unloaded: enroll the certificate on the node (openssl x509 -in tls.crt -outform DER -out cert.der; mokutil --import cert.der; reboot and confirm the enrollment in the MOK manager), or sign with a key the node already trusts"
    )]
    SignerNotTrusted {
        /// Module name.
        module: String,
        /// Version concerned.
        version: String,
        /// The signer as `modinfo` shows it, and its key (serial number).
        signer: String,
        /// Why the kernel is known not to trust it: its release, what enforces signing and the
        /// key id missing from its key list.
        distrust: String,
    },
    /// The module signing key or its certificate cannot be used (missing, unreadable, not a
    /// certificate); nothing was built, loaded or unloaded.
    #[error(
        "cannot sign modules with the key of {source_name}: {problem}; nothing was loaded or unloaded. Check that it exists and holds tls.key (the private key, PEM) and tls.crt (its certificate, PEM)"
    )]
    SigningKeyUnusable {
        /// Where the key comes from, e.g. `Secret ttdp-system/tt-kmd-signing`.
        source_name: String,
        /// What is wrong.
        problem: String,
    },
    /// The kernel's `sign-file` could not be found for the running kernel.
    #[error(
        "no sign-file for kernel {release} (looked at {looked_at}); install linux-headers-{release} (and its linux-kbuild package) on the node, or use a builder image that carries the kernel's kbuild scripts"
    )]
    SignFileMissing {
        /// Running kernel release.
        release: String,
        /// The paths tried.
        looked_at: String,
    },
    /// `sign-file` failed, or its output is not signed by the key's certificate.
    #[error(
        "signing {} with the key of {source_name} failed: {problem}; nothing was cached, loaded or unloaded. Check that tls.key is the private key of tls.crt", .ko.display()
    )]
    SigningFailed {
        /// The module file.
        ko: PathBuf,
        /// Where the key comes from.
        source_name: String,
        /// What went wrong.
        problem: String,
    },
    /// The kernel refused the module (ENOEXEC: not a module for this kernel; EINVAL: invalid, or
    /// the module's own init failed with it).
    #[error("kernel rejected {} as module {module} {version} (vermagic {}): {source}; the kernel log (dmesg) on the node says why: a wrong vermagic or symbol versions mean rebuild it against the running kernel's headers (the cached copy was dropped and is rebuilt on the next attempt), an error from the module's own init means this version does not work on this node", .path.display(), shown(.vermagic))]
    BadModule {
        /// Module name.
        module: String,
        /// Version concerned.
        version: String,
        /// The `.ko` file.
        path: PathBuf,
        /// The file's vermagic, when readable.
        vermagic: Option<String>,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// Another system call failure.
    #[error("{action} of module {module} {} failed: {source}; check the kernel log (dmesg) on the node", shown(.version))]
    Syscall {
        /// `load`, `unload` or `kill`.
        action: &'static str,
        /// Module name.
        module: String,
        /// Version concerned.
        version: Option<String>,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// Force unload killed what it could but the reference count did not reach 0 in time.
    #[error("module {module} {} is still in use after force unload (refcnt {refcnt}; killed pids {killed:?}; still holding: {}); find what else holds it (lsof /dev/tenstorrent*, dependent modules) and stop it", shown(.version), holder_list(.left))]
    HoldersRemain {
        /// Module name.
        module: String,
        /// Loaded version.
        version: Option<String>,
        /// Reference count at the end of the wait.
        refcnt: u32,
        /// Pids sent SIGKILL.
        killed: Vec<i32>,
        /// Holders still found at the end of the wait.
        left: Vec<DeviceHolder>,
    },
    /// The module loaded but sysfs reports another version.
    #[error("loaded module {module} reports version {} instead of {expected}; the .ko does not carry the version its tag promises: check the tt-kmd source at tag ttkmd-{expected}", shown(.found))]
    VersionAfterLoad {
        /// Module name.
        module: String,
        /// The version we loaded.
        expected: String,
        /// What `/sys/module/<module>/version` says.
        found: Option<String>,
    },
    /// The kernel build tree (headers) for the running kernel is missing.
    #[error("kernel build tree {} for kernel {release} not found (no Makefile); install linux-headers-{release} on the node (and mount /lib/modules and /usr/src into the agent)", .host_path.display())]
    HeadersMissing {
        /// Running kernel release.
        release: String,
        /// The host path looked at.
        host_path: PathBuf,
    },
    /// Fetching the source tag failed.
    #[error(
        "fetching tag ttkmd-{version} from {repository} failed ({status}): {log_tail}; check that the version exists as a release tag and that the repository is reachable from the node"
    )]
    Fetch {
        /// Version requested.
        version: String,
        /// Repository URL or path.
        repository: String,
        /// Exit status text.
        status: String,
        /// The end of git's output.
        log_tail: String,
    },
    /// The release tag no longer points at the commit the policy pins (`spec.source.commit`).
    #[error(
        "tag ttkmd-{version} in {repository} points at commit {found}, not at the pinned commit {pinned}: the tag moved; nothing was built, loaded or unloaded. Check the repository; if the new commit is trusted, set spec.source.commit to {found}"
    )]
    SourceCommitMoved {
        /// Version requested.
        version: String,
        /// Repository URL or path.
        repository: String,
        /// The commit the policy pins.
        pinned: String,
        /// The commit the tag points at now.
        found: String,
    },
    /// The prebuilt server has no `.ko` for this version and kernel, and the policy's fallback is
    /// `Fail` or the file's checksum is pinned.
    #[error(
        "no prebuilt tt-kmd {version} for kernel {release}: {url} was not found, and spec.source.prebuilt.fallback is Fail or its checksum is pinned in spec.source.prebuilt.checksums (a build would not match it); nothing was built, loaded or unloaded. Publish the module there (cargo xtask prebuild), or set the fallback to Build and remove its pin"
    )]
    PrebuiltMissing {
        /// Version requested.
        version: String,
        /// The node's kernel release.
        release: String,
        /// The URL asked for.
        url: String,
    },
    /// The prebuilt `.ko` would be trusted on the server's word alone, which the policy does not
    /// allow, and the policy's fallback is `Fail`.
    #[error(
        "prebuilt tt-kmd {version} for kernel {release} was not downloaded: no checksum is pinned for {key} in spec.source.prebuilt.checksums{}, and spec.source.prebuilt.fallback is Fail; nothing was built, loaded or unloaded. Add {{version: \"{version}\", kernelRelease: {release}, sha256: <the file's sha256>}} to spec.source.prebuilt.checksums (check the checksum against the file you published), or set the fallback to Build",
        if *commit_pinned { " and spec.source.commit is pinned (a download cannot show its commit)" } else { " and trustServerChecksum is off" }
    )]
    PrebuiltUnpinned {
        /// Version requested.
        version: String,
        /// The node's kernel release.
        release: String,
        /// The version and kernel, as `<version>/<kernelRelease>`.
        key: String,
        /// Whether a commit pin is what ruled out the server's checksum.
        commit_pinned: bool,
    },
    /// The prebuilt `.ko` or its checksum could not be downloaded.
    #[error(
        "fetching prebuilt tt-kmd {version} for kernel {release} failed: {source}; nothing was loaded or unloaded. Check that the server is reachable from the node (and its CA bundle, for https)"
    )]
    PrebuiltFetch {
        /// Version requested.
        version: String,
        /// The node's kernel release.
        release: String,
        /// What went wrong.
        #[source]
        source: crate::prebuilt::PrebuiltFetchError,
    },
    /// A downloaded prebuilt `.ko` failed a check (checksum, version, vermagic) and was discarded.
    #[error(
        "prebuilt tt-kmd {version} from {url} was refused: {reason}; it was not cached and nothing was loaded or unloaded. Republish the right file for kernel {release} (cargo xtask prebuild)"
    )]
    PrebuiltRejected {
        /// Version requested.
        version: String,
        /// The node's kernel release.
        release: String,
        /// Where the file came from.
        url: String,
        /// The check it failed.
        reason: String,
    },
    /// `make modules` failed.
    #[error(
        "building tt-kmd {version} for kernel {release} failed ({status}); last build output:\n{log_tail}\ncheck that linux-headers-{release} and the compiler the kernel was built with are installed on the node"
    )]
    Build {
        /// Version built.
        version: String,
        /// Kernel release built against.
        release: String,
        /// Exit status text.
        status: String,
        /// The end of the build log.
        log_tail: String,
    },
    /// A fetch or build did not finish in time and was killed.
    #[error(
        "{action} timed out after {seconds} s and was killed; last output:\n{log_tail}\nraise the timeout or check the node's network and load"
    )]
    Timeout {
        /// What was running, e.g. `building tt-kmd 2.8.0 for kernel 6.8.0-111-generic`.
        action: String,
        /// The timeout.
        seconds: u64,
        /// The end of its output.
        log_tail: String,
    },
    /// A helper program (git, make) could not be started.
    #[error("cannot run {program}: {source}; install {program} in the agent image")]
    Spawn {
        /// Program name.
        program: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The build produced a module for another version or kernel than asked.
    #[error("tag ttkmd-{version} built a module reporting version {} and vermagic {} instead of {version} for kernel {release}; check the tag's sources", shown(.found_version), shown(.found_vermagic))]
    BuiltWrongModule {
        /// Version asked for.
        version: String,
        /// Kernel release asked for.
        release: String,
        /// Version in the built module.
        found_version: Option<String>,
        /// Vermagic in the built module.
        found_vermagic: Option<String>,
    },
    /// The `.ko` file is not a readable ELF module with a `.modinfo` section.
    #[error("{} is not a usable kernel module: {reason}; rebuild it", .path.display())]
    Modinfo {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A version wanted for rollback is not in the cache.
    #[error(
        "no verified tenstorrent.ko {version} for kernel {release} in the cache; install {version} again (it will be rebuilt)"
    )]
    NotCached {
        /// Version looked up.
        version: String,
        /// Kernel release.
        release: String,
    },
    /// A file operation failed.
    #[error("cannot {action} {}: {source}; check that the host root is mounted read-write and has space", .path.display())]
    Io {
        /// What was being done, e.g. `write`.
        action: &'static str,
        /// The local path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A lock file stayed locked by someone else for too long.
    #[error("{} is still locked by another installer after {seconds} s; another agent may be building on this node: retry later", .path.display())]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        seconds: u64,
    },
    /// The loaded version has no verified `.ko` in the cache and none could be made (its version is
    /// unknown, or fetching or building its tag failed): unloading it would leave no way back if
    /// the new version failed to load, so nothing was unloaded.
    #[error("module {module} {} is loaded but no verified {module}.ko of it is in the cache and none can be made ({why}); nothing was unloaded, because if {target} then failed to load, the node would be left without any {module} driver: make tag ttkmd-<loaded version> fetchable from the repository (or put a verified build of it in the .ko cache), or explicitly allow this node to upgrade without a rollback path", shown(.loaded))]
    NoRollbackPath {
        /// Module name.
        module: String,
        /// The loaded version, when sysfs reports one.
        loaded: Option<String>,
        /// The version that was to replace it.
        target: String,
        /// Why no `.ko` of the loaded version can be had.
        why: String,
        /// The fetch, build or cache error behind `why`, if any.
        #[source]
        source: Option<Box<KmodError>>,
    },
    /// Loading the new version failed; the previous version was loaded back.
    #[error(
        "loading {module} {version} failed and {module} {previous} was loaded back: {load_error}"
    )]
    RolledBack {
        /// Module name.
        module: String,
        /// Version that failed to load.
        version: String,
        /// Version now loaded again.
        previous: String,
        /// Why loading `version` failed.
        #[source]
        load_error: Box<KmodError>,
    },
    /// Loading the new version failed and the previous version could not be loaded back either:
    /// no version of the module is loaded now.
    #[error("loading {module} {version} failed ({load_error}) and loading the previous version {} back failed too ({rollback_error}); no {module} module is loaded on this node now: fix the first error and install again", shown(.previous))]
    RollbackFailed {
        /// Module name.
        module: String,
        /// Version that failed to load.
        version: String,
        /// The version that was loaded before, when known.
        previous: Option<String>,
        /// Why loading `version` failed.
        #[source]
        load_error: Box<KmodError>,
        /// Why loading `previous` back failed.
        rollback_error: Box<KmodError>,
    },
    /// The new version loaded but failed its post-load validation; the previous version was
    /// loaded back.
    #[error(
        "{module} {version} loaded but does not work: {problem}; {module} {previous} was loaded back"
    )]
    ValidationFailedRolledBack {
        /// Module name.
        module: String,
        /// Version that failed validation.
        version: String,
        /// Version now loaded again.
        previous: String,
        /// What the validation found missing.
        problem: String,
    },
    /// The new version loaded but failed its post-load validation, and stays loaded: there was
    /// nothing to go back to, or it could not be unloaded.
    #[error(
        "{module} {version} loaded but does not work: {problem}; it stays loaded because {why}"
    )]
    ValidationFailedKeptLoaded {
        /// Module name.
        module: String,
        /// Version that failed validation (still loaded).
        version: String,
        /// What the validation found missing.
        problem: String,
        /// Why it was not replaced by the previous version.
        why: String,
    },
    /// The new version failed its post-load validation and was unloaded, but the previous version
    /// could not be loaded back.
    #[error("{module} {version} loaded but does not work: {problem}; loading {module} {previous} back failed ({rollback_error}); {}", after_failed_rollback(.module, .version, *.reloaded))]
    ValidationFailedRollbackFailed {
        /// Module name.
        module: String,
        /// Version that failed validation.
        version: String,
        /// The version that was loaded before.
        previous: String,
        /// What the validation found missing.
        problem: String,
        /// Why loading `previous` back failed.
        #[source]
        rollback_error: Box<KmodError>,
        /// Whether `version` was loaded again so the node keeps a driver.
        reloaded: bool,
    },
    /// A swap was interrupted between the unload of the previous module and the load of its
    /// target (the process doing it stopped), and neither can be loaded now: no version of the
    /// module is loaded. The swap journal stays, so the next attempt tries again.
    #[error("a swap of {module} from {} to {target} was interrupted after the old module was unloaded (the process doing it stopped); {target} cannot be loaded ({}) and loading {} back failed ({}); no {module} module is loaded on this node now: make either version's .ko loadable from the cache (or remove the swap journal {} to install {target} as on a new node)", shown(.previous), .problems.target_problem, shown(.previous), .problems.rollback_error, .problems.journal.display())]
    SwapResumeFailed {
        /// Module name.
        module: String,
        /// The version loaded before the swap, when known.
        previous: Option<String>,
        /// The version the swap was installing.
        target: String,
        /// Why neither loads, and the journal.
        problems: Box<ResumeProblems>,
    },
}

impl KmodError {
    /// A short stable name for the error kind (for logs, metrics and condition reasons).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidVersion(_) => "InvalidVersion",
            Self::Probe(_) => "HostProbeFailed",
            Self::InUse { .. } => "ModuleInUse",
            Self::NotLoaded { .. } => "ModuleNotLoaded",
            Self::AlreadyLoaded { .. } => "ModuleAlreadyLoaded",
            Self::PermissionDenied { .. } => "PermissionDenied",
            Self::SignatureRejected { .. } => "SignatureRejected",
            Self::SignatureRequired { .. } => "SignatureRequired",
            Self::SignerNotTrusted { .. } => "SignerNotTrusted",
            Self::SigningKeyUnusable { .. } => "SigningKeyUnusable",
            Self::SignFileMissing { .. } => "SignFileMissing",
            Self::SigningFailed { .. } => "SigningFailed",
            Self::BadModule { .. } => "BadModule",
            Self::Syscall { .. } => "SyscallFailed",
            Self::HoldersRemain { .. } => "HoldersRemain",
            Self::VersionAfterLoad { .. } => "VersionMismatchAfterLoad",
            Self::HeadersMissing { .. } => "HeadersMissing",
            Self::Fetch { .. } => "FetchFailed",
            Self::SourceCommitMoved { .. } => "SourceCommitMoved",
            Self::PrebuiltMissing { .. } => "PrebuiltMissing",
            Self::PrebuiltUnpinned { .. } => "PrebuiltUnpinned",
            Self::PrebuiltFetch { .. } => "PrebuiltFetchFailed",
            Self::PrebuiltRejected { .. } => "PrebuiltRejected",
            Self::Build { .. } => "BuildFailed",
            Self::Timeout { .. } => "Timeout",
            Self::Spawn { .. } => "ToolMissing",
            Self::BuiltWrongModule { .. } => "BuiltWrongModule",
            Self::Modinfo { .. } => "InvalidModuleFile",
            Self::NotCached { .. } => "NotCached",
            Self::Io { .. } => "IoError",
            Self::LockTimeout { .. } => "LockTimeout",
            Self::NoRollbackPath { .. } => "NoRollbackPath",
            Self::RolledBack { .. } => "LoadFailedRolledBack",
            Self::RollbackFailed { .. } => "LoadFailedRollbackFailed",
            Self::ValidationFailedRolledBack { .. } => "ValidationFailedRolledBack",
            Self::ValidationFailedKeptLoaded { .. } => "ValidationFailed",
            Self::ValidationFailedRollbackFailed { .. } => "ValidationFailedRollbackFailed",
            Self::SwapResumeFailed { .. } => "SwapResumeFailed",
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Why an interrupted swap could not be settled ([`KmodError::SwapResumeFailed`]).
#[derive(Debug)]
pub struct ResumeProblems {
    /// Why the target cannot be loaded.
    pub target_problem: String,
    /// Why loading the previous version back failed.
    pub rollback_error: String,
    /// The swap journal that said what was loaded.
    pub journal: PathBuf,
}

/// What is loaded after a failed validation whose rollback failed.
fn after_failed_rollback(module: &str, version: &str, reloaded: bool) -> String {
    if reloaded {
        format!(
            "{module} {version} was loaded again so the node keeps a driver; fix the cause and retry"
        )
    } else {
        format!(
            "loading {module} {version} again failed too: no {module} module is loaded on this node now; fix the first error and install again"
        )
    }
}

/// `2.8.0`, or `(unknown version)`.
fn shown(version: &Option<String>) -> &str {
    version.as_deref().unwrap_or("(unknown version)")
}

/// `holders: pid 12 (python3), pid 40 (tt-smi)` or `no holding process found`.
fn holder_list(holders: &[DeviceHolder]) -> String {
    if holders.is_empty() {
        return "no holding process found".to_string();
    }
    let list: Vec<String> = holders
        .iter()
        .map(|h| format!("pid {} ({})", h.pid, h.comm))
        .collect();
    format!("holders: {}", list.join(", "))
}
