#!/bin/sh
# Scenario "swap-timing" (not a test; `cargo xtask bench` boots it): times ttdp-kmod's swap on this
# real kernel with the host-built stub modules, the two oldest loadable versions, 5 runs, and prints
# the medians as one BENCH-RESULT line. "$@" (after `--`) may give another number of runs.
set -- $TTDP_VM_KO_VERSIONS "$@"
exec /opt/ttdp/bin/swap_timing "$TTDP_VM_KO_DIR" "$1" "$2" "${3:-5}"
