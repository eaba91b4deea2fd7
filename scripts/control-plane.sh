#!/usr/bin/env bash
# Helpers for running test commands against one real control plane; sourced by test-all.sh.
#
# control_plane_up DIR LAUNCHER: unless TTDP_TEST_KUBECONFIG already names a cluster, starts
#   LAUNCHER, the built ttdp-control-plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler from
#   TTDP_KUBE_ASSETS or ../shared/kube), exports TTDP_TEST_KUBECONFIG, and records what the
#   cluster holds before the tests (DIR/before).
# control_plane_leftovers DIR: removes the ttdp CRD the suites share, then fails if any
#   cluster-scoped object, namespace or object in a pre-existing namespace is left that was not
#   there before.
# control_plane_down: stops the control plane started here (its processes die with it).

cp_pid=""

cp_kubectl() { "${TTDP_KUBECTL:-kubectl}" --kubeconfig "$TTDP_TEST_KUBECONFIG" "$@"; }

control_plane_up() {
  local dir launcher="$2"
  dir="$(realpath -m "$1")"
  mkdir -p "$dir"
  if [[ -n "${TTDP_TEST_KUBECONFIG:-}" ]]; then
    echo "using the existing cluster of TTDP_TEST_KUBECONFIG=$TTDP_TEST_KUBECONFIG"
  else
    "$launcher" --kubeconfig "$dir/kubeconfig" \
      >"$dir/control-plane.out" 2>"$dir/control-plane.err" &
    cp_pid=$!
    for _ in $(seq 600); do
      [[ -s "$dir/control-plane.out" ]] && break
      kill -0 "$cp_pid" 2>/dev/null || { cat "$dir/control-plane.err" >&2; return 1; }
      sleep 0.1
    done
    [[ -s "$dir/control-plane.out" ]] || { echo "no control plane within 60 s" >&2; cat "$dir/control-plane.err" >&2; return 1; }
    cat "$dir/control-plane.err"
    export TTDP_TEST_KUBECONFIG="$dir/kubeconfig"
  fi
  cluster_objects | sort >"$dir/before" || { echo "cannot list the cluster's objects" >&2; return 1; }
}

# Every object of every cluster-scoped kind, every namespace, and every object in the
# namespaces the cluster had before (events and leases of the control plane's own aside).
cluster_objects() {
  local kinds namespaced
  kinds="$(cp_kubectl api-resources --namespaced=false --verbs=list -o name | grep -vE '^(componentstatuses|tokenreviews|selfsubject.*|subjectaccessreviews|localsubjectaccessreviews)$' | paste -sd, -)"
  cp_kubectl get "$kinds" -o name
  namespaced="$(cp_kubectl api-resources --namespaced=true --verbs=list -o name | grep -vE '^(events|events\.events\.k8s\.io|leases\.coordination\.k8s\.io|endpoints|endpointslices\.discovery\.k8s\.io)$' | paste -sd, -)"
  for ns in default kube-system kube-public kube-node-lease; do
    cp_kubectl get "$namespaced" -n "$ns" -o name | sed "s|^|$ns/|"
  done
  # Node leases belong to test nodes: none may be left either.
  cp_kubectl get leases -n kube-node-lease -o name | sed 's|^|kube-node-lease/|'
}

control_plane_leftovers() {
  local dir="$1" left=""
  cp_kubectl delete crd tenstorrentdriverpolicies.driver.tenstorrent.com --ignore-not-found --wait=true >/dev/null
  # Namespaces and garbage-collected objects may take a moment to go (one listing takes ~3 s).
  for _ in $(seq 20); do
    cluster_objects | sort >"$dir/after" || { echo "cannot list the cluster's objects" >&2; return 1; }
    left="$(comm -13 "$dir/before" "$dir/after")"
    [[ -z "$left" ]] && break
    sleep 1
  done
  if [[ -n "$left" ]]; then
    echo "the tests left objects behind on the control plane:" >&2
    echo "$left" >&2
    return 1
  fi
  echo "nothing left behind on the control plane"
}

control_plane_down() {
  if [[ -n "$cp_pid" ]]; then
    kill "$cp_pid" 2>/dev/null || true
    wait "$cp_pid" 2>/dev/null || true
    cp_pid=""
  fi
}
