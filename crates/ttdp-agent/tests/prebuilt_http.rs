//! Prebuilt modules over real HTTP(S) on loopback: the agent's client downloads a `.ko` and its
//! `.sha256`, follows a redirect, tells a missing file from a broken server, trusts an HTTPS
//! server only through the policy's CA bundle; and a whole agent installs from the server
//! without building, or keeps its working driver when the server's file is wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Node, RELEASE, Recording, v};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use ttdp_agent::prebuilt_fetch::{HttpPrebuiltSource, PrebuiltConfig};
use ttdp_agent::proxy::ProxySettings;
use ttdp_agent::{NodeAgent, NodeKernel};
use ttdp_api::agent_report::AgentPhase;
use ttdp_kmod::prebuilt::{
    FetchedKo, PrebuiltFallback, PrebuiltFetchError, PrebuiltPins, PrebuiltSource,
};
use ttdp_kmod::{CacheLookup, KoCache, SimHost, build_module};

/// One answer of the test server: status, extra header lines, body.
#[derive(Clone)]
struct Answer(u16, String, Vec<u8>);

fn file(bytes: &[u8]) -> Answer {
    Answer(200, String::new(), bytes.to_vec())
}

/// A loopback HTTP(S) server answering from a path table (404 for anything else).
struct Server {
    base: String,
}

impl Server {
    async fn start(paths: HashMap<String, Answer>, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let paths = Arc::new(paths);
        let scheme = if tls.is_some() { "https" } else { "http" };
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (paths, tls) = (Arc::clone(&paths), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(stream).await {
                                serve(stream, &paths).await;
                            }
                        }
                        None => serve(stream, &paths).await,
                    }
                });
            }
        });
        Self {
            base: format!("{scheme}://localhost:{port}"),
        }
    }

    /// The URL template for this server, laid out as `cargo xtask prebuild` writes.
    fn template(&self) -> String {
        format!(
            "{}/tt-kmd/{{version}}/{{kernelRelease}}/tenstorrent.ko",
            self.base
        )
    }
}

/// Answers one request per connection (the client is told to close).
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, paths: &HashMap<String, Answer>) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&request);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    let Answer(status, headers, body) =
        paths
            .get(&path)
            .cloned()
            .unwrap_or(Answer(404, String::new(), b"not found".to_vec()));
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n{headers}\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&body).await;
    let _ = stream.shutdown().await;
}

fn ko_path(version: &str) -> String {
    format!("/tt-kmd/{version}/{RELEASE}/tenstorrent.ko")
}

/// The `.ko` of `version` built for `release`, and the table serving it with its checksum.
fn published(node: &Node, version: &str, release: &str) -> (Vec<u8>, HashMap<String, Answer>) {
    let other = tempfile::tempdir().unwrap();
    let host = SimHost::create(other.path().join("host"), release).unwrap();
    let options = node.config(version).build_options(release);
    let built = build_module(host.host(), release, &v(version), &options).unwrap();
    let ko = std::fs::read(&built.ko_path).unwrap();
    let sum = format!("{}  tenstorrent.ko\n", hex::encode(Sha256::digest(&ko)));
    let paths = HashMap::from([
        (ko_path(version), file(&ko)),
        (format!("{}.sha256", ko_path(version)), file(sum.as_bytes())),
    ]);
    (ko, paths)
}

/// A configuration for the test server at `template`: plain http allowed (most tests serve
/// http) and the server's checksums trusted; redirects stay on its host.
fn lenient(template: String) -> PrebuiltConfig {
    PrebuiltConfig {
        allow_insecure_http: true,
        pins: PrebuiltPins {
            trust_server_checksum: true,
            ..PrebuiltPins::default()
        },
        ..PrebuiltConfig::new(template, PrebuiltFallback::Fail)
    }
}

fn source(template: String, ca_file: Option<PathBuf>) -> Arc<HttpPrebuiltSource> {
    source_with(PrebuiltConfig {
        ca_file,
        ..lenient(template)
    })
}

fn source_with(config: PrebuiltConfig) -> Arc<HttpPrebuiltSource> {
    Arc::new(HttpPrebuiltSource::new(config, Duration::from_secs(20)).unwrap())
}

/// Fetches `version` from a blocking thread, as the installer does.
async fn fetch(
    source: &Arc<HttpPrebuiltSource>,
    version: &str,
) -> Result<FetchedKo, PrebuiltFetchError> {
    let source = Arc::clone(source);
    let version = v(version);
    tokio::task::spawn_blocking(move || source.fetch(&version, RELEASE))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_ko_and_its_checksum_are_downloaded_over_http() {
    let node = Node::new(&["2.0.0"]);
    let (ko, paths) = published(&node, "2.0.0", RELEASE);
    let server = Server::start(paths, None).await;
    let fetched = fetch(&source(server.template(), None), "2.0.0")
        .await
        .unwrap();
    assert_eq!(fetched.bytes, ko);
    assert_eq!(fetched.sha256, hex::encode(Sha256::digest(&ko)));
    assert_eq!(fetched.url, format!("{}{}", server.base, ko_path("2.0.0")));
}

#[tokio::test]
async fn a_redirect_is_followed() {
    let node = Node::new(&["2.0.0"]);
    let (ko, mut paths) = published(&node, "2.0.0", RELEASE);
    let moved = |to: &str| Answer(302, format!("location: {to}\r\n"), Vec::new());
    let real = paths.remove(&ko_path("2.0.0")).unwrap();
    paths.insert("/store/tenstorrent.ko".into(), real);
    paths.insert(ko_path("2.0.0"), moved("/store/tenstorrent.ko"));
    let server = Server::start(paths, None).await;
    let fetched = fetch(&source(server.template(), None), "2.0.0")
        .await
        .unwrap();
    assert_eq!(fetched.bytes, ko);
}

#[tokio::test]
async fn a_missing_file_is_told_apart_from_a_broken_server() {
    let node = Node::new(&["2.0.0"]);
    let (_, mut paths) = published(&node, "2.0.0", RELEASE);
    paths.insert(
        ko_path("3.0.0"),
        Answer(500, String::new(), b"disk full".to_vec()),
    );
    paths.insert(ko_path("4.0.0"), file(b"a module without a checksum"));
    let server = Server::start(paths, None).await;
    let source = source(server.template(), None);

    let missing = fetch(&source, "9.9.9").await.unwrap_err();
    assert!(
        matches!(&missing, PrebuiltFetchError::NotFound { url } if url.ends_with("/9.9.9/6.8.0-sim/tenstorrent.ko")),
        "{missing}"
    );
    let broken = fetch(&source, "3.0.0").await.unwrap_err();
    assert!(
        matches!(&broken, PrebuiltFetchError::Failed { message, .. } if message.contains("500")),
        "{broken}"
    );
    let no_sum = fetch(&source, "4.0.0").await.unwrap_err();
    assert!(
        no_sum.to_string().contains("not its checksum file"),
        "{no_sum}"
    );

    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let template = format!("http://127.0.0.1:{port}/{{version}}/{{kernelRelease}}/tenstorrent.ko");
    let down = fetch(&self::source(template, None), "2.0.0")
        .await
        .unwrap_err();
    assert!(
        matches!(&down, PrebuiltFetchError::Failed { message, .. } if message.to_lowercase().contains("refused")),
        "{down}"
    );
}

/// A CA, and a TLS acceptor for `localhost` signed by it.
fn tls_server(dir: &std::path::Path) -> (tokio_rustls::TlsAcceptor, PathBuf) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    )
    .unwrap();
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca_file)
}

#[tokio::test]
async fn https_is_trusted_through_the_policy_ca_bundle_only() {
    let node = Node::new(&["2.0.0"]);
    let (ko, paths) = published(&node, "2.0.0", RELEASE);
    let (tls, ca_file) = tls_server(node.dir.path());
    let server = Server::start(paths, Some(tls)).await;
    assert!(server.base.starts_with("https://"));

    let fetched = fetch(&source(server.template(), Some(ca_file)), "2.0.0")
        .await
        .unwrap();
    assert_eq!(fetched.bytes, ko);

    let untrusted = fetch(&source(server.template(), None), "2.0.0")
        .await
        .unwrap_err();
    assert!(
        untrusted.to_string().to_lowercase().contains("certificate"),
        "{untrusted}"
    );

    let garbage = node.dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let config = PrebuiltConfig {
        ca_file: Some(garbage),
        ..PrebuiltConfig::new(server.template(), PrebuiltFallback::Build)
    };
    let err = HttpPrebuiltSource::new(config, Duration::from_secs(5)).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("TT_KMD_PREBUILT_CA_FILE") && msg.contains("no PEM certificate"),
        "{msg}"
    );
}

#[tokio::test]
async fn plain_http_is_refused_unless_the_policy_allows_it() {
    let node = Node::new(&["2.0.0"]);
    let (ko, paths) = published(&node, "2.0.0", RELEASE);
    let server = Server::start(paths, None).await;
    assert!(server.base.starts_with("http://"));

    let strict = PrebuiltConfig::new(server.template(), PrebuiltFallback::Build);
    let err = HttpPrebuiltSource::new(strict, Duration::from_secs(5)).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("TT_KMD_PREBUILT_URL")
            && msg.contains("allowInsecureHttp")
            && msg.contains("TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP"),
        "{msg}"
    );

    let allowed = fetch(&source(server.template(), None), "2.0.0")
        .await
        .unwrap();
    assert_eq!(allowed.bytes, ko);
}

/// An HTTP proxy on loopback that tunnels CONNECT requests (or refuses them with 403),
/// recording each target.
struct ConnectProxy {
    url: String,
    targets: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    async fn start(refuse: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let targets = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&targets);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(tunnel(client, Arc::clone(&seen), refuse));
            }
        });
        Self { url, targets }
    }

    fn targets(&self) -> Vec<String> {
        std::mem::take(&mut *self.targets.lock().unwrap())
    }
}

/// Reads one `CONNECT host:port` request, then relays bytes both ways (or refuses).
async fn tunnel(mut client: tokio::net::TcpStream, seen: Arc<Mutex<Vec<String>>>, refuse: bool) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && client.read_exact(&mut byte).await.is_ok() {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut words = head.split_whitespace();
    let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
        return;
    };
    seen.lock().unwrap().push(target.to_owned());
    if refuse {
        let _ = client.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").await;
        return;
    }
    let Ok(mut server) = tokio::net::TcpStream::connect(target).await else {
        return;
    };
    let _ = client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await;
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

#[tokio::test]
async fn downloads_go_through_the_https_proxy_unless_no_proxy_names_the_host() {
    let node = Node::new(&["2.0.0"]);
    let (ko, paths) = published(&node, "2.0.0", RELEASE);
    let (server, ca_file) = https_server(&node, "proxied", paths).await;
    let host_port = server.base.trim_start_matches("https://").to_owned();
    let proxy = ConnectProxy::start(false).await;
    let through = |proxy: &ConnectProxy, no: Option<&str>| PrebuiltConfig {
        ca_file: Some(ca_file.clone()),
        proxies: ProxySettings {
            https: Some(proxy.url.clone()),
            no: no.map(str::to_owned),
            ..ProxySettings::default()
        },
        ..lenient(server.template())
    };

    let fetched = fetch(&source_with(through(&proxy, None)), "2.0.0")
        .await
        .unwrap();
    assert_eq!(fetched.bytes, ko, "TLS ran end to end through the tunnel");
    let targets = proxy.targets();
    assert!(
        !targets.is_empty() && targets.iter().all(|t| *t == host_port),
        "every connection went through the proxy to {host_port}: {targets:?}"
    );

    let direct = fetch(&source_with(through(&proxy, Some("localhost"))), "2.0.0")
        .await
        .unwrap();
    assert_eq!(direct.bytes, ko);
    assert_eq!(proxy.targets(), Vec::<String>::new(), "NO_PROXY: direct");

    let refusing = ConnectProxy::start(true).await;
    let err = fetch(&source_with(through(&refusing, None)), "2.0.0")
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(refusing.targets(), [host_port]);
    assert!(
        err.contains(&refusing.url) && err.contains("HTTPS_PROXY"),
        "{err}"
    );
}

/// An HTTPS server on loopback serving `paths`, and the CA that signed it (in `node`'s
/// directory `name`).
async fn https_server(
    node: &Node,
    name: &str,
    paths: HashMap<String, Answer>,
) -> (Server, PathBuf) {
    let dir = node.dir.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let (tls, ca_file) = tls_server(&dir);
    (Server::start(paths, Some(tls)).await, ca_file)
}

#[tokio::test]
async fn an_https_download_is_not_redirected_to_http_or_to_another_host() {
    let node = Node::new(&["2.0.0"]);
    let (ko, paths) = published(&node, "2.0.0", RELEASE);
    // what answers the redirect: plain http on loopback, with the real files
    let plain = Server::start(paths.clone(), None).await;
    let moved = |to: String| Answer(302, format!("location: {to}\r\n"), Vec::new());
    let mut redirects = paths.clone();
    redirects.insert(
        ko_path("2.0.0"),
        moved(format!("{}{}", plain.base, ko_path("2.0.0"))),
    );
    let (tls_server, ca_file) = https_server(&node, "downgrading", redirects).await;
    let https_port = tls_server.base.rsplit(':').next().unwrap().to_owned();
    // the same https server under another name: another host for the redirect rule
    redirects = paths.clone();
    redirects.insert(
        ko_path("2.0.0"),
        moved(format!(
            "https://127.0.0.1:{https_port}{}",
            ko_path("2.0.0")
        )),
    );
    let (cross, cross_ca) = https_server(&node, "cross-host", redirects).await;
    let strict = |server: &Server, ca: &PathBuf| PrebuiltConfig {
        ca_file: Some(ca.clone()),
        pins: PrebuiltPins {
            trust_server_checksum: true,
            ..PrebuiltPins::default()
        },
        ..PrebuiltConfig::new(server.template(), PrebuiltFallback::Fail)
    };

    let downgrade = fetch(&source_with(strict(&tls_server, &ca_file)), "2.0.0")
        .await
        .unwrap_err();
    assert!(
        matches!(&downgrade, PrebuiltFetchError::Failed { message, .. }
            if message.contains("not https") && message.contains("allowInsecureHttp")),
        "{downgrade}"
    );
    let elsewhere = fetch(&source_with(strict(&cross, &cross_ca)), "2.0.0")
        .await
        .unwrap_err();
    assert!(
        matches!(&elsewhere, PrebuiltFetchError::Failed { message, .. }
            if message.contains("another host") && message.contains("allowCrossHostRedirects")),
        "{elsewhere}"
    );

    // each allowed explicitly: followed
    let insecure = PrebuiltConfig {
        allow_insecure_http: true,
        allow_cross_host_redirects: true,
        ..strict(&tls_server, &ca_file)
    };
    assert_eq!(
        fetch(&source_with(insecure), "2.0.0").await.unwrap().bytes,
        ko
    );
}

fn prebuilt_agent(
    node: &Node,
    template: String,
    reporter: &Recording,
) -> NodeAgent<NodeKernel, Recording> {
    let mut config = node.config("2.0.0");
    config.prebuilt = Some(PrebuiltConfig {
        fallback: PrebuiltFallback::Build,
        ..lenient(template)
    });
    let kernel = NodeKernel::new(config.kernel, &config.host);
    NodeAgent::new(config, kernel, reporter.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_installs_a_prebuilt_module_without_building_it() {
    // the repository has no tag 2.0.0: a build could not succeed
    let node = Node::new(&["1.0.0"]);
    let (_, paths) = published(&Node::new(&["2.0.0"]), "2.0.0", RELEASE);
    let server = Server::start(paths, None).await;
    node.preinstall("1.0.0");
    let reporter = Recording::default();
    let mut agent = prebuilt_agent(&node, server.template(), &reporter);

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("2.0.0"));
    let building = reporter
        .get()
        .reports
        .iter()
        .find(|r| r.phase == AgentPhase::Building)
        .cloned()
        .unwrap();
    let message = building.message.unwrap_or_default();
    assert!(
        message.contains("downloading prebuilt tt-kmd 2.0.0")
            && message.contains(&format!("{}{}", server.base, ko_path("2.0.0"))),
        "{message}"
    );
    assert_eq!(reporter.last_report().unwrap().phase, AgentPhase::Ready);
    let cache = KoCache::at(node.config("2.0.0").cache_dir);
    let CacheLookup::Hit(ko) = cache.lookup(RELEASE, &v("2.0.0")).unwrap() else {
        panic!("the download is not a verified cache entry")
    };
    assert_eq!(
        ko.record.source_repository,
        format!("{}{}", server.base, ko_path("2.0.0"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_file_on_the_server_fails_the_node_and_keeps_its_driver() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    // a module for another kernel, under this kernel's path, with a correct checksum
    let (ko, _) = published(&node, "2.0.0", "6.9.0-other");
    let sum = format!("{}\n", hex::encode(Sha256::digest(&ko)));
    let paths = HashMap::from([
        (ko_path("2.0.0"), file(&ko)),
        (format!("{}.sha256", ko_path("2.0.0")), file(sum.as_bytes())),
    ]);
    let server = Server::start(paths, None).await;
    node.preinstall("1.0.0");
    let reporter = Recording::default();
    let mut agent = prebuilt_agent(&node, server.template(), &reporter);

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("1.0.0"), "the driver stays");
    let failed = reporter.last_report().unwrap();
    assert_eq!(failed.phase, AgentPhase::Failed);
    assert_eq!(failed.reason.as_deref(), Some("PrebuiltRejected"));
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains("vermagic 6.9.0-other") && message.contains("left as it is"),
        "{message}"
    );
    assert_eq!(
        node.cached(),
        vec!["1.0.0".to_string()],
        "nothing was cached"
    );
}
