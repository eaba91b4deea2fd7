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
