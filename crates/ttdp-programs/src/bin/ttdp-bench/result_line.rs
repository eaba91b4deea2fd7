//! The one machine-readable line each suite prints: `BENCH-RESULT {json}` on stdout, read by
//! `cargo xtask bench`.

use serde_json::Value;

/// The prefix `cargo xtask bench` looks for.
pub const PREFIX: &str = "BENCH-RESULT ";

/// Prints `figures` (a JSON object with at least `suite`) as the suite's result line.
pub fn print(figures: &Value) {
    println!("{PREFIX}{figures}");
}

/// Milliseconds with a fraction, for figures measured as durations.
pub fn ms(duration: std::time::Duration) -> f64 {
    (duration.as_secs_f64() * 1_000_000.0).round() / 1_000.0
}
