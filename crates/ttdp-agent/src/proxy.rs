//! The cluster's HTTP proxy for the agent's own downloads: `HTTPS_PROXY`, `HTTP_PROXY`,
//! `ALL_PROXY` and `NO_PROXY` (either case), with curl's rules, as git (libcurl) reads them
//! for the source clone. On a network where only a proxy reaches the outside, the prebuilt
//! module's server is reached through it with an HTTP CONNECT tunnel; TLS then runs end to end
//! with the server, so the proxy sees neither the module nor the checksums.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The proxy settings, as the environment gives them (values as curl takes them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxySettings {
    /// `HTTP_PROXY`: the proxy for http URLs.
    pub http: Option<String>,
    /// `HTTPS_PROXY`: the proxy for https URLs.
    pub https: Option<String>,
    /// `ALL_PROXY`: the proxy for both when the one of the scheme is not set.
    pub all: Option<String>,
    /// `NO_PROXY`: hosts, domains and networks reached directly.
    pub no: Option<String>,
}

impl ProxySettings {
    /// The settings from the agent's environment: each variable in upper case, else in lower
    /// case (curl reads `http_proxy` only in lower case; the pod gets both).
    pub fn from_env() -> Self {
        let var = |name: &str| {
            [name.to_owned(), name.to_lowercase()]
                .iter()
                .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
        };
        Self {
            http: var("HTTP_PROXY"),
            https: var("HTTPS_PROXY"),
            all: var("ALL_PROXY"),
            no: var("NO_PROXY"),
        }
    }

    /// Whether any proxy is set.
    pub fn any(&self) -> bool {
        self.http.is_some() || self.https.is_some() || self.all.is_some()
    }

    fn matcher(&self) -> Matcher {
        let mut builder = Matcher::builder();
        let set = [&self.all, &self.http, &self.https, &self.no];
        let [all, http, https, no] = set.map(|v| v.clone().unwrap_or_default());
        builder = builder.all(all).http(http).https(https).no(no);
        builder.build()
    }
}

/// Connects directly, or through a CONNECT tunnel to the proxy the settings name for the
/// destination.
#[derive(Clone)]
pub struct ProxyConnector {
    direct: HttpConnector,
    proxies: Arc<Matcher>,
}

impl std::fmt::Debug for ProxyConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConnector").finish_non_exhaustive()
    }
}

impl ProxyConnector {
    /// A connector for `settings`.
    pub fn new(settings: &ProxySettings) -> Self {
        let mut direct = HttpConnector::new();
        // The TLS layer above checks the scheme; this one only opens connections.
        direct.enforce_http(false);
        Self {
            direct,
            proxies: Arc::new(settings.matcher()),
        }
    }
}

impl Service<Uri> for ProxyConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, destination: Uri) -> Self::Future {
        let direct = self.direct.clone();
        match self.proxies.intercept(&destination) {
            Some(proxy) => {
                let mut tunnel = Tunnel::new(proxy.uri().clone(), direct);
                if let Some(auth) = proxy.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                let through = proxy.uri().clone();
                Box::pin(async move {
                    tunnel.call(destination).await.map_err(|e| {
                        format!("through the proxy {through} (HTTPS_PROXY/HTTP_PROXY): {e}").into()
                    })
                })
            }
            None => {
                let mut direct = direct;
                Box::pin(async move { direct.call(destination).await.map_err(Into::into) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_proxy_hosts_are_reached_directly_and_others_through_the_proxy() {
        let settings = ProxySettings {
            https: Some("http://proxy.internal:3128".into()),
            no: Some("localhost,.cluster.local".into()),
            ..ProxySettings::default()
        };
        let matcher = settings.matcher();
        let through = |url: &str| {
            let uri: Uri = url.parse().unwrap();
            matcher.intercept(&uri).map(|i| i.uri().to_string())
        };
        assert_eq!(
            through("https://downloads.example.com/x.ko").as_deref(),
            Some("http://proxy.internal:3128/")
        );
        assert_eq!(through("https://localhost:8443/x.ko"), None);
        assert_eq!(through("https://files.svc.cluster.local/x.ko"), None);
        // No proxy for http URLs was set.
        assert_eq!(through("http://downloads.example.com/x.ko"), None);
        assert!(settings.any() && !ProxySettings::default().any());
    }
}
