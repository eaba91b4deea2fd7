//! The cache entry of a next kernel over every point where the agent can die while making it:
//! the real binary on a simulated node (`TTDP_KERNEL=sim`) prepares the target's module for a
//! second installed kernel in the background and is SIGKILLed before the build, in the middle of
//! `make`, after the `.ko` is stored and while the record is written, or at each step of
//! re-signing an entry signed by no key (built here, or a prebuilt download whose checksum is
//! pinned, which must still hold). Right after the kill the entry must be absent, whole
//! or failing verification (never a file taken as good that is not); the restarted agent must
//! make it again and report the kernel Ready, with nothing stray left in the entry, no lock
//! left held, and the loaded module untouched throughout. A node rebooted into that kernel
//! mid-build must load a whole module.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant, SystemTime};

use common::agent_process::{self, WAIT, killed, report_path, wait_for};
use common::{Node, RELEASE, make_signing_key, v};
use sha2::{Digest, Sha256};
use ttdp_api::agent_report::{AgentPhase, KernelModuleState};
use ttdp_kmod::test_hook::{
    ENTRY_BEFORE_BUILD, ENTRY_KO_STORED, KILL_AT_ENV, RECORD_WRITING, RESIGN_COPY_SIGNED,
    RESIGN_KO_REPLACED, RESIGN_RECORD_REMOVED,
};
use ttdp_kmod::{
    CacheLookup, InstallerConfig, KoCache, ModuleInstaller, RecordedSignature, SigningConfig,
    SwapOptions,
};

/// The second installed kernel, the one the node may boot next.
const NEXT: &str = "6.9.0-next";
const TARGET: &str = "2.0.0";
const SIGNER: &str = "tt-kmd fleet key";

fn secret_dir(node: &Node) -> PathBuf {
    node.dir.path().join("secret")
}

/// The agent for [`TARGET`], scanning the installed kernels often, with the extra environment
/// `env`, logging to `log`.
fn spawn_agent(node: &Node, env: &[(&str, &str)], log: &str) -> Child {
    let mut all = vec![("TTDP_KERNEL_SCAN_PERIOD", "100ms")];
    all.extend_from_slice(env);
    agent_process::spawn_agent(node, TARGET, &all, log)
}

fn signing(node: &Node) -> SigningConfig {
    SigningConfig {
        key: secret_dir(node).join("tls.key"),
        cert: secret_dir(node).join("tls.crt"),
        source: "Secret ttdp-system/tt-kmd-signing (spec.module.signing)".into(),
    }
}

/// An installer for the node, signing with the node's key when `signed`.
fn installer(node: &Node, signed: bool) -> ModuleInstaller<ttdp_kmod::SimKernel> {
    let config = InstallerConfig {
        build: node.config(TARGET).build,
        ..InstallerConfig::default()
    };
    let installer = ModuleInstaller::new(node.host().clone(), node.kernel(), config).unwrap();
    if signed {
        installer.with_signing(signing(node))
    } else {
        installer
    }
}

/// A node running [`TARGET`] (loaded and cached, signed when `signed`) with a second kernel
/// [`NEXT`] installed, headers included.
fn node_with_next_kernel(signed: bool) -> Node {
    let node = Node::new(&[TARGET]);
    if signed {
        make_signing_key(&secret_dir(&node), SIGNER);
    }
    installer(&node, signed)
        .swap(&v(TARGET), &SwapOptions::default())
        .unwrap();
    node.sim.add_kernel(NEXT, true, true).unwrap();
    node
}

/// What identifies the loaded module's load: its sysfs `initstate` (inode, modification time).
fn load_identity(node: &Node) -> (u64, SystemTime) {
    let meta = std::fs::metadata(node.host().path("/sys/module/tenstorrent/initstate")).unwrap();
    (meta.ino(), meta.modified().unwrap())
}

fn entry_dir(node: &Node, release: &str) -> PathBuf {
    node.host()
        .path(format!("/var/cache/tt-kmd/{release}/{TARGET}"))
}

/// The entry's lookup, named for messages: "miss", "invalid", or "hit".
fn entry_state(node: &Node, release: &str) -> &'static str {
    match KoCache::new(node.host())
        .lookup(release, &v(TARGET))
        .unwrap()
    {
        CacheLookup::Miss => "miss",
        CacheLookup::Invalid { .. } => "invalid",
        CacheLookup::Hit(_) => "hit",
    }
}

/// Asserts the entry of `release` is whole: a verified hit whose record names the file's own
/// checksum (computed here, not taken from the cache), and nothing else in its directory.
fn assert_whole_entry(node: &Node, release: &str) -> Vec<u8> {
    let dir = entry_dir(node, release);
    let CacheLookup::Hit(ko) = KoCache::new(node.host())
        .lookup(release, &v(TARGET))
        .unwrap()
    else {
        panic!("the entry of {release} is not a verified hit");
    };
    let bytes = std::fs::read(dir.join("tenstorrent.ko")).unwrap();
    assert_eq!(ko.record.sha256, hex::encode(Sha256::digest(&bytes)));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["tenstorrent.ko", "tenstorrent.ko.json"],
        "nothing stray is left in {}",
        dir.display()
    );
    bytes
}

/// Starts the agent again (no kill) and waits until it reports the node Ready and [`NEXT`]
/// Ready.
fn restart_until_next_ready(node: &Node, env: &[(&str, &str)]) {
    let log = "restarted.log";
    forget_report(node);
    let mut agent = spawn_agent(node, env, log);
    wait_for(node, log, "the next kernel Ready", |f| {
        f.report.as_ref().is_some_and(|r| {
            r.phase == AgentPhase::Ready
                && r.installed_kernels
                    .iter()
                    .any(|k| k.release == NEXT && k.state == KernelModuleState::Ready)
        })
    });
    agent.kill().unwrap();
    agent.wait().unwrap();
}

/// Removes the killed agent's last report, so that only the restarted agent's answers.
fn forget_report(node: &Node) {
    std::fs::remove_file(report_path(node)).unwrap();
}

/// One point of the build's kill matrix: the agent killed at `point` while it prepares the
/// next kernel's entry leaves it `left` ("miss" or "invalid"); the restarted agent makes it
/// whole and reports it Ready; the loaded module is never touched.
fn killed_while_building(point: &str, left: &str) {
    let node = node_with_next_kernel(false);
    let loaded = load_identity(&node);
    killed(
        spawn_agent(&node, &[(KILL_AT_ENV, point)], "killed.log"),
        point,
    );
    assert_eq!(entry_state(&node, NEXT), left, "killed at {point}");
    assert_eq!(load_identity(&node), loaded, "killed at {point}");

    restart_until_next_ready(&node, &[]);
    assert_whole_entry(&node, NEXT);
    assert_eq!(node.loaded().as_deref(), Some(TARGET));
    assert_eq!(
        load_identity(&node),
        loaded,
        "the loaded module was touched"
    );
}

#[test]
fn killed_before_the_build_the_restarted_agent_builds_the_next_kernel() {
    killed_while_building(ENTRY_BEFORE_BUILD, "miss");
}

#[test]
fn killed_after_the_ko_is_stored_the_entry_is_invalid_then_rebuilt() {
    killed_while_building(ENTRY_KO_STORED, "invalid");
}

#[test]
fn killed_while_the_record_is_written_the_entry_is_invalid_then_rebuilt() {
    killed_while_building(RECORD_WRITING, "invalid");
}

/// Makes the next kernel's first build stop in the middle of `make`: the script writes its pid
/// to `marker` and waits while `marker` exists; later builds go through.
fn hold_first_build_of_next(node: &Node, marker: &Path) {
    let script = node.host().path(format!(
        "/usr/src/linux-headers-{NEXT}/scripts/sim-kbuild.sh"
    ));
    let used = node.dir.path().join("first-build-held");
    let text = std::fs::read_to_string(&script).unwrap();
    let hold = format!(
        "set -eu\nif [ ! -e '{used}' ]; then : > '{used}'; echo $$ > '{marker}.tmp'; mv '{marker}.tmp' '{marker}'; while [ -e '{marker}' ]; do sleep 0.05; done; fi\n",
        used = used.display(),
        marker = marker.display(),
    );
    let held = text.replacen("set -eu\n", &hold, 1);
    assert_ne!(text, held, "the simulated kbuild script changed shape");
    std::fs::write(&script, held).unwrap();
}

/// Waits until `marker` names the pid of the held build.
fn held_build(marker: &Path) -> u32 {
    let started = Instant::now();
    loop {
        if let Ok(pid) = std::fs::read_to_string(marker) {
            return pid.trim().parse().unwrap();
        }
        assert!(
            started.elapsed() < WAIT,
            "the next kernel's build never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILLed in the middle of `make`: the build's processes outlive the agent (as they may on a
/// host), yet the restarted agent takes the entry's lock at once (the lock dies with the
/// process that held it, never inherited by `make`), builds again and reports Ready.
#[test]
fn killed_in_the_middle_of_make_the_restarted_agent_builds_again_without_waiting() {
    let node = node_with_next_kernel(false);
    let loaded = load_identity(&node);
    let marker = node.dir.path().join("held-build.pid");
    hold_first_build_of_next(&node, &marker);
    let mut agent = spawn_agent(&node, &[], "killed.log");
    let orphan = held_build(&marker);
    agent.kill().unwrap();
    assert_eq!(agent.wait().unwrap().signal(), Some(9));
    assert_eq!(entry_state(&node, NEXT), "miss");
    assert!(
        Path::new(&format!("/proc/{orphan}")).exists(),
        "the held build outlives the agent"
    );

    restart_until_next_ready(&node, &[]);
    // the orphaned build still runs, and holds nothing the restarted agent needed
    assert!(Path::new(&format!("/proc/{orphan}")).exists());
    std::fs::remove_file(&marker).unwrap();
    assert_whole_entry(&node, NEXT);
    assert_eq!(
        load_identity(&node),
        loaded,
        "the loaded module was touched"
    );
}

/// A node rebooted into the next kernel while its module was being built (the build's entry
/// left without a record) loads a whole module at its next start.
#[test]
fn rebooted_into_the_next_kernel_mid_build_loads_a_whole_module() {
    let node = node_with_next_kernel(false);
    killed(
        spawn_agent(&node, &[(KILL_AT_ENV, RECORD_WRITING)], "killed.log"),
        RECORD_WRITING,
    );
    assert_eq!(entry_state(&node, NEXT), "invalid");
    reboot_into(&node, NEXT);

    let log = "rebooted.log";
    forget_report(&node);
    let mut agent = spawn_agent(&node, &[], log);
    wait_for(&node, log, "Ready on the next kernel", |f| {
        f.report
            .as_ref()
            .is_some_and(|r| r.phase == AgentPhase::Ready)
    });
    agent.kill().unwrap();
    agent.wait().unwrap();
    assert_eq!(node.loaded().as_deref(), Some(TARGET));
    assert_whole_entry(&node, NEXT);
    // the entry of the kernel it came from is untouched
    assert_whole_entry(&node, RELEASE);
}

/// Boots the simulated node into `release`: the module goes and the kernel release changes.
fn reboot_into(node: &Node, release: &str) {
    use ttdp_kmod::Kernel;
    node.kernel().unload("tenstorrent").unwrap();
    std::fs::write(
        node.host().path("/proc/sys/kernel/osrelease"),
        format!("{release}\n"),
    )
    .unwrap();
    std::fs::write(
        node.host().path("/proc/version"),
        format!("Linux version {release} (sim@ttdp) (cc (GCC) 12.2.0, GNU ld (GNU Binutils) 2.40) #1 SMP PREEMPT_DYNAMIC\n"),
    )
    .unwrap();
}

/// One point of the re-sign's kill matrix: the next kernel's entry built unsigned, the agent
/// (with a signing key) killed at `point` while it re-signs it leaves the entry `left` ("hit":
/// still the whole unsigned entry, or "invalid"); the restarted agent makes it whole, signed by
/// the key, and reports it Ready.
fn killed_while_resigning(point: &str, left: &str) {
    let node = node_with_next_kernel(true);
    let build = node.config(TARGET).build_options(NEXT);
    let unsigned = installer(&node, false)
        .ensure_ko_for(NEXT, &v(TARGET), None, &build)
        .unwrap();
    assert_eq!(
        RecordedSignature::of(&std::fs::read(&unsigned.ko.path).unwrap()),
        None
    );
    let loaded = load_identity(&node);
    let secret = secret_dir(&node);
    let signing_env = [
        ("TTDP_MODULE_SIGNING_DIR", secret.to_str().unwrap()),
        ("TTDP_MODULE_SIGNING_SECRET", "ttdp-system/tt-kmd-signing"),
    ];
    let mut env = signing_env.to_vec();
    env.push((KILL_AT_ENV, point));
    killed(spawn_agent(&node, &env, "killed.log"), point);
    assert_eq!(entry_state(&node, NEXT), left, "killed at {point}");
    if left == "hit" {
        let bytes = std::fs::read(&unsigned.ko.path).unwrap();
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            unsigned.ko.record.sha256,
            "a whole entry is the unsigned one, untouched"
        );
    }

    restart_until_next_ready(&node, &signing_env);
    let bytes = assert_whole_entry(&node, NEXT);
    let signature = RecordedSignature::of(&bytes).expect("the entry is signed");
    assert_eq!(signature.signer, SIGNER);
    let record = KoCache::new(node.host()).record(NEXT, &v(TARGET)).unwrap();
    assert_eq!(record.signature.map(|s| s.signer).as_deref(), Some(SIGNER));
    assert_eq!(
        load_identity(&node),
        loaded,
        "the loaded module was touched"
    );
}

#[test]
fn killed_after_signing_the_copy_the_entry_is_whole_then_resigned() {
    killed_while_resigning(RESIGN_COPY_SIGNED, "hit");
}

#[test]
fn killed_after_the_old_record_is_removed_the_entry_is_invalid_then_remade() {
    killed_while_resigning(RESIGN_RECORD_REMOVED, "invalid");
}

#[test]
fn killed_after_the_signed_ko_replaces_the_old_the_entry_is_invalid_then_remade() {
    killed_while_resigning(RESIGN_KO_REPLACED, "invalid");
}

#[test]
fn killed_while_the_resigned_record_is_written_the_entry_is_invalid_then_remade() {
    killed_while_resigning(RECORD_WRITING, "invalid");
}

/// A loopback HTTP server answering `files` (path to body) and 404 otherwise, for as long as
/// the test runs; returns its base URL.
fn serve(files: Vec<(String, Vec<u8>)>) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            // the headers, up to the blank line
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request.split_whitespace().nth(1).unwrap_or_default();
            let (status, body) = match files.iter().find(|(p, _)| p == path) {
                Some((_, body)) => ("200 OK", body.clone()),
                None => ("404 Not Found", Vec::new()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    base
}

/// The re-sign's kill matrix for a prebuilt module whose checksum is pinned: the unsigned
/// download is re-signed with the node's key; killed at `point`, the entry is left `left`; the
/// restarted agent makes it whole, signed by the key, still the pinned file before signing,
/// and reports the kernel Ready.
fn killed_while_resigning_a_pinned_download(point: &str, left: &str) {
    let node = node_with_next_kernel(true);
    let built = ttdp_kmod::build_module(
        node.host(),
        NEXT,
        &v(TARGET),
        &node.config(TARGET).build_options(NEXT),
    )
    .unwrap();
    let bytes = std::fs::read(&built.ko_path).unwrap();
    let pinned = hex::encode(Sha256::digest(&bytes));
    let path = format!("/{TARGET}/{NEXT}/tenstorrent.ko");
    let base = serve(vec![
        (path.clone(), bytes),
        (
            format!("{path}.sha256"),
            format!("{pinned}  tenstorrent.ko\n").into_bytes(),
        ),
    ]);
    let url = format!("{base}/{{version}}/{{kernelRelease}}/tenstorrent.ko");
    let pins = format!(r#"{{"{TARGET}/{NEXT}": "{pinned}"}}"#);
    let secret = secret_dir(&node);
    let env = [
        ("TTDP_MODULE_SIGNING_DIR", secret.to_str().unwrap()),
        ("TTDP_MODULE_SIGNING_SECRET", "ttdp-system/tt-kmd-signing"),
        ("TT_KMD_PREBUILT_URL", url.as_str()),
        ("TT_KMD_PREBUILT_SHA256", pins.as_str()),
        ("TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP", "true"),
    ];
    let loaded = load_identity(&node);
    let mut killing = env.to_vec();
    killing.push((KILL_AT_ENV, point));
    killed(spawn_agent(&node, &killing, "killed.log"), point);
    assert_eq!(entry_state(&node, NEXT), left, "killed at {point}");

    restart_until_next_ready(&node, &env);
    let signed = assert_whole_entry(&node, NEXT);
    assert_eq!(RecordedSignature::of(&signed).unwrap().signer, SIGNER);
    let record = KoCache::new(node.host()).record(NEXT, &v(TARGET)).unwrap();
    assert!(record.source_repository.starts_with(&base), "{record:?}");
    assert_eq!(
        record.signature.and_then(|s| s.signed_from_sha256),
        Some(pinned),
        "the entry is the pinned file, re-signed"
    );
    assert_eq!(
        load_identity(&node),
        loaded,
        "the loaded module was touched"
    );
}

#[test]
fn a_pinned_download_killed_after_signing_the_copy_is_resigned_and_still_pinned() {
    killed_while_resigning_a_pinned_download(RESIGN_COPY_SIGNED, "hit");
}

#[test]
fn a_pinned_download_killed_with_its_record_removed_is_fetched_again_and_still_pinned() {
    killed_while_resigning_a_pinned_download(RESIGN_RECORD_REMOVED, "invalid");
}

#[test]
fn a_pinned_download_killed_with_the_signed_ko_in_place_is_fetched_again_and_still_pinned() {
    killed_while_resigning_a_pinned_download(RESIGN_KO_REPLACED, "invalid");
}
