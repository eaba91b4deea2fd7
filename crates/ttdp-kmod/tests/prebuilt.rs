//! `spec.source.prebuilt`: on a cache miss the installer downloads a ready-built `.ko` (through
//! the caller's [`PrebuiltSource`]), checks its published checksum, the version it declares and
//! its vermagic against the running kernel, and caches it as if it were built here. A file that
//! fails a check, or cannot be fetched, never unloads the working driver and is never cached;
//! a missing file is built or refused as the fallback says.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::collections::HashMap;
use std::sync::Arc;

use fixture::{Fixture, RELEASE, v};
use sha2::{Digest, Sha256};
use ttdp_kmod::prebuilt::{
    FetchedKo, PrebuiltFallback, PrebuiltFetchError, PrebuiltSource, prebuilt_url,
};
use ttdp_kmod::{
    CacheLookup, KmdVersion, KmodError, ModuleInstaller, SimHost, SimKernel, SwapOptions,
    build_module,
};

const TEMPLATE: &str = "http://ko.test/tt-kmd/{version}/{kernelRelease}/tenstorrent.ko";

/// A server in memory: URL to (file, published checksum); `down` answers every request with a
/// connection error.
#[derive(Debug, Default)]
struct Server {
    files: HashMap<String, (Vec<u8>, String)>,
    fallback: PrebuiltFallback,
    down: bool,
}

impl Server {
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
    fx.installer()
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.installer().with_prebuilt(Arc::new(server))
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
    let mut server = Server::default();
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
    let mut server = Server::default();
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
    let mut server = Server::default();
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
    let mut server = Server::default();
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
    let installer = loaded_with(&fx, Server::default());

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
        ..Server::default()
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
        ..Server::default()
    };
    let installer = loaded_with(&fx, server);

    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "PrebuiltFetchFailed", "{err}");
    assert!(err.to_string().contains("connection refused"), "{err}");
    assert_untouched(&installer);
}
