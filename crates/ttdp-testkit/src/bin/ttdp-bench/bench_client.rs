//! Counting the API requests a program under measurement sent, from the recording proxy's log.

use ttdp_testkit::fault_proxy::RecordedRequest;

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
