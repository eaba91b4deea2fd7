#!/bin/sh
# VM scenario for the ttdp-agent binary on a real kernel (issue 6's last paragraph), for
# `cargo xtask vm-test` (see xtask/src/vm/mod.rs, "Adding a scenario"): bins
# [("ttdp-agent", "ttdp-agent")], host_usr true for the in-VM build (cache miss), this file as the
# scenario script. Host root `/`, TTDP_KERNEL=real, reporting to a file (no cluster, no network).
#
# Steps: fresh install from the stub git repository (cache miss; seeded from /ko instead when the
# guest has no toolchain), upgrade, busy module waiting then proceeding after the holder exits,
# force unload, cache hit on a second run without the repository, a version whose init fails
# (rolled back), SIGTERM never unloading. Ends with "N passed, N failed".

set -u
PASSED=0
FAILED=0
REPORT=/tmp/agent-report.json
LOG=/tmp/agent.log
REL="$TTDP_VM_KERNEL_RELEASE"
set -- $TTDP_VM_KO_VERSIONS
V1="$1"
V2="$2"
BROKEN="$TTDP_VM_KO_BROKEN_VERSION"
AGENT_PID=""

ok() { PASSED=$((PASSED + 1)); echo "ok: $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAILED: $*"; echo "--- report:"; cat "$REPORT" 2>/dev/null; echo "--- agent log (tail):"; tail -n 20 "$LOG" 2>/dev/null; }
loaded() { cat /sys/module/tenstorrent/version 2>/dev/null; }

# Puts the prebuilt stub .ko of version $1 into the agent's cache with its sidecar record.
seed_cache() {
  dir="/var/cache/tt-kmd/$REL/$1"
  mkdir -p "$dir"
  cp "$TTDP_VM_KO_DIR/$1/tenstorrent.ko" "$dir/tenstorrent.ko"
  sum=$(sha256sum "$dir/tenstorrent.ko" | cut -d' ' -f1)
  cat >"$dir/tenstorrent.ko.json" <<EOF
{"version":"$1","kernelRelease":"$REL","sha256":"$sum","vermagic":"$REL","srcversion":null,
 "sourceRepository":"vm-prebuilt","sourceCommit":"none","builtAt":"2026-01-01T00:00:00Z"}
EOF
}

# start_agent VERSION [ENV=VALUE...]: runs the agent in the background.
start_agent() {
  version="$1"
  shift
  rm -f "$REPORT"
  env TT_KMD_VERSION="$version" TTDP_HOST_ROOT=/ TTDP_KERNEL=real TTDP_TT_SMI_PATH=none \
    TT_KMD_REPOSITORY="${REPO:-$TTDP_VM_STUB_REPO}" TTDP_PROBE_PERIOD=1s TTDP_RETRY_INITIAL=1s \
    TTDP_RETRY_MAX=2s TTDP_LOG_FORMAT=text NODE_NAME=vm "$@" \
    ttdp-agent run --report "file:$REPORT" >>"$LOG" 2>&1 &
  AGENT_PID=$!
}

# stop_agent: SIGTERM, and the agent must exit 0 within 30 s.
stop_agent() {
  kill -TERM "$AGENT_PID"
  i=0
  while kill -0 "$AGENT_PID" 2>/dev/null; do
    i=$((i + 1))
    if [ "$i" -gt 30 ]; then
      kill -KILL "$AGENT_PID"
      fail "agent did not stop within 30 s of SIGTERM"
      return
    fi
    sleep 1
  done
  wait "$AGENT_PID"
  status=$?
  [ "$status" = 0 ] && ok "agent exited 0 on SIGTERM" || fail "agent exited $status on SIGTERM"
}

# wait_for PATTERN SECONDS: waits until the report file contains PATTERN.
wait_for() {
  i=0
  while ! grep -q "$1" "$REPORT" 2>/dev/null; do
    i=$((i + 1))
    [ "$i" -gt "$2" ] && return 1
    sleep 1
  done
  return 0
}

check_ready() {
  if wait_for '"phase": "Ready"' "$2"; then
    [ "$(loaded)" = "$1" ] && ok "$3: $1 loaded" || fail "$3: loaded $(loaded), want $1"
    grep -q "\"driver.tenstorrent.com/kmd-version\": \"$1\"" "$REPORT" \
      && ok "$3: kmd-version label $1" || fail "$3: no kmd-version label $1"
    ttdp-agent probe --kmd-version "$1" --host-root / >/dev/null \
      && ok "$3: probe passes" || fail "$3: probe fails"
  else
    fail "$3: not Ready"
  fi
}

if [ "${TTDP_VM_HOST_USR:-0}" != 1 ]; then
  echo "no toolchain in the guest: seeding the cache for $V1 and $V2 instead of building"
  seed_cache "$V1"
  seed_cache "$V2"
fi
seed_cache "$BROKEN"

# 1. fresh install (cache miss: fetch + build in the guest when it has a toolchain)
ttdp-agent probe --kmd-version "$V1" --host-root / >/dev/null && fail "probe passes with nothing loaded" || ok "probe fails with nothing loaded"
start_agent "$V1"
check_ready "$V1" 900 "fresh install"
stop_agent
[ "$(loaded)" = "$V1" ] && ok "module stays loaded after exit" || fail "module gone after exit"

# 2. upgrade
start_agent "$V2"
check_ready "$V2" 900 "upgrade"
stop_agent

# 3. busy: a holder blocks the swap; the agent waits, then proceeds when it exits
sleep 600 </dev/tenstorrent/0 &
HOLDER=$!
sleep 1
start_agent "$V1"
if wait_for '"phase": "WaitingForHolders"' 60; then
  ok "busy: waiting for holders"
  grep -q "\"pid\": $HOLDER" "$REPORT" && ok "busy: holder pid $HOLDER reported" || fail "busy: holder pid $HOLDER not reported"
  grep -q '"reason": "DeviceHeld"' "$REPORT" && ok "busy: DeviceHeld event" || fail "busy: no DeviceHeld"
  [ "$(loaded)" = "$V2" ] && ok "busy: old module untouched" || fail "busy: loaded $(loaded)"
else
  fail "busy: no WaitingForHolders report"
fi
kill "$HOLDER"
wait "$HOLDER" 2>/dev/null
check_ready "$V1" 60 "after the holder left"
stop_agent

# 4. force unload kills the holder
sleep 600 </dev/tenstorrent/0 &
HOLDER=$!
sleep 1
start_agent "$V2" TT_FORCE_UNLOAD=true
check_ready "$V2" 120 "force unload"
sleep 1
kill -0 "$HOLDER" 2>/dev/null && fail "force unload: holder $HOLDER still alive" || ok "force unload: holder killed"
grep -q '"reason": "HoldersKilled"' "$REPORT" && ok "force unload: HoldersKilled event" || fail "force unload: no HoldersKilled event"
stop_agent

# 5. cache hit on a second run: no repository, module unloaded by hand
rmmod tenstorrent
REPO=/nonexistent/tt-kmd start_agent "$V2"
check_ready "$V2" 60 "cache hit"
stop_agent

# 6. a version whose init fails: rolled back to the previous one
start_agent "$BROKEN"
if wait_for '"reason": "LoadFailedRolledBack"' 120; then
  ok "broken version: rolled back"
  [ "$(loaded)" = "$V2" ] && ok "broken version: $V2 loaded again" || fail "broken version: loaded $(loaded)"
else
  fail "broken version: no LoadFailedRolledBack report"
fi
stop_agent

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
