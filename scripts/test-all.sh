#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need, then runs format,
# lint, docs and the CRD staleness check, starts one real Kubernetes control plane (or uses the
# cluster TTDP_TEST_KUBECONFIG names), runs every unit and end-to-end test against it, checks
# that the tests left nothing behind on it, builds and tests the container images (the
# controller image against the same control plane), runs the real-kernel VM tests (scenario
# agent-image reuses the agent image built before) and, beside them, the chart's controller on a
# real node (kubelet and containerd, with a control plane of its own).
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

step "cargo fmt --check"
cargo fmt --all -- --check

# One build of everything the suites run, xtask and the control plane's launcher included. A
# `cargo build -p` of one of them, or `cargo xtask` (which is `cargo run -p xtask`), unifies
# features over fewer packages and compiles kube and k8s-openapi once more; so the steps below
# run the binaries this build made.
step "cargo test --no-run (every test, xtask and the control plane's launcher)"
cargo test --workspace --no-run --quiet
bin="$(realpath -m "${CARGO_TARGET_DIR:-target}/debug")"
xtask() { "$bin/xtask" "$@"; }

step "the images' inputs, in the background (Debian root filesystems, tt-smi, builder images)"
inputs_log="$bin/../image-inputs.log"
# The builder images per compiler family wait for the static release binaries (cargo's lock)
# and are then mostly archive writing; image-test finds them built. gcc 12 is the agent image.
nice -n 10 sh -c "'$bin/xtask' image inputs && for gcc in 11 13 14; do
  '$bin/xtask' image agent --gcc \$gcc || exit 1; done" >"$inputs_log" 2>&1 &
inputs_pid=$!

# The suites mostly wait on the control plane; at the lowest priority, the static builds that
# image-test and vm-test need take the CPU time they and the checks below leave.
step "the images' and VM tests' static builds, in the background at the lowest priority"
static_log="$bin/../static-builds.log"
nice -n 19 sh -c "'$bin/xtask' image binaries && '$bin/xtask' vm-test --build-only" \
  >"$static_log" 2>&1 &
static_pid=$!

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo xtask crd --check"
xtask crd --check

step "cargo xtask shape (shipped crates: files <= 600 lines, functions <= 80)"
xtask shape

step "a real control plane (kube-apiserver, kube-controller-manager, kube-scheduler v1.36, etcd)"
source scripts/control-plane.sh
# Absolute: every test binary runs in its own crate directory.
run_dir="$(realpath -m "${CARGO_TARGET_DIR:-target}/ttdp-kube/test-all")"
trap control_plane_down EXIT
control_plane_up "$run_dir" "$bin/ttdp-control-plane"

step "cargo test (every end-to-end suite on the control plane above)"
cargo test --workspace --no-fail-fast

step "cargo xtask image-test (both images built, run inside and against the control plane)"
wait "$inputs_pid" || { cat "$inputs_log"; exit 1; }
cat "$inputs_log"
wait "$static_pid" || { cat "$static_log"; exit 1; }
tail -n 20 "$static_log"
xtask image-test

step "nothing left behind on the control plane"
control_plane_leftovers "$run_dir"
control_plane_down

# The chart's controller on a real node (containerd, kubelet, kube-proxy beside a control plane
# of its own): mostly waiting on pods and probes, so it runs beside the VM tests; its output is
# printed once they are done.
step "cargo xtask node-test (the chart's controller on a real node), in the background"
node_log="$bin/../node-test.log"
xtask node-test >"$node_log" 2>&1 &
node_pid=$!

step "cargo xtask vm-test (real Linux kernel under QEMU)"
xtask vm-test

step "cargo xtask node-test: its result"
node_status=0
wait "$node_pid" || node_status=$?
cat "$node_log"
[ "$node_status" -eq 0 ]
step "done"
