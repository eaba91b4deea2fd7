#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need, then runs format,
# lint, docs, unit and end-to-end tests, the CRD staleness check, the API-server suites in
# real-cluster mode and the real-kernel VM tests.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s\n' "$*"; }

step "system packages and tools"
bash .ci/deps
export PATH="$HOME/.local/ttdp-tools/bin:$PATH"
# One-shot builds: incremental caches only cost disk (several GiB) and time here.
export CARGO_INCREMENTAL=0
df -h . | tail -n 1

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo xtask crd --check"
cargo xtask crd --check

step "cargo test"
cargo test --workspace

step "end-to-end suites in real-cluster mode (TTDP_TEST_KUBECONFIG, against a separate server process)"
./scripts/test-real-cluster-mode.sh

step "cargo xtask vm-test (real Linux kernel under QEMU)"
cargo xtask vm-test
