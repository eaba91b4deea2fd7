#!/bin/sh
# Scenario "swap-journal": the promise "a node is never left without the driver it had" on the
# real kernel, with the real, static ttdp-agent binary (report in a file, no cluster). For each
# point where a swap can be cut short, the agent upgrading $OLD to $NEW is SIGKILLed there by the
# test hook (TTDP_TEST_KILL_AT); then $NEW becomes unobtainable (its cache entry corrupt, no
# repository) and the agent is started again. Every time, $OLD must be loaded again, reported
# and labelled, and the swap journal (/run/ttdp/tenstorrent.swap) settled:
#   before-unload        $OLD still loaded; the restart cannot build $NEW (HeadersMissing: the
#                        guest has no kernel headers) and keeps $OLD;
#   after-unload         nothing loaded; the restart loads $OLD back (SwapResumedRolledBack);
#   after-load           (validation failing) $NEW loaded, unproven; the restart validates it,
#                        it fails, and $OLD is loaded back;
#   validation-rollback  (validation failing) $NEW unloaded by its rollback, $OLD not loaded yet;
#                        the restart finishes the rollback.
# Ends with a libtest-style summary line. Arguments are not used.
set -u

AGENT=/opt/ttdp/bin/ttdp-agent
WORK=/run/swap-journal
REPORT=$WORK/report.json
CACHE=/var/cache/tt-kmd
RELEASE=$TTDP_VM_KERNEL_RELEASE
JOURNAL=/run/ttdp/tenstorrent.swap
set -- $TTDP_VM_KO_VERSIONS
OLD=$1
NEW=$2
STEP_LIMIT=60
FAILING='["sh","-c","echo no chips answered; exit 3"]'

export TTDP_HOST_ROOT=/ TTDP_KERNEL=real NODE_NAME=vm-node TTDP_TT_SMI_PATH=none
export TT_KMD_REPOSITORY=/nonexistent TTDP_REPORT="file:$REPORT" TTDP_LOG_FORMAT=json
export TTDP_PROBE_PERIOD=1s TTDP_RETRY_INITIAL=60s TTDP_RETRY_MAX=60s

SCENARIO=swap_journal
. /scenario-lib.sh

dump() {
  dump_agent "$1"
  echo "---- $1: module $(loaded_version), journal:"
  cat "$JOURNAL" 2>/dev/null
}

start_agent() {
  AGENT_LOG=$WORK/agent-$1.log
  version=$2
  shift 2
  rm -f "$REPORT"
  env TT_KMD_VERSION="$version" "$@" "$AGENT" run >"$AGENT_LOG" 2>&1 &
  AGENT_PID=$!
  echo "swap-journal: run $AGENT_LOG (pid $AGENT_PID): target $version $*"
}

ready_for() { loaded_is "$1" && report_has '"phase": "Ready"' && report_has "\"loadedVersion\": \"$1\""; }
back_to_old() {
  loaded_is "$OLD" && report_has "\"reason\": \"$1\"" && report_has "\"loadedVersion\": \"$OLD\"" &&
    report_has "\"driver.tenstorrent.com/kmd-version\": \"$OLD\""
}
dead() { ! kill -0 "$AGENT_PID" 2>/dev/null; }

# point POINT REASON [ENV=VALUE...]: one row of the kill matrix (check() sets $name: not used here)
point() {
  pt=$1
  want=$2
  shift 2
  step_started=$(date +%s)
  require "${pt}_setup_seeds_both_versions" eval 'seed $OLD && seed $NEW'
  start_agent "$pt-setup" "$OLD"
  require "${pt}_setup_has_the_old_version_ready" wait_until "$STEP_LIMIT" ready_for "$OLD"
  stop_agent

  start_agent "$pt-killed" "$NEW" TTDP_TEST_KILL_AT="$pt" "$@"
  require "${pt}_the_agent_is_killed_there" wait_until "$STEP_LIMIT" dead
  wait "$AGENT_PID"
  killed_status=$?
  AGENT_PID=
  left=$(loaded_version)
  check "${pt}_it_died_of_sigkill" [ "$killed_status" = 137 ]
  check "${pt}_a_journal_is_left" [ -s "$JOURNAL" ]

  echo garbage >"$CACHE/$RELEASE/$NEW/tenstorrent.ko"
  start_agent "$pt-restarted" "$NEW" "$@"
  check "${pt}_the_restart_loads_the_old_version_again" wait_until "$STEP_LIMIT" back_to_old "$want"
  check "${pt}_the_journal_is_settled" [ ! -e "$JOURNAL" ]
  check "${pt}_never_installed_as_on_a_new_node" eval '! grep -q -F "\"outcome\":\"Installed\"" $AGENT_LOG'
  echo "swap-journal: killed at $pt: left ${left:-nothing} loaded; after the restart: $(loaded_version) ($(($(date +%s) - step_started)) s)"
  stop_agent
}

mkdir -p "$WORK"
echo "swap-journal: kernel $RELEASE, versions $OLD and $NEW"
point before-unload HeadersMissing
point after-unload SwapResumedRolledBack
point after-load SwapResumedRolledBack TTDP_VALIDATION_COMMAND="$FAILING"
point validation-rollback SwapResumedRolledBack TTDP_VALIDATION_COMMAND="$FAILING"
finish
