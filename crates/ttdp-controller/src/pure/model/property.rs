//! The property test: random setups and event sequences, every invariant after every event.
//!
//! `PROPTEST_CASES` (default 512) sets how many cases run, `TTDP_MODEL_STEPS` (default 50) the
//! most events in one; a soak run raises both:
//!
//! ```text
//! PROPTEST_CASES=20000 TTDP_MODEL_STEPS=80 \
//!     cargo test -p ttdp-controller --lib model::property -- --ignored
//! ```
//!
//! `TTDP_MODEL_SKIP` leaves out invariants by name (see [`invariants::check`]), to look for
//! further violations while a known one is being fixed.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use super::events::{self, Event};
use super::{Setup, World, invariants};

/// Runs `events` on the world of `setup`; the first violation, with the events up to it.
pub(super) fn run(setup: &Setup, events: &[Event]) -> Result<World, String> {
    let mut world = World::new(setup);
    for (step, event) in events.iter().enumerate() {
        let before = world.clone();
        world.apply(event);
        invariants::check(&before, event, &world).map_err(|why| format!("step {step}: {why}"))?;
    }
    Ok(world)
}

fn env_or(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn every_order_of_events_keeps_the_invariants() {
    let config = Config {
        cases: env_or("PROPTEST_CASES", 512),
        failure_persistence: None,
        ..Config::default()
    };
    let steps = env_or("TTDP_MODEL_STEPS", 50) as usize;
    let cases = (
        events::setup(),
        proptest::collection::vec(events::event(), 1..=steps.max(1)),
    );
    let result = TestRunner::new(config).run(&cases, |(setup, events)| {
        run(&setup, &events)
            .map(|_| ())
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
