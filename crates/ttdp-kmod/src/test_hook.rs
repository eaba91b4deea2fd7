//! Test hooks: named points of a swap where a test can have the process SIGKILLed or paused, to
//! prove that an agent killed at any point converges when it starts again, and that two installers
//! on one node never swap at the same time.
//!
//! Honoured only in builds with the `test-hooks` feature (tests, the VM tests; never a release
//! build or image, where [`checkpoint`] does nothing) and when the test variables are set:
//! - [`KILL_AT_ENV`]`=<point>`: the process sends itself SIGKILL when it reaches `<point>`;
//! - [`PAUSE_AT_ENV`]`=<point>` with [`PAUSE_FILE_ENV`]`=<path>`: at `<point>` the process writes
//!   its pid to `<path>` and waits (at most [`PAUSE_LIMIT`]) until a test removes the file.
//!
//! The points of [`crate::ModuleInstaller::swap`] are [`BEFORE_UNLOAD`], [`AFTER_UNLOAD`] and
//! [`AFTER_LOAD`] (the new module is loaded and verified; the caller has not labelled the node);
//! a failed post-load validation's rollback has [`VALIDATION_ROLLBACK`].
//!
//! The points of a cache entry being made (under the entry's own lock, by the main flow or the
//! background task preparing a next kernel's module) are [`ENTRY_BEFORE_BUILD`],
//! [`ENTRY_KO_STORED`] and [`RECORD_WRITING`]; those of a cache entry being re-signed are
//! [`RESIGN_COPY_SIGNED`], [`RESIGN_RECORD_REMOVED`], [`RESIGN_KO_REPLACED`] and
//! [`RECORD_WRITING`]. A process killed at any of them leaves an entry that is absent, whole, or
//! fails verification (and is made again), never one taken as good that is not.

#[cfg(feature = "test-hooks")]
use std::path::Path;
use std::time::Duration;
#[cfg(feature = "test-hooks")]
use std::time::Instant;

/// Test hook: SIGKILL this process at the named point.
pub const KILL_AT_ENV: &str = "TTDP_TEST_KILL_AT";
/// Test hook: pause at the named point until [`PAUSE_FILE_ENV`] is removed.
pub const PAUSE_AT_ENV: &str = "TTDP_TEST_PAUSE_AT";
/// Test hook: the file created while paused (holding the pid); remove it to resume.
pub const PAUSE_FILE_ENV: &str = "TTDP_TEST_PAUSE_FILE";
/// Longest pause: a forgotten pause file never wedges a process for good.
pub const PAUSE_LIMIT: Duration = Duration::from_secs(600);

/// The new `.ko` and the rollback `.ko` are ready; nothing was unloaded yet (module lock held).
pub const BEFORE_UNLOAD: &str = "before-unload";
/// The old module is unloaded; the new one is not loaded yet (module lock held).
pub const AFTER_UNLOAD: &str = "after-unload";
/// The new module is loaded and verified; the swap has not returned (module lock held).
pub const AFTER_LOAD: &str = "after-load";
/// The new module failed its post-load validation and is unloaded; the previous one is not
/// loaded back yet (module lock held).
pub const VALIDATION_ROLLBACK: &str = "validation-rollback";

/// A cache entry is to be fetched or built: its lock is held, what was there is verified
/// missing or evicted, nothing is downloaded or built yet.
pub const ENTRY_BEFORE_BUILD: &str = "entry-before-build";
/// A new `.ko` is renamed into its cache entry; its record is not written yet (the old one was
/// removed first).
pub const ENTRY_KO_STORED: &str = "entry-ko-stored";
/// A cache entry's record is written to a temporary file in the entry and synced, not yet
/// renamed into place (a new entry, a re-signed one, or a record rewritten).
pub const RECORD_WRITING: &str = "record-writing";
/// A cache entry's re-signed copy is written and signed as a temporary file in the entry; the
/// entry itself is untouched.
pub const RESIGN_COPY_SIGNED: &str = "resign-copy-signed";
/// A cache entry being re-signed has lost its old record; its old `.ko` is still in place.
pub const RESIGN_RECORD_REMOVED: &str = "resign-record-removed";
/// A cache entry's re-signed `.ko` is renamed into place; its new record is not written yet.
pub const RESIGN_KO_REPLACED: &str = "resign-ko-replaced";

/// Reached `point`: SIGKILLs or pauses the process when a test asked for it, else does nothing.
pub fn checkpoint(point: &str) {
    #[cfg(feature = "test-hooks")]
    honour(point);
    // a release build: the hooks are compiled out, so no environment can kill or pause a swap
    #[cfg(not(feature = "test-hooks"))]
    let _ = point;
}

/// What [`checkpoint`] does in a build with the `test-hooks` feature.
#[cfg(feature = "test-hooks")]
fn honour(point: &str) {
    if std::env::var(KILL_AT_ENV).is_ok_and(|p| p == point) {
        // SIGKILL cannot be handled: exactly what a node losing the agent pod looks like
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
    if std::env::var(PAUSE_AT_ENV).is_ok_and(|p| p == point)
        && let Ok(file) = std::env::var(PAUSE_FILE_ENV)
    {
        pause(Path::new(&file));
    }
}

/// Writes the pid to `file` and waits until it is removed (or [`PAUSE_LIMIT`] passed).
#[cfg(feature = "test-hooks")]
fn pause(file: &Path) {
    if std::fs::write(file, std::process::id().to_string()).is_err() {
        return;
    }
    let started = Instant::now();
    while file.exists() && started.elapsed() < PAUSE_LIMIT {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_hook_does_nothing() {
        // the variables are not set in unit tests: the call returns at once
        let started = Instant::now();
        checkpoint(AFTER_UNLOAD);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn a_pause_ends_when_the_file_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pause");
        let waiter = {
            let file = file.clone();
            std::thread::spawn(move || pause(&file))
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !file.exists() {
            assert!(Instant::now() < deadline, "the pause file never appeared");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::remove_file(&file).unwrap();
        waiter.join().unwrap();
    }
}
