//! [`HttpPrebuiltSource`]: downloads ready-built modules (`spec.source.prebuilt`) over HTTPS
//! for `ttdp_kmod`, which checks them (against the checksums the policy pins) before they enter
//! the cache. HTTPS trusts the system's CA certificates plus an optional bundle (the policy's
//! `caBundle`, mounted by the DaemonSet). Plain http, and redirects to another host, only when
//! the policy allows them: whoever answers the download chooses code for the kernel. The client
//! is hyper's, the one kube already runs on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::runtime::Handle;
use ttdp_api::names::env;
use ttdp_kmod::KmdVersion;
use ttdp_kmod::prebuilt::{
    CHECKSUM_SUFFIX, FetchedKo, PrebuiltFallback, PrebuiltFetchError, PrebuiltPins, PrebuiltSource,
    parse_checksum_file, prebuilt_url,
};

use crate::error::ConfigError;
use crate::proxy::{ProxyConnector, ProxySettings};

/// The largest file accepted: a tt-kmd `.ko` is well under a megabyte, so anything near this is
/// not one.
const MAX_FILE_BYTES: usize = 64 << 20;
/// Redirects followed (a file server behind a load balancer or an artifact store may redirect).
const MAX_REDIRECTS: usize = 5;

/// Where prebuilt modules come from (`TT_KMD_PREBUILT_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrebuiltConfig {
    /// URL template with `{version}` and `{kernelRelease}`.
    pub url_template: String,
    /// What a file the server lacks means.
    pub fallback: PrebuiltFallback,
    /// Extra CA certificates (PEM) for HTTPS.
    pub ca_file: Option<PathBuf>,
    /// The checksums the policy pins, and whether the server's own may stand in.
    pub pins: PrebuiltPins,
    /// Plain http allowed, for the URL and redirects (`TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP`).
    pub allow_insecure_http: bool,
    /// Redirects to another host followed (`TT_KMD_PREBUILT_ALLOW_CROSS_HOST_REDIRECTS`).
    pub allow_cross_host_redirects: bool,
    /// The proxies downloads go through (`HTTPS_PROXY`, `NO_PROXY`, ...).
    pub proxies: ProxySettings,
}

impl PrebuiltConfig {
    /// A configuration for `url_template` that trusts nothing beyond the defaults: https only,
    /// redirects on the same host, no checksum pinned and the server's not trusted.
    pub fn new(url_template: impl Into<String>, fallback: PrebuiltFallback) -> Self {
        Self {
            url_template: url_template.into(),
            fallback,
            ca_file: None,
            pins: PrebuiltPins::default(),
            allow_insecure_http: false,
            allow_cross_host_redirects: false,
            proxies: ProxySettings::default(),
        }
    }
}

/// Downloads `.ko` files and their checksums with hyper, blocking on the agent's runtime (it is
/// called from the blocking task that holds the cache lock).
#[derive(Debug)]
pub struct HttpPrebuiltSource {
    config: PrebuiltConfig,
    client: Client<HttpsConnector<ProxyConnector>, Empty<Bytes>>,
    runtime: Handle,
    timeout: Duration,
}

impl HttpPrebuiltSource {
    /// A source for `config`, each download (the `.ko` and its checksum) bounded by `timeout`,
    /// run on the current tokio runtime. Fails when the CA bundle cannot be read or holds no
    /// certificate, or outside a runtime.
    pub fn new(config: PrebuiltConfig, timeout: Duration) -> Result<Self, ConfigError> {
        let runtime = Handle::try_current().map_err(|e| ConfigError::Invalid {
            variable: env::TT_KMD_PREBUILT_URL,
            value: config.url_template.clone(),
            problem: format!("prebuilt downloads need the agent's tokio runtime: {e}"),
        })?;
        if config.url_template.starts_with("http://") && !config.allow_insecure_http {
            return Err(ConfigError::Invalid {
                variable: env::TT_KMD_PREBUILT_URL,
                value: config.url_template.clone(),
                problem: format!(
                    "plain http lets anyone on the network choose the module loaded into the kernel; use https, or allow http explicitly (spec.source.prebuilt.allowInsecureHttp, {})",
                    env::TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP
                ),
            });
        }
        let roots = trusted_roots(config.ca_file.as_deref())?;
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::Invalid {
            variable: env::TT_KMD_PREBUILT_URL,
            value: config.url_template.clone(),
            problem: format!("cannot set up TLS for it: {e}"),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
        // without the opt-in, the connector itself refuses http, whatever URL reaches it
        let builder = if config.allow_insecure_http {
            builder.https_or_http()
        } else {
            builder.https_only()
        };
        let connector = ProxyConnector::new(&config.proxies);
        let https = builder.enable_http1().wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(Self {
            config,
            client,
            runtime,
            timeout,
        })
    }

    /// The body at `url`, following redirects; `NotFound` for 404 and 410.
    async fn get(&self, url: &str) -> Result<Bytes, PrebuiltFetchError> {
        let failed = |message: String| PrebuiltFetchError::Failed {
            url: url.to_owned(),
            message,
        };
        let mut uri: Uri = url
            .parse()
            .map_err(|e| failed(format!("not a valid URL: {e}")))?;
        for _ in 0..=MAX_REDIRECTS {
            let response = self
                .client
                .get(uri.clone())
                .await
                .map_err(|e| failed(error_chain(&e)))?;
            let status = response.status();
            if status.is_redirection() {
                let target = redirect_target(&uri, response.headers().get(header::LOCATION))
                    .ok_or_else(|| failed(format!("{status} without a usable Location")))?;
                check_redirect(url, &target, &self.config).map_err(failed)?;
                uri = target;
                continue;
            }
            if matches!(status, StatusCode::NOT_FOUND | StatusCode::GONE) {
                return Err(PrebuiltFetchError::NotFound {
                    url: url.to_owned(),
                });
            }
            if !status.is_success() {
                return Err(failed(format!("the server answered {status}")));
            }
            let body = Limited::new(response.into_body(), MAX_FILE_BYTES)
                .collect()
                .await
                .map_err(|e| failed(format!("reading the body: {e}")))?;
            return Ok(body.to_bytes());
        }
        Err(failed(format!("more than {MAX_REDIRECTS} redirects")))
    }

    /// The `.ko` at `url`, then its checksum file; a `.ko` without one is a failure, not a
    /// missing module.
    async fn download(&self, url: String) -> Result<FetchedKo, PrebuiltFetchError> {
        let bytes = self.get(&url).await?;
        let sum_url = format!("{url}{CHECKSUM_SUFFIX}");
        let sum = match self.get(&sum_url).await {
            Err(PrebuiltFetchError::NotFound { .. }) => {
                return Err(PrebuiltFetchError::Failed {
                    url: sum_url,
                    message: "the server has the .ko but not its checksum file; publish both (cargo xtask prebuild writes them)".into(),
                });
            }
            other => other?,
        };
        let sha256 = parse_checksum_file(&String::from_utf8_lossy(&sum)).map_err(|message| {
            PrebuiltFetchError::Failed {
                url: sum_url,
                message,
            }
        })?;
        Ok(FetchedKo {
            url,
            bytes: bytes.into(),
            sha256,
        })
    }
}

impl PrebuiltSource for HttpPrebuiltSource {
    fn fetch(&self, version: &KmdVersion, release: &str) -> Result<FetchedKo, PrebuiltFetchError> {
        let url = prebuilt_url(&self.config.url_template, version, release);
        let download = tokio::time::timeout(self.timeout, self.download(url.clone()));
        self.runtime.block_on(download).unwrap_or_else(|_| {
            Err(PrebuiltFetchError::Failed {
                url,
                message: format!(
                    "no answer within {}s ({})",
                    self.timeout.as_secs(),
                    env::FETCH_TIMEOUT
                ),
            })
        })
    }

    fn fallback(&self) -> PrebuiltFallback {
        self.config.fallback
    }

    fn pins(&self) -> &PrebuiltPins {
        &self.config.pins
    }
}

/// Whether a redirect from the download of `url` to `target` may be followed: never from https
/// to http, nor to http at all, without `allow_insecure_http`; never to another host or port
/// than `url`'s without `allow_cross_host_redirects`. The message says which setting allows it.
pub fn check_redirect(url: &str, target: &Uri, config: &PrebuiltConfig) -> Result<(), String> {
    let insecure = target.scheme_str() != Some("https");
    if insecure && !config.allow_insecure_http {
        return Err(format!(
            "the server redirects to {target}, which is not https; refused (allow it with spec.source.prebuilt.allowInsecureHttp)"
        ));
    }
    // the same host name, on the same port unless the scheme changed (an allowed move to http)
    let port = |u: &Uri| u.port_u16().or(default_port(u));
    let same_host = url.parse::<Uri>().is_ok_and(|o| {
        o.host() == target.host() && (o.scheme() != target.scheme() || port(&o) == port(target))
    });
    if !same_host && !config.allow_cross_host_redirects {
        return Err(format!(
            "the server redirects to {target}, on another host than {url}; refused (allow it with spec.source.prebuilt.allowCrossHostRedirects)"
        ));
    }
    Ok(())
}

fn default_port(uri: &Uri) -> Option<u16> {
    match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    }
}

/// The system's CA certificates plus those of `ca_file`.
fn trusted_roots(ca_file: Option<&Path>) -> Result<RootCertStore, ConfigError> {
    let mut roots = RootCertStore::empty();
    // a system store that is missing or partly unreadable leaves what could be read: plain HTTP
    // and the policy's own bundle still work
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    let Some(path) = ca_file else {
        return Ok(roots);
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect)
        .map_err(|e| invalid_ca(path, e.to_string()))?;
    if certs.is_empty() {
        return Err(invalid_ca(path, "it holds no PEM certificate".into()));
    }
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| invalid_ca(path, e.to_string()))?;
    }
    Ok(roots)
}

fn invalid_ca(path: &Path, problem: String) -> ConfigError {
    ConfigError::Invalid {
        variable: env::TT_KMD_PREBUILT_CA_FILE,
        value: path.display().to_string(),
        problem: format!(
            "cannot use it as a CA bundle: {problem}; check spec.source.prebuilt.caBundle and the ConfigMap or Secret it names"
        ),
    }
}

/// Where a redirect points: an absolute URL, or a path on the same server.
fn redirect_target(from: &Uri, location: Option<&header::HeaderValue>) -> Option<Uri> {
    let location = location?.to_str().ok()?;
    let target: Uri = location.parse().ok()?;
    if target.scheme().is_some() {
        return Some(target);
    }
    let path = target.path_and_query()?.as_str();
    if !path.starts_with('/') {
        return None;
    }
    Uri::builder()
        .scheme(from.scheme()?.clone())
        .authority(from.authority()?.clone())
        .path_and_query(path)
        .build()
        .ok()
}

/// An error and its causes on one line (hyper's own message is only "client error (Connect)").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(insecure: bool, cross_host: bool) -> PrebuiltConfig {
        PrebuiltConfig {
            allow_insecure_http: insecure,
            allow_cross_host_redirects: cross_host,
            ..PrebuiltConfig::new("unused", PrebuiltFallback::Build)
        }
    }

    fn check(url: &str, target: &str, config: &PrebuiltConfig) -> Result<(), String> {
        check_redirect(url, &target.parse().unwrap(), config)
    }

    #[test]
    fn redirects_stay_on_https_and_on_the_same_host_unless_allowed() {
        let url = "https://ko.example.com/tt-kmd/2.8.0/tenstorrent.ko";
        let strict = config(false, false);
        assert_eq!(
            check(url, "https://ko.example.com/store/a.ko", &strict),
            Ok(())
        );
        assert_eq!(
            check(url, "https://ko.example.com:443/a.ko", &strict),
            Ok(())
        );
        let downgrade = check(url, "http://ko.example.com/a.ko", &strict).unwrap_err();
        assert!(downgrade.contains("allowInsecureHttp"), "{downgrade}");
        let other = check(url, "https://cdn.example.net/a.ko", &strict).unwrap_err();
        assert!(other.contains("allowCrossHostRedirects"), "{other}");
        let port = check(url, "https://ko.example.com:8443/a.ko", &strict).unwrap_err();
        assert!(port.contains("another host"), "{port}");

        assert_eq!(
            check(url, "https://cdn.example.net/a.ko", &config(false, true)),
            Ok(())
        );
        assert!(check(url, "http://cdn.example.net/a.ko", &config(false, true)).is_err());
        assert_eq!(
            check(url, "http://ko.example.com/a.ko", &config(true, false)),
            Ok(())
        );
        assert!(check(url, "http://cdn.example.net/a.ko", &config(true, false)).is_err());
    }
}
