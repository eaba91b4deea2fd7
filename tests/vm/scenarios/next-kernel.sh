#!/bin/sh
# Scenario "next-kernel": the kernel a node boots next gets its module before the reboot, with
# the real, static ttdp-agent binary on real kernels (report in a file, no cluster). Two boots
# (TTDP_VM_BOOT), the .ko cache kept between them in a host folder shared over 9p:
#   1. on $TTDP_VM_FIRST_RELEASE, with the host's /usr (git, make, gcc) and the unpacked headers
#      of $TTDP_VM_NEXT_RELEASE (9p tag nextheaders, linked in at /lib/modules/<release>/build
#      and /usr/src as the headers packages would put them), and a third kernel with an image
#      but no headers: the agent builds and loads $NEW for the running kernel, then builds it
#      in the background for the next kernel (Ready in installedKernels, its vermagic naming
#      that kernel) and reports the third Failed/HeadersMissing, the loaded module untouched;
#   2. on $TTDP_VM_NEXT_RELEASE without the host's /usr (nothing can be built) and with the
#      first kernel still installed (an image, no headers): the agent loads the cached module at
#      once (its cache-hit log line, startLoad.cacheHit, the time from its start to Ready
#      printed as NEXT-KERNEL-READY-MS), lists the first kernel Ready, and prunes its cache
#      entry once that kernel is removed.
# Ends with a libtest-style summary line. Arguments are not used.
set -u

AGENT=/opt/ttdp/bin/ttdp-agent
WORK=/run/next-kernel
REPORT=$WORK/report.json
CACHE=/var/cache/tt-kmd
FIRST=$TTDP_VM_FIRST_RELEASE
NEXT=$TTDP_VM_NEXT_RELEASE
NOHEADERS=6.1.0-999-amd64
set -- $TTDP_VM_KO_VERSIONS
NEW=$2
# two builds in the guest: ~35 s each on an idle machine, several times that on a busy one
BUILD_LIMIT=500

SCENARIO=next_kernel_$TTDP_VM_BOOT
. /scenario-lib.sh
standalone_agent_env
# no udevd runs in the guest: the rule is written, udev is not told
export TTDP_KERNEL_SCAN_PERIOD=1s TT_KMD_VERSION=$NEW TTDP_UDEVADM=none

dump() {
  dump_agent "$1"
  echo "---- $1: module $(loaded_version); cache:"
  ls -lR "$CACHE" 2>/dev/null
  echo "---- /lib/modules:"
  ls -l /lib/modules/ 2>/dev/null
}

# kernel_is RELEASE STATE: the report lists RELEASE in installedKernels with STATE.
kernel_is() {
  grep -A1 "\"release\": \"$1\"" "$REPORT" 2>/dev/null | grep -q "\"state\": \"$2\""
}
# kernel_reason RELEASE REASON: and with that reason.
kernel_reason() {
  grep -A2 "\"release\": \"$1\"" "$REPORT" 2>/dev/null | grep -q "\"reason\": \"$2\""
}
kernel_listed() { grep -q "\"release\": \"$1\"" "$REPORT" 2>/dev/null; }
cached_for() { [ -f "$CACHE/$1/$NEW/tenstorrent.ko" ] && [ -f "$CACHE/$1/$NEW/tenstorrent.ko.json" ]; }
ready_at_new() { report_has '"phase": "Ready"' && loaded_is "$NEW"; }
swaps() { grep -c '"module swapped"' "$AGENT_LOG"; }
uptime_ms() { awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime; }

start_agent() {
  AGENT_LOG=$WORK/agent-$1.log
  rm -f "$REPORT"
  "$AGENT" run >"$AGENT_LOG" 2>&1 &
  AGENT_PID=$!
  echo "next-kernel: run $AGENT_LOG (pid $AGENT_PID) on $(uname -r)"
}

# The second kernel's headers where its packages would put them: /usr/src/linux-headers-*
# (its Makefile includes the -common tree by that absolute path) and
# /lib/modules/<release>/build. The host's /usr is read-only: /usr/src and /usr/lib/modules
# become tmpfs directories leading to the host's entries and the unpacked ones.
link_next_headers() {
  mkdir -p /next-headers /host-usr &&
    mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 nextheaders /next-headers &&
    mount -o bind /usr /host-usr &&
    mount -t tmpfs tmpfs /usr/src &&
    mount -t tmpfs tmpfs /usr/lib/modules || return 1
  for entry in /host-usr/src/* /next-headers/usr/src/*; do
    ln -s "$entry" "/usr/src/${entry##*/}" || return 1
  done
  ln -s "/host-usr/lib/modules/$FIRST" "/usr/lib/modules/$FIRST" &&
    mkdir -p "/lib/modules/$NEXT" &&
    ln -s "/usr/src/linux-headers-$NEXT" "/lib/modules/$NEXT/build" &&
    [ -f "/lib/modules/$NEXT/build/Makefile" ]
}

mkdir -p "$WORK" "$CACHE"
require the_shared_cache_is_mounted \
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 kocache "$CACHE"

if [ "$TTDP_VM_BOOT" = 1 ]; then
  echo "next-kernel: boot 1 on $FIRST; next kernel $NEXT; $NOHEADERS has no headers"
  require the_next_kernels_headers_are_in_place link_next_headers
  # a kernel installed without its headers: an image and a modules directory
  mkdir -p "/lib/modules/$NOHEADERS/kernel" /boot && echo image >"/boot/vmlinuz-$NOHEADERS"
  export TT_KMD_REPOSITORY=$TTDP_VM_STUB_REPO

  start_agent 1
  require the_running_kernel_gets_its_module wait_until "$BUILD_LIMIT" ready_at_new
  require the_next_kernel_gets_its_module_in_the_background \
    wait_until "$BUILD_LIMIT" kernel_is "$NEXT" Ready
  check the_next_kernels_module_is_cached_for_it eval \
    'cached_for "$NEXT" && grep -a -q "vermagic=$NEXT " "$CACHE/$NEXT/$NEW/tenstorrent.ko"'
  check the_running_kernels_module_is_cached_for_it cached_for "$FIRST"
  check it_was_built_in_the_background grep -q '"module ready for an installed kernel' "$AGENT_LOG"
  require the_kernel_without_headers_is_reported \
    wait_until 60 kernel_is "$NOHEADERS" Failed
  check it_says_headers_are_missing kernel_reason "$NOHEADERS" HeadersMissing
  check it_says_what_to_install report_has "install linux-headers-$NOHEADERS"
  check nothing_is_cached_for_it eval '! cached_for "$NOHEADERS"'
  check the_running_kernel_is_not_listed eval '! kernel_listed "$FIRST"'
  check the_loaded_module_was_never_touched eval '[ "$(swaps)" = 1 ] && ready_at_new'
  stop_agent
  sync
else
  echo "next-kernel: boot 2 on $NEXT (after $FIRST); no toolchain"
  check this_is_the_next_kernel [ "$(uname -r)" = "$NEXT" ]
  check no_compiler_is_here eval '! command -v make >/dev/null && ! command -v gcc >/dev/null'
  require the_first_boots_module_is_cached cached_for "$NEXT"
  # the kernel the node came from stays installed: an image, no headers
  mkdir -p "/lib/modules/$NEXT/kernel" "/lib/modules/$FIRST/kernel" /boot &&
    echo image >"/boot/vmlinuz-$FIRST"

  started=$(uptime_ms)
  start_agent 2
  require the_cached_module_is_loaded wait_until 60 ready_at_new
  seen=$(($(uptime_ms) - started))
  check the_agent_logs_the_cache_hit \
    grep -q "cache hit for tt-kmd $NEW on kernel $NEXT: loaded without building" "$AGENT_LOG"
  check nothing_was_built eval '! grep -q "\"cache\":\"miss\"" "$AGENT_LOG" && ! grep -q "\"phase\": \"Building\"" "$REPORT"'
  check the_report_says_cache_hit report_has '"cacheHit": true'
  ready_ms=$(sed -n 's/.*"readyAfterMs": \([0-9]*\).*/\1/p' "$REPORT")
  check the_report_says_how_soon [ -n "$ready_ms" ]
  echo "NEXT-KERNEL-READY-MS agent=${ready_ms:-?} seen=$seen"
  require the_first_kernel_is_listed_ready wait_until 30 kernel_is "$FIRST" Ready

  rm -rf "/lib/modules/$FIRST" "/boot/vmlinuz-$FIRST"
  check its_cache_entry_is_pruned_once_it_is_removed wait_until 30 eval '[ ! -e "$CACHE/$FIRST" ]'
  check it_is_no_longer_listed wait_until 10 eval '! kernel_listed "$FIRST"'
  check the_running_kernels_entry_stays cached_for "$NEXT"
  check the_module_stays_loaded ready_at_new
  stop_agent
fi

finish
