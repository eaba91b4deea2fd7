#!/bin/sh
# Scenario "parameters": module parameters (TT_KMD_PARAMETERS, the DaemonSet's rendering of
# spec.module.parameters) with the real, static ttdp-agent binary on the real kernel (report in a
# file, no cluster, so no grant is needed). The stub module has the parameters reset_limit (uint,
# default 10) and auto_reset (bool, default Y):
#   1. install $OLD with reset_limit=5: finit_module gets it, sysfs shows 5, the report carries
#      the parameters read back, the probe passes with them and fails with others;
#   2. the same version with reset_limit=7 alone: the module is reloaded (ModuleReplaced) and
#      sysfs shows 7;
#   3. auto_reset=0 (shown by the kernel as N): Ready after one reload, and no reload after;
#   4. no parameters: the module is reloaded with its defaults (the record says ttdp had set
#      some), sysfs shows reset_limit=10 and auto_reset=Y;
#   5. reset_limit=0x10 auto_reset=off: one reload, sysfs shows 16 and N, and no reload after;
#   6. reset_limit=020 auto_reset=no (the same values): no reload at all.
# Ends with a libtest-style summary line. Arguments are not used.
set -u

AGENT=/opt/ttdp/bin/ttdp-agent
WORK=/run/parameters
REPORT=$WORK/report.json
CACHE=/var/cache/tt-kmd
RELEASE=$TTDP_VM_KERNEL_RELEASE
PARAMS=/sys/module/tenstorrent/parameters
set -- $TTDP_VM_KO_VERSIONS
OLD=$1
STEP_LIMIT=60

SCENARIO=parameters
. /scenario-lib.sh
standalone_agent_env

dump() {
  dump_agent "$1"
  echo "---- $1: module $(cat /sys/module/tenstorrent/version 2>/dev/null), parameters:"
  grep -H . "$PARAMS"/* 2>/dev/null
}

param_is() { [ "$(cat "$PARAMS/$1" 2>/dev/null)" = "$2" ]; }
ready_with() { report_has '"phase": "Ready"' && report_has "\"loadedParameters\": \"$1\""; }
probe_with() { TT_KMD_VERSION=$OLD TT_KMD_PARAMETERS="$1" "$AGENT" probe >/dev/null 2>&1; }
swaps() { grep -c '"module swapped"' "$AGENT_LOG"; }

start_agent() {
  AGENT_LOG=$WORK/agent-$1.log
  rm -f "$REPORT"
  env TT_KMD_VERSION="$OLD" TT_KMD_PARAMETERS="$2" "$AGENT" run >"$AGENT_LOG" 2>&1 &
  AGENT_PID=$!
  echo "parameters: run $AGENT_LOG (pid $AGENT_PID): $OLD with \"$2\""
}

mkdir -p "$WORK"
echo "parameters: kernel $RELEASE, version $OLD"
require the_stub_module_is_seeded_into_the_cache seed "$OLD"

# --- 1. install with a parameter ------------------------------------------------------------------
start_agent 1-install "reset_limit=5"
require the_module_is_loaded_with_the_parameter wait_until "$STEP_LIMIT" eval \
  'ready_with "auto_reset=Y reset_limit=5"'
check sysfs_shows_the_value_passed_to_finit_module param_is reset_limit 5
check the_probe_passes_with_the_loaded_parameters probe_with "reset_limit=5"
check the_probe_fails_with_other_parameters eval '! probe_with "reset_limit=6"'
stop_agent

# --- 2. a parameter change alone reloads the same version ----------------------------------------
start_agent 2-change "reset_limit=7"
require a_changed_parameter_reloads_the_module wait_until "$STEP_LIMIT" eval \
  'ready_with "auto_reset=Y reset_limit=7"'
check sysfs_shows_the_new_value param_is reset_limit 7
check the_reload_is_logged_as_a_swap eval '[ "$(swaps)" = 1 ]'
stop_agent

# --- 3. a boolean shown as Y/N converges and stays --------------------------------------------------
start_agent 3-bool "auto_reset=0"
require a_boolean_parameter_is_loaded wait_until "$STEP_LIMIT" eval 'ready_with "auto_reset=N reset_limit=10"'
sleep 3
check the_agent_does_not_reload_again eval '[ "$(swaps)" = 1 ]'
check the_probe_takes_N_for_0 probe_with "auto_reset=0"
stop_agent

# --- 4. dropping the parameters reloads the defaults ------------------------------------------------
start_agent 4-defaults ""
require dropped_parameters_reload_the_defaults wait_until "$STEP_LIMIT" eval \
  'ready_with "auto_reset=Y reset_limit=10"'
check sysfs_shows_the_defaults eval 'param_is reset_limit 10 && param_is auto_reset Y'
check the_probe_passes_without_parameters probe_with ""
stop_agent

# --- 5. values the kernel prints in another form: one reload, then none -------------------------
start_agent 5-forms "reset_limit=0x10 auto_reset=off"
require hex_and_off_are_loaded_as_16_and_N wait_until "$STEP_LIMIT" eval \
  'ready_with "auto_reset=N reset_limit=16"'
sleep 3
check hex_and_off_reload_once_and_not_again eval '[ "$(swaps)" = 1 ] && param_is reset_limit 16 && param_is auto_reset N'
stop_agent

# --- 6. the same values in octal and as "no": already loaded, nothing reloaded ---------------------
start_agent 6-octal "reset_limit=020 auto_reset=no"
require octal_and_no_are_taken_as_loaded wait_until "$STEP_LIMIT" eval 'ready_with "auto_reset=N reset_limit=16"'
sleep 2
check octal_and_no_need_no_reload eval '[ "$(swaps)" = 0 ]'
check the_probe_takes_plus_16_for_16 probe_with "reset_limit=+16 auto_reset=N"
stop_agent

finish
