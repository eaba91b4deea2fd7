//! Kube clients of the benchmark itself, marked with a `ttdp-bench/<role>` User-Agent so the
//! recording proxy's log can tell them from the component under measurement.

use ttdp_testkit::fault_proxy::RecordedRequest;

/// The User-Agent prefix of every benchmark client.
pub const BENCH_AGENT_PREFIX: &str = "ttdp-bench/";

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
