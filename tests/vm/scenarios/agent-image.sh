#!/bin/sh
# Scenario "agent-image": the agent image users get. The host built it (`cargo xtask image
# agent`), unpacked its OCI archive's layers into a root filesystem and shares that read-only
# over 9p (tag agentimage); it also built the stub module with the image's own make and gcc
# against this kernel's headers (mounted as the DaemonSet mounts the host's) and put it at
# /image-ko/tenstorrent.ko. Here:
#   1. that module loads in this kernel and reports the version it was built with;
#   2. the agent runs from the image's root (chroot, the image config's environment, the
#      DaemonSet's environment and mounts: the host's paths under /host, /lib/modules and
#      /usr/src also at their own paths); with an empty cache it fetches tag ttkmd-<version>
#      from the stub repository with the image's git, builds it with the image's make and gcc
#      against the headers (Debian's kbuild scripts come from the image), loads it and reports
#      Ready;
#   3. the readiness probe command, run from the image, passes; the image's tt-smi is on the
#      host's /usr/local/bin and runs;
#   4. SIGTERM leaves the module loaded.
# Each check prints a libtest-style line; the last line sums them up for the harness.
set -u

IMG=/image
WORK=/run/agent-image
REPORT_IN_IMAGE=/tmp/report.json
HOST_BIN=/run/host-usr-local-bin
set -- $TTDP_VM_KO_VERSIONS
TARGET=$1
BUILD_LIMIT=420

SCENARIO=agent-image
. /scenario-lib.sh

# must NAME COMMAND...: a check the rest depends on
must() {
  check "$@"
  [ "$failed" -eq 0 ] || finish
}


# --- 1. the module the image's toolchain built --------------------------------------------------
image_module_loads() {
  insmod /image-ko/tenstorrent.ko || return 1
  v=$(loaded_version)
  echo "loaded the image-built module: version $v (want $TTDP_VM_IMAGE_KO_VERSION)"
  rmmod tenstorrent || return 1
  [ "$v" = "$TTDP_VM_IMAGE_KO_VERSION" ]
}
must image_built_module_loads_in_the_real_kernel image_module_loads

# --- 2. the image's root, mounted as a container runtime and the DaemonSet would -------------------
mount_image() {
  mkdir -p "$IMG" "$WORK" "$HOST_BIN" /var/lib/dkms /var/cache/tt-kmd /run/ttdp || return 1
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose agentimage "$IMG" || return 1
  mount -t proc proc "$IMG/proc" && mount --bind /sys "$IMG/sys" && mount --bind /dev "$IMG/dev" \
    && mount -t tmpfs tmpfs "$IMG/tmp" || return 1
  # the DaemonSet's hostPath volumes (crates/ttdp-controller/src/pure/daemonset.rs)
  for pair in /sys:/host/sys /proc:/host/proc /lib/modules:/host/lib/modules /usr/src:/host/usr/src \
      /var/lib/dkms:/host/var/lib/dkms /var/cache/tt-kmd:/host/var/cache/tt-kmd \
      "$HOST_BIN":/host/usr/local/bin /run/ttdp:/host/run/ttdp /dev:/host/dev \
      /lib/modules:/lib/modules /usr/src:/usr/src /srv:/srv; do
    mount --bind "${pair%%:*}" "$IMG${pair#*:}" || { echo "cannot bind ${pair}"; return 1; }
  done
  echo "image $TTDP_VM_IMAGE_DIGEST mounted at $IMG"
}
must image_root_mounts_like_a_daemonset_pod mount_image

# in_image COMMAND...: COMMAND in the image's root with the image config's environment and the
# DaemonSet's (what the kubelet would start)
in_image() {
  (
    # the image config's Env, one KEY=value per line
    printf '%s\n' "$TTDP_VM_IMAGE_ENV" >"$WORK/image.env"
    set -a
    while IFS= read -r line; do
      [ -n "$line" ] && export "$line"
    done <"$WORK/image.env"
    set +a
    export TT_KMD_VERSION="$TARGET" TT_KMD_REPOSITORY="$TTDP_VM_STUB_REPO" NODE_NAME=vm-node \
      TTDP_REPORT="file:$REPORT_IN_IMAGE" TTDP_KERNEL=real TTDP_PROBE_PERIOD=1s \
      TTDP_RETRY_INITIAL=1s TTDP_RETRY_MAX=2s HOME=/tmp
    exec chroot "$IMG" "$@"
  )
}

start_agent() {
  in_image ttdp-agent >"$WORK/agent.log" 2>&1 &
  AGENT_PID=$!
  echo "agent pid $AGENT_PID, target $TARGET"
}
start_agent

ready_within() {
  limit=$1
  i=0
  while [ "$i" -lt "$limit" ]; do
    if [ "$(loaded_version)" = "$TARGET" ] && in_image ttdp-agent probe >/dev/null 2>&1; then
      echo "ready after ${i} s"
      return 0
    fi
    kill -0 "$AGENT_PID" 2>/dev/null || { echo "the agent exited"; tail -n 30 "$WORK/agent.log"; return 1; }
    sleep 1
    i=$((i + 1))
  done
  echo "not ready within $limit s"; tail -n 30 "$WORK/agent.log"
  return 1
}
check agent_from_the_image_builds_loads_and_is_ready ready_within "$BUILD_LIMIT"

built_in_the_image() {
  grep -q "$TARGET" "$IMG$REPORT_IN_IMAGE" && [ -s "/var/cache/tt-kmd/$TTDP_VM_KERNEL_RELEASE/$TARGET/tenstorrent.ko" ] \
    || { cat "$IMG$REPORT_IN_IMAGE" 2>/dev/null; ls -R /var/cache/tt-kmd; return 1; }
}
check the_report_and_the_cache_hold_the_build built_in_the_image

# The probe passes once the module is loaded; the agent copies tt-smi just after, before its
# Ready report, so the copy (24 MB from the 9p image root, emulated) is waited for.
tt_smi_on_the_host() {
  wait_until 60 test -x "$HOST_BIN/tt-smi" \
    || { echo "no tt-smi in the host's /usr/local/bin after 60 s"; return 1; }
  out=$("$HOST_BIN/tt-smi" --version 2>&1)
  echo "tt-smi --version: $out"
  echo "$out" | grep -q "$TT_SMI_PIN"
}
TT_SMI_PIN=$(printf '%s\n' "$TTDP_VM_IMAGE_ENV" | sed -n 's/^TT_SMI_VERSION=//p')
check image_tt_smi_installed_on_the_host_and_runs tt_smi_on_the_host

probe_fails_for_another_version() {
  ! (TARGET=9.9.9 in_image ttdp-agent probe >/dev/null 2>&1)
}
check readiness_probe_fails_for_another_version probe_fails_for_another_version

sigterm_leaves_module() {
  kill -TERM "$AGENT_PID"
  i=0
  while kill -0 "$AGENT_PID" 2>/dev/null && [ "$i" -lt 30 ]; do sleep 1; i=$((i + 1)); done
  kill -0 "$AGENT_PID" 2>/dev/null && return 1
  AGENT_PID=
  [ "$(loaded_version)" = "$TARGET" ]
}
check sigterm_leaves_the_module_loaded sigterm_leaves_module

finish
