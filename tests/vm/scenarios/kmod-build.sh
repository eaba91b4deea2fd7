#!/bin/sh
# Scenario "kmod-build": ttdp-kmod's real-kernel tests that fetch tag ttkmd-<version> from the
# stub repository ($TTDP_VM_STUB_REPO) and build it inside the VM, with the host's /usr (git, make,
# gcc, kernel headers) mounted read-only over 9p: the agent's cache-miss path.
exec /tests/ttdp-kmod/real_kernel --ignored --test-threads=1 from_source "$@"
