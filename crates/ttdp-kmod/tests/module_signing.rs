//! Signing with a key of the test's own (made by `openssl` here, never kept): a built module is
//! signed by the kernel's `sign-file` before it is cached, its signature checks out with the
//! certificate (`openssl smime -verify`), an entry signed by another key or not at all is
//! re-signed in place, a missing key fails with the reason the node shows, and where the kernel
//! enforces signatures and does not list the key nothing is unloaded.
//!
//! Needs `openssl` and a kernel `sign-file` (Debian's `linux-kbuild-*`, installed with the
//! headers by `.ci/vm-deps`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixture;

use std::path::{Path, PathBuf};
use std::process::Command;

use fixture::{Fixture, RELEASE, v};
use ttdp_kmod::module_signature::{CertificateId, appended_signature, unsigned_content};
use ttdp_kmod::{CacheLookup, CacheOutcome, SigningConfig, SwapOptions};

/// A fresh RSA key and self-signed certificate with common name `name`, in `dir`.
fn make_key(dir: &Path, name: &str) -> SigningConfig {
    std::fs::create_dir_all(dir).unwrap();
    let (key, cert) = (dir.join("tls.key"), dir.join("tls.crt"));
    let status = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .arg("-subj")
        .arg(format!("/CN={name}"))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl must be installed (.ci/deps)");
    assert!(status.status.success(), "{status:?}");
    SigningConfig {
        key,
        cert,
        source: format!("Secret test/{name}"),
    }
}

fn cert_of(config: &SigningConfig) -> CertificateId {
    CertificateId::parse(&std::fs::read(&config.cert).unwrap()).unwrap()
}

fn cached_ko(fx: &Fixture, version: &str) -> PathBuf {
    fx.sim.host().path(format!(
        "/var/cache/tt-kmd/{RELEASE}/{version}/tenstorrent.ko"
    ))
}

/// Checks the appended PKCS#7 against the certificate with openssl, over the module without
/// its signature: what the kernel checks, without the kernel.
fn openssl_verifies(ko: &Path, cert: &Path, work: &Path) -> bool {
    let bytes = std::fs::read(ko).unwrap();
    let signature = appended_signature(&bytes).unwrap().unwrap();
    let (content, p7) = (work.join("content"), work.join("sig.p7"));
    std::fs::write(&content, &bytes[..signature.content_len]).unwrap();
    std::fs::write(&p7, &signature.pkcs7).unwrap();
    Command::new("openssl")
        .args([
            "smime",
            "-verify",
            "-binary",
            "-inform",
            "DER",
            "-noverify",
            "-nointern",
        ])
        .arg("-in")
        .arg(&p7)
        .arg("-content")
        .arg(&content)
        .arg("-certfile")
        .arg(cert)
        .arg("-out")
        .arg("/dev/null")
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn a_built_module_is_signed_before_it_is_cached_and_verifies_with_the_certificate() {
    let fx = Fixture::new(&["1.0.0"]);
    let key = make_key(&fx.dir.path().join("key-a"), "ttdp test signing A");
    let installer = fx.installer().with_signing(key.clone());
    let ensured = installer.ensure_ko(&v("1.0.0")).unwrap();
    assert_eq!(ensured.cache, CacheOutcome::Miss);
    let bytes = std::fs::read(cached_ko(&fx, "1.0.0")).unwrap();
    let signature = appended_signature(&bytes).unwrap().expect("signed");
    let cert = cert_of(&key);
    assert!(signature.signer.is(&cert));
    assert_eq!(signature.signer.name, "ttdp test signing A");
    assert_eq!(signature.signer.key, cert.serial_text);
    let recorded = ensured
        .ko
        .record
        .signature
        .clone()
        .expect("the record keeps the signer");
    assert_eq!(
        (recorded.signer.as_str(), recorded.key.as_str()),
        ("ttdp test signing A", cert.serial_text.as_str())
    );
    assert!(openssl_verifies(
        &cached_ko(&fx, "1.0.0"),
        &key.cert,
        fx.dir.path()
    ));
    let other = make_key(&fx.dir.path().join("key-b"), "someone else");
    assert!(
        !openssl_verifies(&cached_ko(&fx, "1.0.0"), &other.cert, fx.dir.path()),
        "the check can fail: another certificate does not verify it"
    );
    // still a verified entry, and the fast path takes it as it is
    assert!(matches!(
        installer.cache().lookup(RELEASE, &v("1.0.0")).unwrap(),
        CacheLookup::Hit(_)
    ));
    assert!(installer.cached_ko(&v("1.0.0"), None).is_some());
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(
        installer.status().unwrap().signer.as_deref(),
        Some("ttdp test signing A"),
        "the loaded module's signer"
    );
}

#[test]
fn entries_signed_by_another_key_or_unsigned_are_re_signed_with_one_signature() {
    let fx = Fixture::new(&["1.0.0"]);
    let plain = fx.installer();
    plain.ensure_ko(&v("1.0.0")).unwrap();
    let unsigned = std::fs::read(cached_ko(&fx, "1.0.0")).unwrap();
    assert_eq!(appended_signature(&unsigned).unwrap(), None);

    let key_a = make_key(&fx.dir.path().join("key-a"), "key A");
    let signed_a = fx.installer().with_signing(key_a.clone());
    assert!(
        signed_a.cached_ko(&v("1.0.0"), None).is_none(),
        "the fast path does not take an unsigned entry when signing is asked for"
    );
    let ensured = signed_a.ensure_ko(&v("1.0.0")).unwrap();
    let CacheOutcome::Resigned { reason } = &ensured.cache else {
        panic!("{:?}", ensured.cache)
    };
    assert!(reason.contains("not signed"), "{reason}");
    let bytes = std::fs::read(cached_ko(&fx, "1.0.0")).unwrap();
    assert!(
        appended_signature(&bytes)
            .unwrap()
            .unwrap()
            .signer
            .is(&cert_of(&key_a))
    );
    assert_eq!(unsigned_content(&bytes), &unsigned[..]);

    let key_b = make_key(&fx.dir.path().join("key-b"), "key B");
    let signed_b = fx.installer().with_signing(key_b.clone());
    let ensured = signed_b.ensure_ko(&v("1.0.0")).unwrap();
    let CacheOutcome::Resigned { reason } = &ensured.cache else {
        panic!("{:?}", ensured.cache)
    };
    assert!(reason.contains("signed by key A"), "{reason}");
    let bytes = std::fs::read(cached_ko(&fx, "1.0.0")).unwrap();
    assert!(
        appended_signature(&bytes)
            .unwrap()
            .unwrap()
            .signer
            .is(&cert_of(&key_b))
    );
    assert_eq!(
        unsigned_content(&bytes),
        &unsigned[..],
        "the old signature was stripped: the module carries one, B's"
    );
    assert!(openssl_verifies(
        &cached_ko(&fx, "1.0.0"),
        &key_b.cert,
        fx.dir.path()
    ));
    let record = ensured.ko.record.signature.unwrap();
    assert_eq!(record.signer, "key B");
    assert_eq!(
        record.signed_from_sha256.as_deref(),
        Some(hex_sha256(&unsigned).as_str()),
        "the record remembers the file as it was before ttdp signed it"
    );
    assert_eq!(
        signed_b.ensure_ko(&v("1.0.0")).unwrap().cache,
        CacheOutcome::Hit,
        "signed by the key now: kept"
    );
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[test]
fn a_missing_key_fails_with_the_reason_naming_where_it_comes_from() {
    let fx = Fixture::new(&["1.0.0"]);
    let missing = SigningConfig {
        key: fx.dir.path().join("nowhere/tls.key"),
        cert: fx.dir.path().join("nowhere/tls.crt"),
        source: "Secret ttdp-system/tt-kmd-signing".into(),
    };
    let installer = fx.installer().with_signing(missing);
    let err = installer.ensure_ko(&v("1.0.0")).unwrap_err();
    assert_eq!(err.reason(), "SigningKeyUnusable");
    let text = err.to_string();
    assert!(
        text.contains("Secret ttdp-system/tt-kmd-signing")
            && text.contains("tls.crt")
            && text.contains("nothing was loaded or unloaded"),
        "{text}"
    );
    assert!(
        !cached_ko(&fx, "1.0.0").exists(),
        "nothing unsigned was cached"
    );
    let key = make_key(&fx.dir.path().join("half"), "half");
    std::fs::remove_file(&key.key).unwrap();
    let err = fx
        .installer()
        .with_signing(key)
        .ensure_ko(&v("1.0.0"))
        .unwrap_err();
    assert!(err.to_string().contains("private key"), "{err}");
}

#[test]
fn an_enforcing_kernel_that_does_not_list_the_key_keeps_the_loaded_module() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let key = make_key(&fx.dir.path().join("key"), "tt-kmd fleet key");
    let installer = fx.installer().with_signing(key.clone());
    installer
        .swap(&v("1.0.0"), &SwapOptions::default())
        .unwrap();
    fx.sim.enforce_signatures(true).unwrap();
    let keys = fx.sim.host().path("/proc/keys");
    let listing = "0ab4e1c2 I------     1 perm 1f0b0000     0     0 keyring   .builtin_trusted_keys: 1\n\
                   1d8b5b61 I------     1 perm 1f030000     0     0 asymmetric Debian Secure Boot CA: 6ccece7e4c6c0d1f6149f3dd27dfcc5cbb419ea1: X509.rsa bb419ea1 []\n";
    std::fs::write(&keys, listing).unwrap();
    let err = installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap_err();
    assert_eq!(err.reason(), "SignerNotTrusted");
    let text = err.to_string();
    assert!(
        text.contains("signed by tt-kmd fleet key")
            && text.contains("mokutil --import cert.der")
            && text.contains("nothing was unloaded"),
        "{text}"
    );
    assert_eq!(installer.status().unwrap().loaded_version(), Some("1.0.0"));

    // once the kernel lists the key (enrolled), the same swap goes ahead
    let id = cert_of(&key).kernel_key_id;
    std::fs::write(
        &keys,
        format!(
            "{listing}2c4f1a0e I------     1 perm 1f030000     0     0 asymmetric tt-kmd fleet key: {id}: X509.rsa 00000000 []\n"
        ),
    )
    .unwrap();
    installer
        .swap(&v("2.0.0"), &SwapOptions::default())
        .unwrap();
    assert_eq!(installer.status().unwrap().loaded_version(), Some("2.0.0"));
}

/// A prebuilt server in memory holding one file per version, its checksum pinned by the policy.
#[derive(Debug)]
struct PinnedServer {
    files: std::collections::HashMap<String, Vec<u8>>,
    pins: ttdp_kmod::prebuilt::PrebuiltPins,
    fetches: std::sync::atomic::AtomicUsize,
}

const TEMPLATE: &str = "http://ko.test/{version}/{kernelRelease}/tenstorrent.ko";

impl PinnedServer {
    fn new(files: &[(&str, Vec<u8>)]) -> Self {
        let pins = ttdp_kmod::prebuilt::PrebuiltPins {
            sha256: files
                .iter()
                .map(|(version, ko)| {
                    let key = ttdp_kmod::prebuilt::pin_key(&v(version), RELEASE);
                    (key, hex_sha256(ko))
                })
                .collect(),
            trust_server_checksum: false,
        };
        let files = files
            .iter()
            .map(|(version, ko)| {
                let url = ttdp_kmod::prebuilt::prebuilt_url(TEMPLATE, &v(version), RELEASE);
                (url, ko.clone())
            })
            .collect();
        Self {
            files,
            pins,
            fetches: Default::default(),
        }
    }
}

impl ttdp_kmod::prebuilt::PrebuiltSource for PinnedServer {
    fn fetch(
        &self,
        version: &ttdp_kmod::KmdVersion,
        release: &str,
    ) -> Result<ttdp_kmod::prebuilt::FetchedKo, ttdp_kmod::prebuilt::PrebuiltFetchError> {
        let url = ttdp_kmod::prebuilt::prebuilt_url(TEMPLATE, version, release);
        self.fetches
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let bytes = self
            .files
            .get(&url)
            .cloned()
            .ok_or(ttdp_kmod::prebuilt::PrebuiltFetchError::NotFound { url: url.clone() })?;
        let sha256 = hex_sha256(&bytes);
        Ok(ttdp_kmod::prebuilt::FetchedKo { url, bytes, sha256 })
    }

    fn fallback(&self) -> ttdp_kmod::prebuilt::PrebuiltFallback {
        ttdp_kmod::prebuilt::PrebuiltFallback::Fail
    }

    fn pins(&self) -> &ttdp_kmod::prebuilt::PrebuiltPins {
        &self.pins
    }
}

#[test]
fn prebuilt_modules_signed_by_the_key_are_kept_and_others_re_signed_under_their_pin() {
    let fx = Fixture::new(&["1.0.0", "2.0.0"]);
    let key = make_key(&fx.dir.path().join("key"), "tt-kmd fleet key");
    let build = |version: &str| {
        let other = tempfile::tempdir().unwrap();
        let host = ttdp_kmod::SimHost::create(other.path().join("host"), RELEASE).unwrap();
        let built = ttdp_kmod::build_module(host.host(), RELEASE, &v(version), &fx.build_options())
            .unwrap();
        (std::fs::read(&built.ko_path).unwrap(), other)
    };
    let (unsigned, _a) = build("1.0.0");
    let (to_sign, _b) = build("2.0.0");
    let signed_path = fx.dir.path().join("published-2.0.0.ko");
    std::fs::write(&signed_path, &to_sign).unwrap();
    let sign_file =
        ttdp_kmod::module_signing::find_sign_file(fx.sim.host(), None, RELEASE).unwrap();
    ttdp_kmod::SigningKey::open(&key)
        .unwrap()
        .sign(&sign_file, &signed_path)
        .unwrap();
    let signed = std::fs::read(&signed_path).unwrap();
    let server = std::sync::Arc::new(PinnedServer::new(&[
        ("1.0.0", unsigned.clone()),
        ("2.0.0", signed.clone()),
    ]));
    let installer = fx
        .installer()
        .with_prebuilt(server.clone())
        .with_signing(key.clone());

    let ensured = installer.ensure_ko(&v("2.0.0")).unwrap();
    assert!(matches!(ensured.cache, CacheOutcome::Downloaded { .. }));
    assert_eq!(
        std::fs::read(cached_ko(&fx, "2.0.0")).unwrap(),
        signed,
        "a download signed by the key is kept as published"
    );

    let ensured = installer.ensure_ko(&v("1.0.0")).unwrap();
    assert!(matches!(ensured.cache, CacheOutcome::Downloaded { .. }));
    let cached = std::fs::read(cached_ko(&fx, "1.0.0")).unwrap();
    assert!(
        appended_signature(&cached)
            .unwrap()
            .unwrap()
            .signer
            .is(&cert_of(&key))
    );
    assert_eq!(unsigned_content(&cached), &unsigned[..]);
    assert_eq!(server.fetches.load(std::sync::atomic::Ordering::SeqCst), 2);
    // the pinned checksum still names the re-signed entry: a hit, not a new download
    assert_eq!(
        installer.ensure_ko(&v("1.0.0")).unwrap().cache,
        CacheOutcome::Hit
    );
    assert!(installer.cached_ko(&v("1.0.0"), None).is_some());
    assert_eq!(server.fetches.load(std::sync::atomic::Ordering::SeqCst), 2);
}
