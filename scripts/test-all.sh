#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need, then runs format,
# lint, docs and the CRD staleness check, starts one real Kubernetes control plane (or uses the
# cluster TTDP_TEST_KUBECONFIG names), runs every unit and end-to-end test against it, checks
# that the tests left nothing behind on it, builds and tests the container images (the
# controller image against the same control plane), and runs the real-kernel VM tests (scenario
# agent-image reuses the agent image built before).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
step() { printf '\n=== %s (at %d s)\n' "$*" "$((SECONDS - started))"; }

step "system packages and tools"
bash .ci/deps
export PATH="$HOME/.local/ttdp-tools/bin:$PATH"
# One-shot builds: incremental caches only cost disk (several GiB) and time here.
export CARGO_INCREMENTAL=0
df -h . | tail -n 1

step "the images' inputs, in the background (Debian root filesystem, tt-smi: mostly downloads)"
cargo build --quiet -p xtask
inputs_log="$(realpath -m "${CARGO_TARGET_DIR:-target}/image-inputs.log")"
"${CARGO_TARGET_DIR:-target}/debug/xtask" image inputs >"$inputs_log" 2>&1 &
inputs_pid=$!

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo xtask crd --check"
cargo xtask crd --check

step "cargo xtask shape (controller: files <= 600 lines, functions <= 80)"
cargo xtask shape

step "a real control plane (kube-apiserver, kube-controller-manager, kube-scheduler v1.36, etcd)"
source scripts/control-plane.sh
# Absolute: every test binary runs in its own crate directory.
run_dir="$(realpath -m "${CARGO_TARGET_DIR:-target}/ttdp-kube/test-all")"
trap control_plane_down EXIT
control_plane_up "$run_dir"

step "cargo test --no-run (the suites' build)"
cargo test --workspace --no-run --quiet

# The suites mostly wait on the control plane; at the lowest priority, the static builds that
# image-test and vm-test need take the CPU time they leave.
step "the images' and VM tests' static builds, in the background at the lowest priority"
static_log="$(realpath -m "${CARGO_TARGET_DIR:-target}/static-builds.log")"
xtask="${CARGO_TARGET_DIR:-target}/debug/xtask"
nice -n 19 sh -c "'$xtask' image binaries && '$xtask' vm-test --build-only" >"$static_log" 2>&1 &
static_pid=$!

step "cargo test (every end-to-end suite on the control plane above)"
cargo test --workspace --no-fail-fast

step "cargo xtask image-test (both images built, run inside and against the control plane)"
wait "$inputs_pid" || { cat "$inputs_log"; exit 1; }
cat "$inputs_log"
wait "$static_pid" || { cat "$static_log"; exit 1; }
tail -n 20 "$static_log"
cargo xtask image-test

step "nothing left behind on the control plane"
control_plane_leftovers "$run_dir"
control_plane_down

step "cargo xtask vm-test (real Linux kernel under QEMU)"
cargo xtask vm-test
step "done"
