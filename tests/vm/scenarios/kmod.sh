#!/bin/sh
# Scenario "kmod": ttdp-kmod's real-kernel tests (crates/ttdp-kmod/tests/real_kernel.rs) with the
# stub modules built on the host; the tests that build inside the VM run in scenario kmod-build.
# They share one kernel and one module name, so they run one at a time. "$@" holds the
# arguments given after `--` to `cargo xtask vm-test` (a test name filter, --nocapture, ...).
exec /tests/ttdp-kmod/real_kernel --ignored --test-threads=1 --skip from_source "$@"
