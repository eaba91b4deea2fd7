#!/bin/sh
# Scenario "validation": post-load validation of the real, static ttdp-agent binary on the real
# kernel (report in a file, no cluster). The VM has no Tenstorrent PCI device, so the device check
# passes trivially (and says so); the validation command (TTDP_VALIDATION_COMMAND) is what fails
# here, which drives the same rollback a driver that cannot see its cards would:
#   1. install $OLD (cache seeded from the host-built stubs, no build): Ready, "no Tenstorrent PCI
#      device"; the probe passes;
#   2. upgrade to $NEW with a command that exits 3: $NEW is loaded, fails validation and $OLD is
#      loaded back on the real kernel (ValidationFailedRolledBack, its output quoted); the probe
#      fails for $NEW;
#   3. a command that holds /dev/tenstorrent/0 past its timeout: killed with its process group, so
#      the new module can be unloaded and $OLD comes back;
#   4. a command that checks the stub's device node passes: $NEW is Ready and the probe, given
#      the same command, passes (it reads the agent's record), while another command does not.
# Ends with a libtest-style summary line. Arguments are not used.
set -u

AGENT=/opt/ttdp/bin/ttdp-agent
WORK=/run/validation
REPORT=$WORK/report.json
CACHE=/var/cache/tt-kmd
RELEASE=$TTDP_VM_KERNEL_RELEASE
set -- $TTDP_VM_KO_VERSIONS
OLD=$1
NEW=$2
STEP_LIMIT=60

export TTDP_HOST_ROOT=/ TTDP_KERNEL=real NODE_NAME=vm-node TTDP_TT_SMI_PATH=none
export TT_KMD_REPOSITORY=/nonexistent TTDP_REPORT="file:$REPORT" TTDP_LOG_FORMAT=json
export TTDP_PROBE_PERIOD=1s TTDP_RETRY_INITIAL=60s TTDP_RETRY_MAX=60s

SCENARIO=validation
. /scenario-lib.sh

dump() {
  dump_agent "$1"
  echo "---- $1: module $(loaded_version), refcnt $(cat /sys/module/tenstorrent/refcnt 2>/dev/null)"
}

probe_passes() { TT_KMD_VERSION=$1 "$AGENT" probe >/dev/null 2>&1; }
ready_for() { loaded_is "$1" && report_has '"phase": "Ready"' && report_has "\"loadedVersion\": \"$1\""; }
failed_with() { report_has '"phase": "Failed"' && report_has "\"reason\": \"$1\""; }

start_agent() {
  AGENT_LOG=$WORK/agent-$1.log
  version=$2
  shift 2
  rm -f "$REPORT"
  env TT_KMD_VERSION="$version" "$@" "$AGENT" run >"$AGENT_LOG" 2>&1 &
  AGENT_PID=$!
  echo "validation: run $AGENT_LOG (pid $AGENT_PID): target $version $*"
}

mkdir -p "$WORK"
echo "validation: kernel $RELEASE, versions $OLD and $NEW"
require the_stub_modules_are_seeded_into_the_cache eval 'seed $OLD && seed $NEW'

# --- 1. install: no card to validate ------------------------------------------------------------
start_agent 1-install "$OLD"
require a_node_without_cards_installs_and_validates_trivially wait_until "$STEP_LIMIT" ready_for "$OLD"
check the_report_says_there_was_no_card_to_validate report_has 'no Tenstorrent PCI device (vendor 1e52) on this node'
check the_probe_passes_for_the_installed_version probe_passes "$OLD"
stop_agent

# --- 2. a failing command rolls the upgrade back on the real kernel ------------------------------
start_agent 2-failing "$NEW" TTDP_VALIDATION_COMMAND='["sh","-c","echo no chips answered; exit 3"]'
require a_failed_validation_loads_the_previous_version_back wait_until "$STEP_LIMIT" eval \
  'failed_with ValidationFailedRolledBack && loaded_is $OLD'
check the_message_quotes_the_command_and_its_output eval \
  'report_has "failed with exit status: 3" && report_has "no chips answered" && report_has "tenstorrent $OLD was loaded back"'
check the_agent_log_records_the_failed_attempt grep -q -F '"reason":"ValidationFailedRolledBack"' "$AGENT_LOG"
check the_probe_fails_for_the_rejected_version eval '! probe_passes $NEW && probe_passes $OLD'
stop_agent

# --- 3. a command holding the device past its timeout is killed with its group ------------------
start_agent 3-timeout "$NEW" TTDP_VALIDATION_TIMEOUT=2s \
  TTDP_VALIDATION_COMMAND='["sh","-c","sleep 300 </dev/tenstorrent/0 & wait"]'
require a_command_past_its_timeout_is_killed_and_the_upgrade_rolled_back wait_until "$STEP_LIMIT" eval \
  'failed_with ValidationFailedRolledBack && loaded_is $OLD'
check the_message_says_it_timed_out report_has 'did not finish within 2 s and was killed'
check nothing_of_the_command_is_left_holding_the_device eval '! pgrep -f "sleep 300" >/dev/null'
stop_agent

# --- 4. a passing command: Ready, and the probe needs its record --------------------------------
PASSING='["sh","-c","test -c /dev/tenstorrent/0"]'
start_agent 4-passing "$NEW" TTDP_VALIDATION_COMMAND="$PASSING"
require a_passing_command_lets_the_upgrade_through wait_until "$STEP_LIMIT" ready_for "$NEW"
check the_report_says_the_command_passed report_has 'passed'
check the_probe_with_the_same_command_passes env TTDP_VALIDATION_COMMAND="$PASSING" TT_KMD_VERSION="$NEW" "$AGENT" probe
check the_probe_with_another_command_has_no_proof eval \
  '! TTDP_VALIDATION_COMMAND="[\"tt-smi\",\"-s\"]" TT_KMD_VERSION=$NEW $AGENT probe'
stop_agent

finish
