#!/bin/sh
# Scenario "agent": the real, static ttdp-agent binary (/opt/ttdp/bin/ttdp-agent) on the real
# kernel, as the DaemonSet pod would run it, with its Kubernetes reporting written to a JSON file
# (TTDP_REPORT=file:...) because the VM has no network. The host's /usr is mounted over 9p, so a
# cache miss fetches tag ttkmd-<version> from the stub repository ($TTDP_VM_STUB_REPO) and builds it
# here (the only in-guest build of this scenario).
#
# One agent run per step, restarted with a new TT_KMD_VERSION the way a new pod would be:
#   1. fresh install of 1.0.0: cache miss, build in the guest, load, probe, report Ready, tt-smi;
#      SIGTERM leaves the module loaded;
#   2. upgrade 1.0.0 -> 2.0.0 from a cache entry seeded from the host-built stub (no build);
#   3. busy module: a process holds /dev/tenstorrent/0; the agent (no force) waits, reports
#      WaitingForHolders with its pid and comm, stays not ready and leaves the module alone; when
#      the holder exits it swaps back to 1.0.0 from its own cache entry (a cache hit, no build);
#      the module removed behind its back is loaded again;
#   4. force unload (TT_FORCE_UNLOAD=true) SIGKILLs the holder and swaps to 2.0.0;
#      SIGTERM after ready leaves the module loaded;
#   5. failures keep the working module: a version without a tag fails to fetch before anything
#      is unloaded; the broken stub version (seeded into the cache, its init fails) is rolled back;
#   7. one lock per node: an agent paused (test hook) between unload and load holds the module
#      lock in /run/ttdp; a second agent started meanwhile waits, then finds the target loaded;
#   8. SIGKILL (test hook TTDP_TEST_KILL_AT) before the unload, between unload and load, and after
#      the load before the label: the next agent run converges to its target;
#   9. no rollback path (the loaded version's .ko gone from the cache and its tag missing): nothing
#      is unloaded and NoRollbackPath is reported, until the node is labelled
#      driver.tenstorrent.com/allow-no-rollback=true.
# Each check prints a libtest-style line; the last line sums them up for the harness. A step whose
# outcome the next steps depend on aborts the run when it fails. Arguments are not used.
set -u

AGENT=/opt/ttdp/bin/ttdp-agent
WORK=/run/agent
REPORT=$WORK/report.json
CACHE=/var/cache/tt-kmd
RELEASE=$TTDP_VM_KERNEL_RELEASE
# the first two stub versions that load, oldest first
set -- $TTDP_VM_KO_VERSIONS
OLD=$1
NEW=$2
TT_SMI_SOURCE=/opt/ttdp/tt-smi
TT_SMI_TEST_VERSION=1.2.3
# limits: the in-guest build takes ~35 s on an idle host and several minutes on a loaded one
BUILD_LIMIT=420
STEP_LIMIT=60

export TTDP_HOST_ROOT=/ TTDP_KERNEL=real NODE_NAME=vm-node
export TT_KMD_REPOSITORY="$TTDP_VM_STUB_REPO" TTDP_REPORT="file:$REPORT" TTDP_LOG_FORMAT=json
export TT_SMI_VERSION=$TT_SMI_TEST_VERSION TTDP_TT_SMI_PATH=$TT_SMI_SOURCE
export TTDP_PROBE_PERIOD=1s TTDP_RETRY_INITIAL=1s TTDP_RETRY_MAX=2s
export TT_FORCE_UNLOAD=false

SCENARIO=agent
. /scenario-lib.sh

# --- reporting -------------------------------------------------------------------------------

# dump NAME: what the current agent run logged and reported, for a failed check
dump() {
  dump_agent "$1"
  echo "---- $1: module: version $(loaded_version) refcnt $(cat /sys/module/tenstorrent/refcnt 2>/dev/null)"
}

# --- what the host shows -----------------------------------------------------------------------

refcnt_above_0() { [ "$(cat /sys/module/tenstorrent/refcnt 2>/dev/null || echo 0)" -gt 0 ]; }
probe_passes() { TT_KMD_VERSION=$1 "$AGENT" probe >/dev/null 2>&1; }
probe_fails() { ! probe_passes "$1"; }
alive() { [ -e "/proc/$1" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }

report_lacks() { ! report_has "$1"; }
report_ready_for() {
  report_has '"phase": "Ready"' && report_has "\"targetVersion\": \"$1\"" &&
    report_has "\"loadedVersion\": \"$1\""
}
labelled() {
  report_has "\"driver.tenstorrent.com/kmd-version\": \"$1\"" &&
    report_has '"driver.tenstorrent.com/install-mode": "container"'
}
log_has() { grep -q -F -- "$1" "$AGENT_LOG"; }
log_lacks() { ! log_has "$1"; }
# builds done by every agent run so far (one log line per .ko made ready, "cache":"miss" for a build)
builds_so_far() { cat "$WORK"/agent-*.log | grep -F '"step":"ensure-ko"' | grep -c -F '"cache":"miss"'; }
builds_so_far_are() { [ "$(builds_so_far)" = "$1" ]; }

# --- driving the agent -------------------------------------------------------------------------

# start_agent NAME VERSION [VAR=VALUE...]: runs `ttdp-agent run` in the background
start_agent() {
  AGENT_LOG=$WORK/agent-$1.log
  version=$2
  shift 2
  env TT_KMD_VERSION="$version" "$@" "$AGENT" run >"$AGENT_LOG" 2>&1 &
  AGENT_PID=$!
  step_started=$(date +%s)
  echo "agent: run $AGENT_LOG (pid $AGENT_PID): target $version $*"
}

# stop_agent: SIGTERM; sets AGENT_EXIT (the exit status, or "none" when it did not exit in 20 s)
stop_agent() {
  kill -TERM "$AGENT_PID"
  if wait_until 20 eval '! alive $AGENT_PID'; then
    wait "$AGENT_PID"
    AGENT_EXIT=$?
  else
    AGENT_EXIT=none
    kill -KILL "$AGENT_PID"
    wait "$AGENT_PID"
  fi
  AGENT_PID=
}

exited_cleanly_leaving() {
  [ "$AGENT_EXIT" = 0 ] && loaded_is "$1" && probe_passes "$1" &&
    log_has 'shutting down; the loaded module stays loaded'
}

took() { echo "agent: $1 in $(($(date +%s) - step_started)) s"; }

# start_holder: a process (comm "sleep") holding /dev/tenstorrent/0 open on its stdin; sets HOLDER
# (each open raises refcnt by 2 here: one for the cdev, one for its file operations)
start_holder() {
  sleep 1000 </dev/tenstorrent/0 &
  HOLDER=$!
  wait_until 10 eval '[ "$(cat /proc/$HOLDER/comm)" = sleep ] &&
    [ "$(readlink /proc/$HOLDER/fd/0)" = /dev/tenstorrent/0 ] && refcnt_above_0'
}

# seed_cache VERSION: puts the host-built stub .ko of VERSION in the agent's cache, with a record
# made from the one the agent wrote for $OLD (only the fields that differ are changed), so the
# agent finds a verified entry instead of building it
seed_cache() {
  model=$CACHE/$RELEASE/$OLD/tenstorrent.ko.json
  dir=$CACHE/$RELEASE/$1
  mkdir -p "$dir" && cp "$TTDP_VM_KO_DIR/$1/tenstorrent.ko" "$dir/tenstorrent.ko" || return 1
  sha=$(sha256sum "$dir/tenstorrent.ko" | cut -d' ' -f1)
  srcversion=$(grep -a -o 'srcversion=[0-9A-F]*' "$dir/tenstorrent.ko" | head -n1 | cut -d= -f2)
  commit=$(git --git-dir="$TTDP_VM_STUB_REPO" rev-parse "ttkmd-$1^{commit}") || return 1
  sed -e "s/\"version\": \"$OLD\"/\"version\": \"$1\"/" \
    -e "s/\"sha256\": \"[0-9a-f]*\"/\"sha256\": \"$sha\"/" \
    -e "s/\"srcversion\": \"[0-9A-F]*\"/\"srcversion\": \"$srcversion\"/" \
    -e "s/\"sourceCommit\": \"[0-9a-f]*\"/\"sourceCommit\": \"$commit\"/" \
    "$model" >"$dir/tenstorrent.ko.json"
}

# --- the node --------------------------------------------------------------------------------

mkdir -p "$WORK"
# the agent installs tt-smi to the host's /usr/local/bin, but /usr is the build host's, read-only
mount -t tmpfs tmpfs /usr/local && mkdir -p /usr/local/bin
printf '#!/bin/sh\necho "tt-smi %s (vm-test stand-in)"\n' "$TT_SMI_TEST_VERSION" >"$TT_SMI_SOURCE"
chmod 0755 "$TT_SMI_SOURCE"
echo "agent: kernel $RELEASE, versions $OLD and $NEW, repository $TT_KMD_REPOSITORY"

# --- 1. fresh install: cache miss, build in the guest ------------------------------------------

require nothing_is_loaded_before_the_agent_runs eval '[ ! -e /sys/module/tenstorrent ] && probe_fails $OLD'
start_agent 1-fresh "$OLD"
require fresh_install_loads_the_target wait_until "$BUILD_LIMIT" eval 'loaded_is $OLD && report_ready_for $OLD'
took "fresh install (fetch, build, load)"
grep -F '"step":"ensure-ko"' "$AGENT_LOG" | grep -o '"cache".*"elapsed_ms":[0-9]*' | sed 's/^/agent: ensure-ko /'
grep -F '"step":"swap"' "$AGENT_LOG" | grep -o '"unload_ms".*"total_ms":[0-9]*' | sed 's/^/agent: swap /'
check fresh_install_probe_passes_only_for_the_target eval 'probe_passes $OLD && probe_fails $NEW'
check fresh_install_labels_the_node_with_the_loaded_version labelled "$OLD"
check fresh_install_was_built_in_the_guest_and_cached eval \
  'log_has "\"cache\":\"miss\"" && builds_so_far_are 1 &&
   [ -s $CACHE/$RELEASE/$OLD/tenstorrent.ko ] && [ -s $CACHE/$RELEASE/$OLD/tenstorrent.ko.json ]'
check fresh_install_event_says_loaded report_has "\"note\": \"loaded tt-kmd $OLD"
check tt_smi_is_copied_to_the_host_and_labelled eval \
  'cmp -s $TT_SMI_SOURCE /usr/local/bin/tt-smi && [ -x /usr/local/bin/tt-smi ] &&
   report_has "\"tt-smi.driver.tenstorrent.com/version\": \"$TT_SMI_TEST_VERSION\""'
OLD_SHA=$(sha256sum "$CACHE/$RELEASE/$OLD/tenstorrent.ko" | cut -d' ' -f1)
stop_agent
require sigterm_after_a_fresh_install_leaves_the_module_loaded exited_cleanly_leaving "$OLD"

# --- 2. upgrade from a seeded cache entry --------------------------------------------------------

require the_new_version_is_seeded_into_the_cache seed_cache "$NEW"
start_agent 2-upgrade "$NEW"
require upgrade_swaps_to_the_new_version wait_until "$STEP_LIMIT" eval 'loaded_is $NEW && report_ready_for $NEW'
took "upgrade $OLD -> $NEW"
check upgrade_probe_passes_only_for_the_new_version eval 'probe_passes $NEW && probe_fails $OLD'
check upgrade_labels_the_node_with_the_new_version labelled "$NEW"
check upgrade_takes_the_seeded_entry_without_building eval \
  'log_has "\"cache\":\"hit\"" && log_lacks "\"cache\":\"miss\"" && builds_so_far_are 1'
check upgrade_event_names_both_versions report_has "\"note\": \"replaced tt-kmd $OLD with $NEW"
stop_agent
require sigterm_after_an_upgrade_leaves_the_module_loaded exited_cleanly_leaving "$NEW"

# --- 3. busy module: wait for the holder, then swap (back to $OLD, a cache hit) -----------------

require a_holder_opens_the_device start_holder
start_agent 3-busy "$OLD"
require busy_module_is_reported_with_its_holder wait_until "$STEP_LIMIT" eval \
  'report_has "\"phase\": \"WaitingForHolders\"" && report_has "\"pid\": $HOLDER," &&
   report_has "\"comm\": \"sleep\"" && report_has "\"reason\": \"DeviceHeld\""'
took "busy module reported"
check busy_module_event_names_the_holder report_has "held by pid $HOLDER (sleep)"
# several probe periods later nothing has changed: no force, no crash loop, not ready
sleep 3
check busy_module_is_left_alone_and_not_ready eval \
  'loaded_is $NEW && alive $HOLDER && alive $AGENT_PID && probe_fails $OLD &&
   report_has "\"phase\": \"WaitingForHolders\""'
kill "$HOLDER"
{ wait "$HOLDER"; } 2>/dev/null
step_started=$(date +%s)
require after_the_holder_exits_the_target_is_loaded wait_until "$STEP_LIMIT" eval \
  'loaded_is $OLD && report_ready_for $OLD && report_lacks "\"holders\""'
took "swap after the holder exited"
check second_run_of_a_version_is_a_cache_hit eval \
  'log_has "\"cache\":\"hit\"" && log_lacks "\"cache\":\"miss\"" && builds_so_far_are 1 &&
   [ "$(sha256sum $CACHE/$RELEASE/$OLD/tenstorrent.ko | cut -d" " -f1)" = "$OLD_SHA" ]'
# the module removed behind the agent's back: readiness follows, the agent loads it again
rmmod tenstorrent
step_started=$(date +%s)
require a_module_removed_behind_its_back_is_loaded_again wait_until "$STEP_LIMIT" eval \
  'loaded_is $OLD && report_has "\"reason\": \"ModuleChangedExternally\"" && report_ready_for $OLD'
took "reload after rmmod"
stop_agent
require sigterm_while_idle_leaves_the_module_loaded exited_cleanly_leaving "$OLD"

# --- 4. force unload -----------------------------------------------------------------------------

require a_holder_opens_the_device_again start_holder
start_agent 4-force "$NEW" TT_FORCE_UNLOAD=true
require force_unload_swaps_despite_the_holder wait_until "$STEP_LIMIT" eval 'loaded_is $NEW && report_ready_for $NEW'
took "forced swap $OLD -> $NEW"
{ wait "$HOLDER"; } 2>/dev/null
holder_status=$?
check force_unload_killed_the_holder_with_sigkill eval \
  '[ $holder_status = 137 ] && report_has "force unload killed pid $HOLDER (sleep)"'
check force_unload_did_not_build builds_so_far_are 1
stop_agent
require sigterm_after_ready_leaves_the_module_loaded exited_cleanly_leaving "$NEW"

# --- 5. failures leave the working module loaded -------------------------------------------------
# (retries pushed out of the way, so the checks see the state after the first failure)

# failed_keeping VERSION REASON: the agent reports REASON for target VERSION, is still running, and
# $NEW is still loaded and ready
failed_keeping() {
  report_has '"phase": "Failed"' && report_has "\"targetVersion\": \"$1\"" &&
    report_has "\"reason\": \"$2\"" && loaded_is "$NEW" && report_has "\"loadedVersion\": \"$NEW\"" &&
    alive "$AGENT_PID"
}

MISSING=9.9.9
start_agent 5-missing-tag "$MISSING" TTDP_RETRY_INITIAL=60s TTDP_RETRY_MAX=60s
require a_missing_tag_fails_before_unloading wait_until "$STEP_LIMIT" failed_keeping "$MISSING" FetchFailed
took "missing tag reported"
check a_missing_tag_keeps_the_old_module_without_readiness eval \
  'probe_fails $MISSING && probe_passes $NEW && labelled $NEW && builds_so_far_are 1'
stop_agent
check sigterm_after_a_failed_fetch_exits_cleanly exited_cleanly_leaving "$NEW"

BROKEN=$TTDP_VM_KO_BROKEN_VERSION
require the_broken_version_is_seeded_into_the_cache seed_cache "$BROKEN"
start_agent 6-rollback "$BROKEN" TTDP_RETRY_INITIAL=60s TTDP_RETRY_MAX=60s
require a_version_that_fails_to_load_is_rolled_back wait_until "$STEP_LIMIT" failed_keeping "$BROKEN" LoadFailedRolledBack
took "failed load rolled back"
check a_rolled_back_node_stays_not_ready_for_the_target eval \
  'probe_fails $BROKEN && probe_passes $NEW && labelled $NEW && builds_so_far_are 1'
stop_agent
check sigterm_after_a_rollback_leaves_the_old_module_loaded exited_cleanly_leaving "$NEW"

# --- 7. one module lock per node: a second agent waits, and does not undo the first one's load ---
# The first agent pauses (test hook) between its unload and its load, holding the lock in
# /run/ttdp; a second agent (a replacement pod) starts meanwhile with the same target.

PAUSE=$WORK/pause
start_agent 7-lock-first "$OLD" TTDP_TEST_PAUSE_AT=after-unload TTDP_TEST_PAUSE_FILE="$PAUSE"
FIRST_PID=$AGENT_PID
FIRST_LOG=$AGENT_LOG
require the_first_agent_pauses_between_unload_and_load wait_until "$STEP_LIMIT" eval \
  '[ -e $PAUSE ] && [ ! -e /sys/module/tenstorrent ]'
start_agent 7-lock-second "$OLD" TTDP_REPORT="file:$WORK/report-second.json" TTDP_LOCK_DIR=/run/ttdp
SECOND_PID=$AGENT_PID
SECOND_LOG=$AGENT_LOG
sleep 3
check the_second_agent_waits_for_the_module_lock eval \
  '[ ! -e /sys/module/tenstorrent ] && alive $SECOND_PID &&
   grep -q -F "\"step\":\"ensure-ko\"" $SECOND_LOG && ! grep -q -F "\"step\":\"swap\"" $SECOND_LOG'
rm -f "$PAUSE"
step_started=$(date +%s)
require after_the_pause_both_agents_see_the_target_loaded wait_until "$STEP_LIMIT" eval \
  'loaded_is $OLD && grep -q -F "\"step\":\"swap\"" $FIRST_LOG && grep -q -F "\"step\":\"swap\"" $SECOND_LOG'
took "two agents, one swap"
check only_the_first_agent_swapped_the_second_found_it_loaded eval \
  'grep -F "\"step\":\"swap\"" $FIRST_LOG | grep -q -F "\"outcome\":\"Replaced\"" &&
   grep -F "\"step\":\"swap\"" $SECOND_LOG | grep -q -F "\"outcome\":\"AlreadyLoaded\"" &&
   [ -e /run/ttdp/tenstorrent.lock ] && loaded_is $OLD'
AGENT_PID=$SECOND_PID AGENT_LOG=$SECOND_LOG
stop_agent
AGENT_PID=$FIRST_PID AGENT_LOG=$FIRST_LOG
stop_agent
check both_agents_leave_the_module_loaded exited_cleanly_leaving "$OLD"

# --- 8. SIGKILL at every point of a swap, then a restart converges ------------------------------

# killed_at NAME VERSION POINT: an agent run the test hook SIGKILLs at POINT of its swap
killed_at() {
  start_agent "$1" "$2" TTDP_TEST_KILL_AT="$3"
  wait_until "$STEP_LIMIT" eval '! alive $AGENT_PID'
  wait "$AGENT_PID"
  KILLED_STATUS=$?
  AGENT_PID=
  echo "agent: killed at $3, exit status $KILLED_STATUS"
  [ "$KILLED_STATUS" = 137 ]
}
# converges NAME VERSION: a restarted agent (no hook) makes VERSION loaded, ready and labelled
converges() {
  target=$2
  start_agent "$1" "$target"
  wait_until "$STEP_LIMIT" eval 'loaded_is $target && report_ready_for $target && labelled $target'
}

require sigkill_before_the_unload killed_at 8-kill-before-unload "$NEW" before-unload
check sigkill_before_the_unload_leaves_the_old_module loaded_is "$OLD"
require a_restart_after_sigkill_before_the_unload_converges converges 8-restart-1 "$NEW"
took "restart after SIGKILL before the unload"
stop_agent

require sigkill_between_unload_and_load killed_at 8-kill-after-unload "$OLD" after-unload
check sigkill_between_unload_and_load_leaves_no_module eval '[ ! -e /sys/module/tenstorrent ] && probe_fails $OLD'
require a_restart_after_sigkill_between_unload_and_load_converges converges 8-restart-2 "$OLD"
took "no module loaded until the restart converged"
stop_agent

require sigkill_after_the_load_before_the_label killed_at 8-kill-after-load "$NEW" after-load
check sigkill_after_the_load_leaves_the_new_module_with_the_old_label eval 'loaded_is $NEW && labelled $OLD'
require a_restart_after_sigkill_after_the_load_converges converges 8-restart-3 "$NEW"
took "restart after SIGKILL after the load"
check the_restart_after_the_load_only_labels eval 'log_lacks "\"step\":\"swap\"" && labelled $NEW'
stop_agent

# --- 9. no rollback path: nothing is unloaded, unless the node opts in --------------------------
# $NEW is loaded, its cache entry is removed and its tag is missing from the repository the agent
# uses, so no .ko of it can be had if $OLD failed to load.

PARTIAL=$WORK/partial.git
rm -rf "${CACHE:?}/$RELEASE/$NEW"
git clone -q --bare "$TTDP_VM_STUB_REPO" "$PARTIAL" && git --git-dir="$PARTIAL" tag -d "ttkmd-$NEW" >/dev/null
start_agent 9-no-rollback "$OLD" TT_KMD_REPOSITORY="$PARTIAL" TTDP_RETRY_INITIAL=1s TTDP_RETRY_MAX=1s
require without_a_rollback_path_nothing_is_unloaded wait_until "$STEP_LIMIT" failed_keeping "$OLD" NoRollbackPath
took "missing rollback path reported"
check the_failure_says_how_to_opt_in eval \
  'report_has "driver.tenstorrent.com/allow-no-rollback=true" && report_has "nothing was unloaded" &&
   probe_fails $OLD && probe_passes $NEW'
sleep 2
check it_stays_refused_while_not_opted_in failed_keeping "$OLD" NoRollbackPath
# the admin labels the node (the report file stands for the Node object)
sed -i 's|"labels": {|"labels": {\n    "driver.tenstorrent.com/allow-no-rollback": "true",|' "$REPORT"
step_started=$(date +%s)
require with_the_opt_in_label_the_agent_upgrades wait_until "$STEP_LIMIT" eval 'loaded_is $OLD && report_ready_for $OLD'
took "upgrade without a rollback path after the opt-in"
check the_upgrade_without_rollback_is_announced report_has '"reason": "UpgradingWithoutRollback"'
stop_agent

finish
