#!/bin/sh
# Scenario "prebuilt": ready-built modules (TT_KMD_PREBUILT_URL and TT_KMD_PREBUILT_FALLBACK, the
# DaemonSet's rendering of spec.source.prebuilt) with the real, static ttdp-agent binary on the
# real kernel (report in a file, no cluster, so no grant is needed). busybox httpd on the guest's
# loopback serves what `cargo xtask prebuild` wrote for $NEW ($TTDP_VM_PREBUILT_DIR), and three
# broken copies of it. With $OLD loaded:
#   1. a .sha256 that does not match: PrebuiltRejected, $OLD stays loaded, nothing cached;
#   2. a module whose vermagic names another kernel (correct checksum): PrebuiltRejected, the same;
#   3. no file, fallback Fail: PrebuiltMissing, the same;
#   4. the right file: downloaded, cached with its URL, loaded and Ready, with no build (the
#      repository does not exist).
# Ends with a libtest-style summary line. Arguments are not used.
set -u

AGENT=/opt/ttdp/bin/ttdp-agent
WORK=/run/prebuilt
REPORT=$WORK/report.json
CACHE=/var/cache/tt-kmd
RELEASE=$TTDP_VM_KERNEL_RELEASE
WWW=/srv/www
PORT=8080
set -- $TTDP_VM_KO_VERSIONS
OLD=$1
NEW=$TTDP_VM_PREBUILT_VERSION
STEP_LIMIT=60

SCENARIO=prebuilt
. /scenario-lib.sh
standalone_agent_env

dump() {
  dump_agent "$1"
  echo "---- $1: module $(loaded_version); cache:"
  ls -R "$CACHE/$RELEASE" 2>/dev/null
}

url_of() { echo "http://127.0.0.1:$PORT/$1/{version}/{kernelRelease}/tenstorrent.ko"; }
new_cached() { [ -f "$CACHE/$RELEASE/$NEW/tenstorrent.ko" ]; }
failed_with() { report_has '"phase": "Failed"' && report_has "\"reason\": \"$1\""; }

# start_agent NAME VERSION [TREE [FALLBACK]]: the agent for VERSION, downloading from TREE.
start_agent() {
  AGENT_LOG=$WORK/agent-$1.log
  rm -f "$REPORT"
  if [ -n "${3:-}" ]; then
    # plain http on the guest's loopback, and the server's checksums trusted: both opt-ins
    env TT_KMD_VERSION="$2" TT_KMD_PREBUILT_URL="$(url_of "$3")" \
      TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP=true TT_KMD_PREBUILT_TRUST_SERVER_CHECKSUM=true \
      TT_KMD_PREBUILT_FALLBACK="${4:-Build}" "$AGENT" run >"$AGENT_LOG" 2>&1 &
  else
    env TT_KMD_VERSION="$2" "$AGENT" run >"$AGENT_LOG" 2>&1 &
  fi
  AGENT_PID=$!
  echo "prebuilt: run $AGENT_LOG (pid $AGENT_PID): $2 from ${3:-the cache}"
}

# tree NAME: a copy of the served tree under $WWW/NAME, returning its .ko path.
tree() {
  dir=$WWW/$1/$NEW/$RELEASE
  mkdir -p "$dir" && cp "$TTDP_VM_PREBUILT_DIR/$NEW/$RELEASE/tenstorrent.ko" "$dir/" && echo "$dir"
}

# a refused download: the driver stays, nothing is cached
refused() {
  start_agent "$1" "$NEW" "$1" "${3:-Build}"
  require "$1_fails_the_node_with_$2" wait_until "$STEP_LIMIT" failed_with "$2"
  check "$1_leaves_the_old_driver_loaded" loaded_is "$OLD"
  check "$1_caches_nothing" eval '! new_cached'
  stop_agent
}

mkdir -p "$WORK"
echo "prebuilt: kernel $RELEASE, $OLD loaded, $NEW served"
ZEROS=0000000000000000000000000000000000000000000000000000000000000000
dir=$(tree badsum) && echo "$ZEROS  tenstorrent.ko" >"$dir/tenstorrent.ko.sha256"
dir=$(tree badmagic) && sed -i "s/vermagic=${RELEASE%%.*}\\./vermagic=9./" "$dir/tenstorrent.ko" &&
  (cd "$dir" && sha256sum tenstorrent.ko >tenstorrent.ko.sha256)
mkdir -p "$WWW/none"
require loopback_is_up ifconfig lo 127.0.0.1 up
require the_web_server_starts busybox httpd -p "127.0.0.1:$PORT" -h "$WWW"
require the_served_checksum_is_right eval \
  '(cd "$TTDP_VM_PREBUILT_DIR/$NEW/$RELEASE" && sha256sum -c tenstorrent.ko.sha256 >/dev/null)'
require the_patched_module_names_another_kernel eval \
  'grep -a -q "vermagic=9\." "$WWW/badmagic/$NEW/$RELEASE/tenstorrent.ko"'

# --- $OLD from the cache --------------------------------------------------------------------------
require the_old_module_is_seeded_into_the_cache seed "$OLD"
start_agent 0-old "$OLD"
require the_old_module_is_loaded wait_until "$STEP_LIMIT" eval 'report_has "\"phase\": \"Ready\"" && loaded_is "$OLD"'
stop_agent

# --- 1 to 3: refused ------------------------------------------------------------------------------
refused badsum PrebuiltRejected
check badsum_names_the_mismatch report_has "checksum mismatch"
refused badmagic PrebuiltRejected
check badmagic_names_the_vermagic report_has "vermagic 9."
refused none PrebuiltMissing Fail
check none_names_the_url report_has "none/$NEW/$RELEASE/tenstorrent.ko was not found"

# --- 4. the right file ----------------------------------------------------------------------------
start_agent 4-good "$NEW" tt-kmd
require the_prebuilt_module_is_loaded wait_until "$STEP_LIMIT" eval 'report_has "\"phase\": \"Ready\"" && loaded_is "$NEW"'
check it_is_cached_with_its_url grep -q "\"sourceRepository\": \"http://127.0.0.1:$PORT/tt-kmd/$NEW/$RELEASE/tenstorrent.ko\"" \
  "$CACHE/$RELEASE/$NEW/tenstorrent.ko.json"
check it_was_downloaded_not_built grep -q "downloaded from http://127.0.0.1:$PORT/tt-kmd/" "$AGENT_LOG"
check the_probe_passes env TT_KMD_VERSION="$NEW" "$AGENT" probe
stop_agent

finish
