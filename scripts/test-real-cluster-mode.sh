#!/usr/bin/env bash
# Runs the end-to-end suites in real-cluster mode: through TTDP_TEST_KUBECONFIG against a separate
# `ttdp-testkit-apiserver --controllers` process standing in for a real cluster (pod deletion left
# to kubelets, DaemonSet and ReplicaSet controllers and a scheduler as stand-ins). The portable
# ttdp-testkit suites run all at the same time on that one server, then the controller's rollout
# scenarios one at a time. It proves that the suites need nothing from their own in-process server,
# do not get in each other's way on a shared cluster, and clean up after themselves. Fails if any
# suite fails or if the server is left with objects a test created.
#
# Usage: scripts/test-real-cluster-mode.sh
# Env:   CARGO_TARGET_DIR (as usual), TTDP_KUBECTL (else ~/.local/ttdp-tools/bin/kubectl).
set -euo pipefail

cd "$(dirname "$0")/.."

# The suites that assert Kubernetes behaviour; apiserver_instruments tests the test server's
# own instruments and always runs in-process. Then the simulated-cluster suites, against the
# control plane the server process plays with --controllers (DaemonSet and ReplicaSet controllers,
# a scheduler); sim_resilience injects faults and always runs in-process.
SUITES=(apiserver_crd apiserver_crud apiserver_eviction apiserver_kubectl apiserver_lifecycle apiserver_patch apiserver_watch
  sim_agent sim_cluster sim_daemonset sim_device sim_existing_cluster sim_kubelet)

export PATH="$HOME/.local/ttdp-tools/bin:$PATH"
if ! command -v kubectl >/dev/null && [[ -z "${TTDP_KUBECTL:-}" ]]; then
  echo "kubectl not found: run 'bash .ci/kube-tools'" >&2
  exit 1
fi

cargo build -q -p ttdp-testkit --bin ttdp-testkit-apiserver
target_dir="${CARGO_TARGET_DIR:-target}"
work="$(mktemp -d)"
server_pid=""
stop() {
  if [[ -n "$server_pid" ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap stop EXIT

"$target_dir/debug/ttdp-testkit-apiserver" --kubelet-deletes --controllers \
  --kubeconfig "$work/kubeconfig" >"$work/stdout" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 100); do
  [[ -s "$work/stdout" ]] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
  sleep 0.1
done
[[ -s "$work/stdout" ]] || { echo "ttdp-testkit-apiserver printed no kubeconfig within 10s" >&2; exit 1; }
export TTDP_TEST_KUBECONFIG="$work/kubeconfig"
echo "real-cluster mode against ttdp-testkit-apiserver (pid $server_pid), TTDP_TEST_KUBECONFIG=$TTDP_TEST_KUBECONFIG"

args=()
for suite in "${SUITES[@]}"; do args+=(--test "$suite"); done
cargo test -q -p ttdp-testkit "${args[@]}" --no-run # build errors readable here
mapfile -t binaries < <(
  cargo test -q -p ttdp-testkit "${args[@]}" --no-run --message-format=json |
    grep -F '"kind":["test"]' | grep -o '"executable":"[^"]*"' | cut -d'"' -f4
)
[[ ${#binaries[@]} -eq ${#SUITES[@]} ]] || {
  echo "expected ${#SUITES[@]} test binaries, cargo built ${#binaries[@]}" >&2
  exit 1
}
# All suites at once, as several suites sharing one real cluster would (cwd as under cargo test).
pids=()
for bin in "${binaries[@]}"; do
  (cd crates/ttdp-testkit && exec "$bin") >"$work/$(basename "$bin").log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  log="$work/$(basename "${binaries[$i]}").log"
  if wait "${pids[$i]}"; then
    echo "$(basename "${binaries[$i]}"): $(grep '^test result' "$log")"
  else
    failed=1
    echo "FAILED: ${binaries[$i]}" >&2
    cat "$log" >&2
  fi
done
[[ $failed -eq 0 ]] || exit 1

# The controller's end-to-end scenarios, one at a time: each runs its own controller, and a
# controller manages every policy of the cluster it is given. Then lifting a cordon from a stale
# cached node.
echo "ttdp-controller rollout scenarios (one at a time)"
cargo test -q -p ttdp-controller --test rollout -- --test-threads=1
cargo test -q -p ttdp-controller --test node_release

# Everything the tests created is named tk-<suffix> (API-server suites) or sim-<suffix> (simulated
# clusters): nothing of it may be left behind (namespaces
# may still be terminating for a moment).
kubectl_bin="${TTDP_KUBECTL:-kubectl}"
k() { "$kubectl_bin" --kubeconfig "$TTDP_TEST_KUBECONFIG" "$@"; }
leftovers=""
for _ in $(seq 30); do
  leftovers="$(
    k get namespaces,nodes,customresourcedefinitions -o name
    k get leases -n kube-node-lease -o name
  )"
  leftovers="$(grep -E '/(tk|sim)-|\.tk-' <<<"$leftovers" || true)"
  [[ -z "$leftovers" ]] && break
  sleep 1
done
if [[ -n "$leftovers" ]]; then
  echo "tests left objects behind on the shared server:" >&2
  echo "$leftovers" >&2
  exit 1
fi
echo "real-cluster mode: all ${#SUITES[@]} testkit suites and the controller scenarios passed, nothing left behind"
