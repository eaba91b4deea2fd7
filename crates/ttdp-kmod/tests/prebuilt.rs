//! `spec.source.prebuilt`: on a cache miss the installer downloads a ready-built `.ko` (through
//! the caller's [`PrebuiltSource`]), checks its published checksum, the version it declares and
//! its vermagic against the running kernel, and caches it as if it were built here. A file that
//! fails a check, or cannot be fetched, never unloads the working driver and is never cached;
//! a missing file is built or refused as the fallback says.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use fixture::{Fixture, RELEASE, v};
use sha2::{Digest, Sha256};
use ttdp_kmod::prebuilt::{
    FetchedKo, PrebuiltFallback, PrebuiltFetchError, PrebuiltPins, PrebuiltSource, pin_key,
    prebuilt_url,
};
use ttdp_kmod::{
    CacheLookup, KmdVersion, KmodError, ModuleInstaller, SimHost, SimKernel, SwapOptions,
    build_module,
};

const TEMPLATE: &str = "http://ko.test/tt-kmd/{version}/{kernelRelease}/tenstorrent.ko";

/// A server in memory: URL to (file, published checksum); `down` answers every request with a
/// connection error. `pins` is what the policy vouches for; `fetches` counts the requests.
#[derive(Debug, Default)]
struct Server {
    files: HashMap<String, (Vec<u8>, String)>,
    fallback: PrebuiltFallback,
    down: bool,
    pins: PrebuiltPins,
    fetches: AtomicUsize,
}

impl Server {
    /// A server whose own checksum files are trusted (no checksum pinned).
    fn trusted() -> Self {
        Self {
            pins: PrebuiltPins {
                trust_server_checksum: true,
                ..PrebuiltPins::default()
            },
            ..Self::default()
        }
    }

    /// A server trusted only through the checksums the policy pins.
    fn pinned(pins: &[(&str, &[u8])]) -> Self {
        let sha256 = pins
            .iter()
            .map(|(version, ko)| {
                (
                    pin_key(&v(version), RELEASE),
                    hex::encode(Sha256::digest(ko)),
                )
            })
            .collect();
        Self {
            pins: PrebuiltPins {
                sha256,
                trust_server_checksum: false,
            },
            ..Self::default()
        }
    }

    fn publish(&mut self, version: &str, bytes: Vec<u8>) {
        let sha = hex::encode(Sha256::digest(&bytes));
        self.publish_with_checksum(version, bytes, sha);
    }

    fn publish_with_checksum(&mut self, version: &str, bytes: Vec<u8>, sha: String) {
        let url = prebuilt_url(TEMPLATE, &v(version), RELEASE);
        self.files.insert(url, (bytes, sha));
    }
}

impl PrebuiltSource for Server {
    fn fetch(&self, version: &KmdVersion, release: &str) -> Result<FetchedKo, PrebuiltFetchError> {
        let url = prebuilt_url(TEMPLATE, version, release);
        self.fetches.fetch_add(1, Ordering::SeqCst);
        if self.down {
            return Err(PrebuiltFetchError::Failed {
                url,
                message: "connection refused".into(),
            });
        }
        let (bytes, sha256) = self
            .files
            .get(&url)
            .cloned()
            .ok_or(PrebuiltFetchError::NotFound { url: url.clone() })?;
        Ok(FetchedKo { url, bytes, sha256 })
    }

    fn fallback(&self) -> PrebuiltFallback {
        self.fallback
    }

    fn pins(&self) -> &PrebuiltPins {
        &self.pins
    }
}

/// The `.ko` of `version` built for kernel `release` by a host of its own.
fn ko_for(fx: &Fixture, version: &str, release: &str) -> Vec<u8> {
    let other = tempfile::tempdir().unwrap();
    let host = SimHost::create(other.path().join("host"), release).unwrap();
    let built = build_module(host.host(), release, &v(version), &fx.build_options()).unwrap();
    std::fs::read(&built.ko_path).unwrap()
}

/// The fixture with 1.0.0 loaded, and an installer asking `server` on a miss.
fn loaded_with(fx: &Fixture, server: Server) -> ModuleInstaller<SimKernel> {
    loaded_with_shared(fx, Arc::new(server))
}

/// [`loaded_with`], the test keeping a handle on the server.
fn loaded_with_shared(fx: &Fixture, server: Arc<Server>) -> ModuleInstaller<SimKernel> {
    fx.installer()
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.installer().with_prebuilt(server)
}

/// The same module with bytes appended: another file (another checksum) that still passes
/// every check of its own, as a rebuilt or tampered module would.
fn another_build_of(ko: &[u8]) -> Vec<u8> {
    let mut other = ko.to_vec();
    other.extend_from_slice(b"\0another build");
    other
}

fn assert_untouched(installer: &ModuleInstaller<SimKernel>) {
    assert_eq!(
        installer.status().unwrap().loaded_version(),
        Some("1.0.0"),
        "the working driver stays loaded"
    );
    assert_eq!(
        installer.cache().lookup(RELEASE, &v("2.0.0")).unwrap(),
        CacheLookup::Miss,
        "nothing was cached"
    );
}

#[test]
fn a_prebuilt_module_is_downloaded_checked_cached_and_loaded_without_a_build() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let mut server = Server::trusted();
    server.publish("2.0.0", ko_for(&fx, "2.0.0", RELEASE));
    let installer = loaded_with(&fx, server);

    let ensured = installer.ensure_ko(&v("2.0.0")).unwrap();
    let url = prebuilt_url(TEMPLATE, &v("2.0.0"), RELEASE);
    assert_eq!(
        ensured.cache,
        ttdp_kmod::CacheOutcome::Downloaded { url: url.clone() }
    );
    assert_eq!(ensured.build_ms, 0);
    let record = &ensured.ko.record;
    assert_eq!(record.source_repository, url, "the record names the URL");
    assert_eq!(
        record.source_commit, None,
        "a prebuilt module names no commit"
    );
    assert!(record.vermagic.starts_with(RELEASE), "{record:?}");

    installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(installer.status().unwrap().loaded_version(), Some("2.0.0"));
    assert!(
        matches!(
            installer.cache().lookup(RELEASE, &v("2.0.0")).unwrap(),
            CacheLookup::Hit(_)
        ),
        "the download is a verified cache entry"
    );
}

#[test]
fn a_wrong_checksum_is_refused_and_nothing_changes() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let mut server = Server::trusted();
    let ko = ko_for(&fx, "2.0.0", RELEASE);
    server.publish_with_checksum("2.0.0", ko, "0".repeat(64));
    let installer = loaded_with(&fx, server);

    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "PrebuiltRejected", "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("checksum mismatch") && msg.contains(&"0".repeat(64)),
        "{msg}"
    );
    assert!(msg.contains("nothing was loaded or unloaded"), "{msg}");
    assert_untouched(&installer);
}

#[test]
fn a_module_for_another_kernel_is_refused_by_its_vermagic() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let mut server = Server::trusted();
    server.publish("2.0.0", ko_for(&fx, "2.0.0", "6.9.0-other"));
    let installer = loaded_with(&fx, server);

    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    let KmodError::PrebuiltRejected { reason, .. } = &err else {
        panic!("{err}")
    };
    assert!(
        reason.contains("vermagic 6.9.0-other") && reason.contains(RELEASE),
        "{reason}"
    );
    assert_untouched(&installer);
}

#[test]
fn a_module_declaring_another_version_is_refused() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let mut server = Server::trusted();
    server.publish("2.0.0", ko_for(&fx, "1.0.0", RELEASE));
    let installer = loaded_with(&fx, server);

    let err = installer.ensure_ko(&v("2.0.0")).unwrap_err();
    let KmodError::PrebuiltRejected { reason, .. } = &err else {
        panic!("{err}")
    };
    assert!(
        reason.contains("declares version 1.0.0") && reason.contains("expected version 2.0.0"),
        "{reason}"
    );
    assert_untouched(&installer);
}

#[test]
fn a_missing_module_is_built_when_the_fallback_is_build() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let installer = loaded_with(&fx, Server::trusted());

    let ensured = installer.ensure_ko(&v("2.0.0")).unwrap();
    assert_eq!(ensured.cache, ttdp_kmod::CacheOutcome::Miss);
    assert_eq!(
        ensured.ko.record.source_commit,
        Some(fx.repo.tag_commit("2.0.0").unwrap()),
        "built from the tag"
    );
}

#[test]
fn a_missing_module_fails_without_a_build_when_the_fallback_is_fail() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let server = Server {
        fallback: PrebuiltFallback::Fail,
        ..Server::trusted()
    };
    let installer = loaded_with(&fx, server);

    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "PrebuiltMissing", "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&prebuilt_url(TEMPLATE, &v("2.0.0"), RELEASE))
            && msg.contains("nothing was built"),
        "{msg}"
    );
    assert_untouched(&installer);
}

#[test]
fn an_unreachable_server_fails_the_install_and_builds_nothing() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let server = Server {
        down: true,
        ..Server::trusted()
    };
    let installer = loaded_with(&fx, server);

    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "PrebuiltFetchFailed", "{err}");
    assert!(err.to_string().contains("connection refused"), "{err}");
    assert_untouched(&installer);
}

#[test]
fn a_download_without_a_pinned_checksum_is_not_trusted_on_the_servers_word() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let mut server = Server::default();
    server.publish("2.0.0", ko_for(&fx, "2.0.0", RELEASE));
    let server = Arc::new(server);
    let installer = loaded_with_shared(&fx, Arc::clone(&server));

    // fallback Build: built from its tag as if the server had no file; the server is not asked
    let ensured = installer.ensure_ko(&v("2.0.0")).unwrap();
    assert_eq!(ensured.cache, ttdp_kmod::CacheOutcome::Miss);
    assert_eq!(
        ensured.ko.record.source_commit,
        Some(fx.repo.tag_commit("2.0.0").unwrap())
    );
    assert_eq!(server.fetches.load(Ordering::SeqCst), 0);

    // fallback Fail: refused, saying what to pin
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let mut server = Server {
        fallback: PrebuiltFallback::Fail,
        ..Server::default()
    };
    server.publish("2.0.0", ko_for(&fx, "2.0.0", RELEASE));
    let installer = loaded_with(&fx, server);
    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "PrebuiltUnpinned", "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("2.0.0/{RELEASE}"))
            && msg.contains("spec.source.prebuilt.checksums")
            && msg.contains("nothing was built, loaded or unloaded"),
        "{msg}"
    );
    assert_untouched(&installer);
}

#[test]
fn a_file_the_server_vouches_for_is_refused_when_it_is_not_the_pinned_one() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let ko = ko_for(&fx, "2.0.0", RELEASE);
    // the server (or whoever controls it) publishes another file with its matching checksum
    let mut server = Server::pinned(&[("2.0.0", &ko)]);
    server.publish("2.0.0", another_build_of(&ko));
    let installer = loaded_with(&fx, server);

    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "PrebuiltRejected", "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&hex::encode(Sha256::digest(&ko)))
            && msg.contains("spec.source.prebuilt.checksums pins"),
        "{msg}"
    );
    assert_untouched(&installer);

    // the pinned file itself is downloaded and loaded
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let ko = ko_for(&fx, "2.0.0", RELEASE);
    let mut server = Server::pinned(&[("2.0.0", &ko)]);
    server.publish("2.0.0", ko.clone());
    let installer = loaded_with(&fx, server);
    let ensured = installer.ensure_ko(&v("2.0.0")).unwrap();
    assert!(matches!(
        ensured.cache,
        ttdp_kmod::CacheOutcome::Downloaded { .. }
    ));
    assert_eq!(ensured.ko.record.sha256, hex::encode(Sha256::digest(&ko)));
}

#[test]
fn a_pinned_file_the_server_lacks_is_never_built_around() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let ko = ko_for(&fx, "2.0.0", RELEASE);
    // fallback Build, but a build could not match the pinned checksum
    let installer = loaded_with(&fx, Server::pinned(&[("2.0.0", &another_build_of(&ko))]));

    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "PrebuiltMissing", "{err}");
    assert!(err.to_string().contains("pinned"), "{err}");
    assert_untouched(&installer);
}

#[test]
fn a_pinned_checksum_binds_a_cache_entry_whatever_its_origin() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    // 2.0.0 built here and cached before the policy pinned another file
    fx.installer().ensure_ko(&v("2.0.0")).unwrap();
    let published = another_build_of(&ko_for(&fx, "2.0.0", RELEASE));
    let mut server = Server::pinned(&[("2.0.0", &published)]);
    server.publish("2.0.0", published.clone());
    let installer = loaded_with(&fx, server);

    let ensured = installer.ensure_ko(&v("2.0.0")).unwrap();
    assert!(
        matches!(&ensured.cache, ttdp_kmod::CacheOutcome::Downloaded { .. }),
        "the built entry is replaced by the pinned file: {:?}",
        ensured.cache
    );
    assert_eq!(
        ensured.ko.record.sha256,
        hex::encode(Sha256::digest(&published))
    );
    let again = installer.ensure_ko(&v("2.0.0")).unwrap();
    assert_eq!(again.cache, ttdp_kmod::CacheOutcome::Hit, "now it is kept");
}

#[test]
fn a_commit_pin_refuses_a_cached_download_that_names_no_commit() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let mut server = Server::trusted();
    server.publish("2.0.0", another_build_of(&ko_for(&fx, "2.0.0", RELEASE)));
    let server = Arc::new(server);
    let installer = loaded_with_shared(&fx, Arc::clone(&server));
    let downloaded = installer.ensure_ko(&v("2.0.0")).unwrap();
    assert_eq!(downloaded.ko.record.source_commit, None);
    assert_eq!(server.fetches.load(Ordering::SeqCst), 1);

    // the policy now pins the tag's commit: the download cannot show it, so it is rebuilt
    let commit = fx.repo.tag_commit("2.0.0").unwrap();
    let ensured = installer
        .ensure_pinned_ko(&v("2.0.0"), Some(&commit))
        .unwrap();
    let ttdp_kmod::CacheOutcome::Rebuilt { reason } = &ensured.cache else {
        panic!("{:?}", ensured.cache)
    };
    assert!(
        reason.contains("names no commit") && reason.contains(&commit),
        "{reason}"
    );
    assert_eq!(
        ensured.ko.record.source_commit.as_deref(),
        Some(commit.as_str())
    );
    assert_eq!(
        server.fetches.load(Ordering::SeqCst),
        1,
        "a commit pin is not met by the server's word"
    );
}
