//! Kube clients of the benchmark itself, marked with a `ttdp-bench/<role>` User-Agent so the
//! server's request log can tell them from the component under measurement.

use anyhow::{Context, Result};
use http::HeaderValue;
use http::header::USER_AGENT;
use kube::Client;
use ttdp_testkit::apiserver::{RecordedRequest, TestApiServer};

/// The User-Agent prefix of every benchmark client.
pub const BENCH_AGENT_PREFIX: &str = "ttdp-bench/";

/// A client for `server` whose requests carry User-Agent `ttdp-bench/<role>`.
pub fn bench_client(server: &TestApiServer, role: &str) -> Result<Client> {
    let mut config = server
        .config()
        .context("cannot build a client config for the test api server")?;
    let agent = HeaderValue::from_str(&format!("{BENCH_AGENT_PREFIX}{role}"))
        .with_context(|| format!("benchmark role {role:?} is not a valid header value"))?;
    config.headers.push((USER_AGENT, agent));
    Client::try_from(config).context("cannot build a kube client for the test api server")
}

/// Whether a recorded request came from the benchmark itself.
pub fn is_bench(request: &RecordedRequest) -> bool {
    request.user_agent.starts_with(BENCH_AGENT_PREFIX)
}

/// Reads (get, list, watch and discovery) and writes among `requests`.
pub fn reads_and_writes<'a>(
    requests: impl IntoIterator<Item = &'a RecordedRequest>,
) -> (usize, usize) {
    requests.into_iter().fold((0, 0), |(reads, writes), r| {
        if r.is_write() {
            (reads, writes + 1)
        } else {
            (reads + 1, writes)
        }
    })
}
