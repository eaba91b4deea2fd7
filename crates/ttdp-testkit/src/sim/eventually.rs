//! Waiting for the simulated cluster to reach a state, with a bounded timeout.

use std::future::Future;
use std::time::{Duration, Instant};

use super::error::SimError;

/// How often [`eventually`] checks.
const POLL: Duration = Duration::from_millis(50);

/// Calls `check` until it returns `Some`, at most for `timeout`; `what` names the awaited state in
/// the timeout error.
pub async fn eventually<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, SimError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if start.elapsed() >= timeout {
            return Err(SimError::Timeout {
                what: what.to_owned(),
                seconds: timeout.as_secs_f64(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}
