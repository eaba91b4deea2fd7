//! Times [`ModuleInstaller::swap`] on the running kernel: for each run, from no module loaded and
//! an empty cache holding the two given versions' `.ko` files, a cache hit with nothing loaded
//! (load `OLD`) then a cache hit replacing it (unload `OLD`, load `NEW`); the module is unloaded
//! after each run. It loads and unloads the kernel module `tenstorrent`: `cargo xtask bench` runs
//! it as root in a QEMU virtual machine (scenario `swap-timing`), never on a build machine.
//!
//! Prints the median of each step of each case as one `BENCH-RESULT {json}` line.
//!
//! ```text
//! swap_timing KO_DIR OLD NEW [RUNS]    # KO_DIR/<version>/tenstorrent.ko
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use ttdp_kmod::{
    HostRoot, InstallerConfig, KmdVersion, KmodError, ModuleInstaller, RealKernel, SwapOptions,
    SwapReport, UnloadOptions,
};

const USAGE: &str = "usage: swap_timing KO_DIR OLD NEW [RUNS]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (ko_dir, old, new, runs) = match args.as_slice() {
        [dir, old, new] => (dir, old, new, 5),
        [dir, old, new, runs] => (dir, old, new, runs.parse()?),
        _ => return Err(USAGE.into()),
    };
    let (old, new): (KmdVersion, KmdVersion) = (old.parse()?, new.parse()?);
    let host = HostRoot::system();
    let installer = ModuleInstaller::new(
        host.clone(),
        RealKernel::new(host),
        InstallerConfig::default(),
    )?;
    let mut fresh = Vec::new();
    let mut replace = Vec::new();
    for _ in 0..runs {
        reset(&installer)?;
        for version in [&old, &new] {
            let ko = Path::new(ko_dir)
                .join(version.as_str())
                .join("tenstorrent.ko");
            installer
                .cache()
                .store_file(&ko, installer.release(), version, ko_dir, "stub")?;
        }
        fresh.push(timed_swap(&installer, &old)?);
        replace.push(timed_swap(&installer, &new)?);
    }
    reset(&installer)?;
    let result = serde_json::json!({
        "suite": "swap-vm",
        "release": installer.release(),
        "runs": runs,
        "cache_hit_nothing_loaded": medians(&fresh),
        "cache_hit_swap": medians(&replace),
    });
    println!("BENCH-RESULT {result}");
    Ok(())
}

/// No module loaded, no cache.
fn reset(installer: &ModuleInstaller<RealKernel>) -> Result<(), Box<dyn std::error::Error>> {
    if installer.status()?.loaded {
        installer.unload(&UnloadOptions {
            force: true,
            wait: Duration::from_secs(5),
        })?;
    }
    match std::fs::remove_dir_all(installer.cache().dir()) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!(
            "cannot clear the cache {}: {e}",
            installer.cache().dir().display()
        )
        .into()),
        _ => Ok(()),
    }
}

/// One swap and its wall time in microseconds (the report's steps are whole milliseconds).
fn timed_swap(
    installer: &ModuleInstaller<RealKernel>,
    version: &KmdVersion,
) -> Result<(SwapReport, u128), KmodError> {
    let started = Instant::now();
    let report = installer.swap(version, &SwapOptions::default())?;
    Ok((report, started.elapsed().as_micros()))
}

/// The median of each step, in milliseconds.
fn medians(swaps: &[(SwapReport, u128)]) -> serde_json::Value {
    let median = |step: &dyn Fn(&(SwapReport, u128)) -> f64| {
        let mut values: Vec<f64> = swaps.iter().map(step).collect();
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or_default()
    };
    serde_json::json!({
        "probe_ms": median(&|(r, _)| r.probe_ms as f64),
        "build_ms": median(&|(r, _)| r.build_ms as f64),
        "unload_ms": median(&|(r, _)| r.unload_ms as f64),
        "load_ms": median(&|(r, _)| r.load_ms as f64),
        "total_ms": median(&|(_, us)| *us as f64 / 1000.0),
    })
}
