//! Packs a scenario's gzip initramfs: a staging tree under `<cache>/initramfs/<scenario>/root`
//! archived with `cpio -H newc` (owner root) and `gzip -1`. One archive, so the "appended cpio must
//! start 4-byte aligned" pitfall cannot happen.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::kernel::Kernel;
use super::scenarios::Scenario;
use super::static_build::Executable;
use super::stub_module::BuiltModule;
use super::stub_repo;

/// The guest directory holding `<version>/tenstorrent.ko`.
const GUEST_KO_DIR: &str = "/ko";
/// The stub module's git repository in the guest (tags `ttkmd-<version>`).
const GUEST_STUB_REPO: &str = "/srv/tt-kmd-stub.git";
/// The guest directory holding the virtio and 9p modules `/init` loads for a host `/usr`.
const GUEST_9P_MODULE_DIR: &str = "/vm-modules";

/// Everything that goes into one scenario's initramfs.
#[derive(Debug)]
pub struct Contents<'a> {
    /// Repository root (for `tests/vm/` and the scenario's files).
    pub root: &'a Path,
    /// `<target dir>/vm`.
    pub cache: &'a Path,
    /// The scenario being packed.
    pub scenario: &'a Scenario,
    /// A static busybox.
    pub busybox: &'a Path,
    /// The kernel the guest runs (its release and its 9p modules).
    pub kernel: &'a Kernel,
    /// The stub modules, at `/ko/<version>/tenstorrent.ko`.
    pub modules: &'a [BuiltModule],
    /// The scenario's static executables.
    pub executables: &'a [Executable],
    /// Arguments for `/scenario.sh`.
    pub guest_args: &'a [String],
    /// More files: (host path, guest path).
    pub extra_files: &'a [(PathBuf, String)],
    /// More variables for `/etc/ttdp-vm.env`, exported to the scenario.
    pub extra_env: &'a [(String, String)],
    /// The guest mounts the host's `/usr` (usually the scenario's `host_usr`).
    pub host_usr: bool,
    /// The guest mounts a host folder over 9p: its kernel's virtio and 9p modules go in.
    pub ninep: bool,
}

/// Builds the initramfs and returns its path.
pub fn pack(contents: &Contents<'_>) -> Result<PathBuf> {
    let dir = contents
        .cache
        .join("initramfs")
        .join(contents.scenario.name);
    let stage = dir.join("root");
    if stage.exists() {
        std::fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    for sub in [
        "bin",
        "sbin",
        "usr/bin",
        "usr/sbin",
        "opt/ttdp/bin",
        "etc",
        "root",
        "tmp",
        "var/cache",
    ] {
        let path = stage.join(sub);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
    }
    copy_files(contents, &stage)?;
    stub_repo::build(
        contents.root,
        &dir.join("stub-repo-work"),
        &stage.join(GUEST_STUB_REPO.trim_start_matches('/')),
    )?;
    let ninep_names = if contents.ninep || contents.host_usr {
        copy_9p_modules(contents.kernel, &stage)?
    } else {
        Vec::new()
    };
    if contents.host_usr {
        link_lib_into_usr(&stage)?;
    }
    let env = guest_env(contents, &ninep_names);
    std::fs::write(stage.join("etc/ttdp-vm.env"), env).context("writing /etc/ttdp-vm.env")?;

    let initrd = dir.join("initramfs.cpio.gz");
    archive(&stage, &initrd)?;
    Ok(initrd)
}

/// Copies busybox, `/init`, the scenario script and its library, the stub modules, the executables and the
/// scenario's files into `stage`.
fn copy_files(contents: &Contents<'_>, stage: &Path) -> Result<()> {
    let vm_dir = contents.root.join("tests/vm");
    copy(contents.busybox, stage, "/bin/busybox", 0o755)?;
    std::os::unix::fs::symlink("busybox", stage.join("bin/sh"))
        .context("linking /bin/sh to busybox")?;
    copy(&vm_dir.join("init.sh"), stage, "/init", 0o755)?;
    copy(
        &vm_dir.join("scenarios").join(contents.scenario.script),
        stage,
        "/scenario.sh",
        0o755,
    )?;
    // the checks, summary line and probes every scenario script sources
    copy(
        &vm_dir.join("scenarios/lib.sh"),
        stage,
        "/scenario-lib.sh",
        0o644,
    )?;
    for built in contents.modules {
        copy(
            &built.ko,
            stage,
            &format!("{GUEST_KO_DIR}/{}/tenstorrent.ko", built.module.version),
            0o644,
        )?;
    }
    for executable in contents.executables {
        copy_without_debug_info(&executable.host, stage, &executable.guest)?;
    }
    for (host, guest) in contents.extra_files {
        copy(host, stage, guest, 0o644)?;
    }
    for (host, guest) in contents.scenario.files {
        // std::fs::copy keeps the host file's permissions: an executable stays executable
        copy_keeping_mode(&contents.root.join(host), stage, guest)?;
    }
    Ok(())
}

/// Copies the kernel's virtio and 9p modules into `stage`; returns their file names in load
/// order.
fn copy_9p_modules(kernel: &Kernel, stage: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for module in &kernel.ninep_modules {
        let name = module
            .file_name()
            .and_then(|n| n.to_str())
            .context("a 9p module path has no file name")?;
        copy(
            module,
            stage,
            &format!("{GUEST_9P_MODULE_DIR}/{name}"),
            0o644,
        )?;
        names.push(name.to_string());
    }
    Ok(names)
}

/// Links `/lib` and `/lib64` into the `/usr` the guest will mount from the host.
fn link_lib_into_usr(stage: &Path) -> Result<()> {
    // Debian's merged /usr: once the host's /usr is mounted, /lib and /lib64 lead into it.
    std::os::unix::fs::symlink("usr/lib", stage.join("lib")).context("linking /lib to usr/lib")?;
    std::os::unix::fs::symlink("usr/lib64", stage.join("lib64"))
        .context("linking /lib64 to usr/lib64")?;
    Ok(())
}

/// Archives `stage` into the gzip cpio `initrd`.
fn archive(stage: &Path, initrd: &Path) -> Result<()> {
    let status = Command::new("bash")
        .args([
            "-c",
            r#"set -euo pipefail; cd "$1"; find . -print0 | LC_ALL=C sort -z | cpio --null --quiet -o -H newc -R 0:0 | gzip -1 > "$2""#,
            "pack",
        ])
        .arg(stage)
        .arg(initrd)
        .status()
        .context("running cpio | gzip")?;
    if !status.success() {
        bail!(
            "packing {} into {} failed ({status})",
            stage.display(),
            initrd.display()
        );
    }
    Ok(())
}

/// `/etc/ttdp-vm.env`, sourced by `/init`.
fn guest_env(contents: &Contents<'_>, ninep_modules: &[String]) -> String {
    let good: Vec<&str> = contents
        .modules
        .iter()
        .filter(|m| !m.module.fail_init)
        .map(|m| m.module.version)
        .collect();
    let broken: Vec<&str> = contents
        .modules
        .iter()
        .filter(|m| m.module.fail_init)
        .map(|m| m.module.version)
        .collect();
    let args: Vec<String> = contents.guest_args.iter().map(|a| shell_quote(a)).collect();
    let mut env = String::new();
    for (key, value) in [
        ("TTDP_VM", "1".to_string()),
        ("TTDP_VM_SCENARIO", contents.scenario.name.to_string()),
        ("TTDP_VM_KERNEL_RELEASE", contents.kernel.release.clone()),
        ("TTDP_VM_KO_DIR", GUEST_KO_DIR.to_string()),
        ("TTDP_VM_KO_VERSIONS", good.join(" ")),
        ("TTDP_VM_KO_BROKEN_VERSION", broken.join(" ")),
        ("TTDP_VM_STUB_REPO", GUEST_STUB_REPO.to_string()),
        (
            "TTDP_VM_HOST_USR",
            if contents.host_usr { "1" } else { "0" }.to_string(),
        ),
        ("TTDP_VM_9P_MODULE_DIR", GUEST_9P_MODULE_DIR.to_string()),
        ("TTDP_VM_9P_MODULES", ninep_modules.join(" ")),
        // Quoted twice: /init runs `eval "set -- $TTDP_VM_TEST_ARGS"`.
        ("TTDP_VM_TEST_ARGS", args.join(" ")),
    ] {
        let _ = writeln!(env, "{key}={}", shell_quote(&value));
    }
    for (key, value) in contents.extra_env {
        let _ = writeln!(env, "export {key}={}", shell_quote(value));
    }
    env
}

/// Quotes `s` as one POSIX shell word.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Copies `host` to `stage` + `guest` with `mode`, creating parent directories.
fn copy(host: &Path, stage: &Path, guest: &str, mode: u32) -> Result<()> {
    let target = copy_keeping_mode(host, stage, guest)?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", target.display()))
}

/// Copies the executable `host` to `stage` + `guest` (mode 0755) without its debug info
/// (`strip --strip-debug`, symbols kept for backtraces): a debug build of the agent shrinks from
/// ~70 MB to ~35 MB, which the guest unpacks into RAM at every boot.
fn copy_without_debug_info(host: &Path, stage: &Path, guest: &str) -> Result<()> {
    let target = stage.join(guest.trim_start_matches('/'));
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let status = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&target)
        .arg(host)
        .status()
        .context("running strip")?;
    if !status.success() {
        bail!(
            "`strip --strip-debug -o {} {}` failed ({status})",
            target.display(),
            host.display()
        );
    }
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("setting the mode of {}", target.display()))
}

/// Copies `host` to `stage` + `guest` with the host file's permissions; returns the copy's path.
fn copy_keeping_mode(host: &Path, stage: &Path, guest: &str) -> Result<PathBuf> {
    let target = stage.join(guest.trim_start_matches('/'));
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::copy(host, &target)
        .with_context(|| format!("copying {} to {}", host.display(), target.display()))?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quote_survives_single_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn executables_are_copied_without_debug_info_and_stay_executable() {
        // this test binary is a debug build: it has debug info to lose
        let exe = std::env::current_exe().unwrap();
        let stage = std::env::temp_dir().join(format!("ttdp-vm-strip-{}", std::process::id()));
        copy_without_debug_info(&exe, &stage, "/opt/ttdp/bin/x").unwrap();
        let copy = stage.join("opt/ttdp/bin/x");
        let (original, stripped) = (std::fs::read(&exe).unwrap(), std::fs::read(&copy).unwrap());
        let mode = std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
        std::fs::remove_dir_all(&stage).unwrap();
        assert!(stripped.starts_with(b"\x7fELF"));
        assert!(
            stripped.len() < original.len(),
            "{} bytes before, {} after",
            original.len(),
            stripped.len()
        );
        assert_eq!(mode, 0o755);
    }
}
