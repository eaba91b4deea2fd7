#!/bin/sh
# Scenario "udev": tt-kmd's udev rule with the real, static ttdp-agent binary on the real kernel
# (report in a file, no cluster, so no grant is needed), and the host's udevd (Debian's udev
# package, from the host's /usr over 9p) running in the guest. Every stub version's tag ships
# udev-50-tenstorrent.rules with a mode of its own (the stub's kernel devnode alone gives 0666);
# the cache is seeded with records carrying that rule, as a build from the tag records it.
#   1. install $OLD: the rule file is $OLD's (ttdp's header, then the tag's rule), `udevadm test`
#      reads it without complaint and applies its mode, /dev/tenstorrent/0 gets that mode and
#      udev's symlink, the report shows the rule;
#   2. upgrade to $NEW: the file is replaced by $NEW's, the new node gets $NEW's mode;
#   3. $BROKEN (its init fails): rolled back to $NEW, with $NEW's rule and mode again;
#   4. SIGKILL after $OLD loaded with a failing validation: the file is $OLD's; the restarted
#      agent's validation fails, $NEW is loaded back and so is its rule;
#   5. $OLD cached by an older ttdp (no rule in its record): the file is left as it is.
# Ends with a libtest-style summary line. Arguments are not used.
set -u

AGENT=/opt/ttdp/bin/ttdp-agent
WORK=/run/udev-scenario
REPORT=$WORK/report.json
CACHE=/var/cache/tt-kmd
RELEASE=$TTDP_VM_KERNEL_RELEASE
RULE_FILE=/etc/udev/rules.d/50-tenstorrent.rules
NODE=/dev/tenstorrent/0
set -- $TTDP_VM_KO_VERSIONS
OLD=$1
NEW=$2
BROKEN=$TTDP_VM_KO_BROKEN_VERSION
STEP_LIMIT=60
FAILING='["sh","-c","echo no chips answered; exit 3"]'

SCENARIO=udev
. /scenario-lib.sh
standalone_agent_env

dump() {
  dump_agent "$1"
  echo "---- $1: module $(loaded_version), $NODE mode $(node_mode), $RULE_FILE:"
  cat "$RULE_FILE" 2>/dev/null
  echo "---- $1: udevd log (tail):"
  tail -n 15 "$WORK/udevd.log" 2>/dev/null
}

start_agent() {
  AGENT_LOG=$WORK/agent-$1.log
  version=$2
  shift 2
  rm -f "$REPORT"
  env TT_KMD_VERSION="$version" "$@" "$AGENT" run >"$AGENT_LOG" 2>&1 &
  AGENT_PID=$!
  echo "udev: run $AGENT_LOG (pid $AGENT_PID): target $version $*"
}

# shipped VERSION: the rule the stub's tag ships
shipped() { git --git-dir="$TTDP_VM_STUB_REPO" show "ttkmd-$1:udev-50-tenstorrent.rules"; }
# mode_of VERSION: the MODE its rule gives, without the leading 0 (as stat prints it)
mode_of() { shipped "$1" | sed -n 's/.*MODE="0*\([0-7]*\)".*/\1/p'; }
node_mode() { stat -c %a "$NODE" 2>/dev/null; }
node_mode_is() { [ "$(node_mode)" = "$(mode_of "$1")" ]; }

# seed_with_rule VERSION: seed VERSION with a record carrying its tag's rule
seed_with_rule() {
  seed "$1" || return 1
  record=$CACHE/$RELEASE/$1/tenstorrent.ko.json
  rule=$(shipped "$1" | sed 's/\\/\\\\/g; s/"/\\"/g') || return 1
  [ -n "$rule" ] || return 1
  sed -i '$d' "$record" && sed -i '$s/$/,/' "$record" || return 1
  printf '  "udevRule": {"rule": "%s\\n"}\n}\n' "$rule" >>"$record"
}

# rule_is VERSION: the rule file is ttdp's header for VERSION, then the tag's rule as shipped
rule_is() {
  [ "$(head -n 1 "$RULE_FILE")" = "# installed by ttdp for tt-kmd $1; replaced or removed on every driver change" ] &&
    [ "$(tail -n +2 "$RULE_FILE")" = "$(shipped "$1")" ]
}
ready_for() { loaded_is "$1" && report_has '"phase": "Ready"' && report_has "\"loadedVersion\": \"$1\""; }
settled_on() { ready_for "$1" && node_mode_is "$1"; }
dead() { ! kill -0 "$AGENT_PID" 2>/dev/null; }

# udevadm_accepts VERSION: `udevadm test` on the stub's device reads the rule file and applies
# its MODE, with no complaint about the file
udevadm_accepts() {
  udevadm test "/sys/class/tenstorrent/tenstorrent!0" >"$WORK/udevadm-test.log" 2>&1
  grep -q "50-tenstorrent.rules:2 MODE 0*$(mode_of "$1")" "$WORK/udevadm-test.log" &&
    ! grep -i "50-tenstorrent.rules" "$WORK/udevadm-test.log" | grep -q -i "invalid\|error\|failed"
}

mkdir -p "$WORK" /etc/udev/rules.d
echo "udev: kernel $RELEASE, versions $OLD, $NEW and $BROKEN; $(udevadm --version 2>&1 | head -n 1)"

# --- udevd ---------------------------------------------------------------------------------------
# systemd-udevd is udevadm under that name (Debian's symlink to it is absolute, so it would lead to
# busybox's /bin here)
ln -sf /usr/bin/udevadm "$WORK/systemd-udevd"
require udevadm_is_on_the_path command -v udevadm
"$WORK/systemd-udevd" --daemon --resolve-names=never >"$WORK/udevd.log" 2>&1
require udevd_runs wait_until 20 test -S /run/udev/control
require every_version_is_seeded_with_its_rule eval \
  'seed_with_rule $OLD && seed_with_rule $NEW && seed_with_rule $BROKEN'
check each_versions_rule_gives_its_own_mode eval \
  '[ "$(mode_of $OLD)" != "$(mode_of $NEW)" ] && [ -n "$(mode_of $OLD)" ] && [ "$(mode_of $OLD)" != 666 ]'

# --- 1. install ----------------------------------------------------------------------------------
start_agent 1-install "$OLD"
require the_first_install_is_ready wait_until "$STEP_LIMIT" ready_for "$OLD"
check the_rule_file_is_the_versions rule_is "$OLD"
check the_rule_file_is_world_readable eval '[ "$(stat -c %a $RULE_FILE)" = 644 ]'
check udevadm_test_reads_the_rule_and_applies_its_mode udevadm_accepts "$OLD"
check the_device_node_gets_the_rules_mode wait_until 10 node_mode_is "$OLD"
check udev_made_the_rules_symlink wait_until 10 test -L /dev/tenstorrent-0
check the_report_shows_the_rule report_has \
  "\"udevRule\": \"$RULE_FILE (tt-kmd $OLD)\""
stop_agent

# --- 2. upgrade ----------------------------------------------------------------------------------
start_agent 2-upgrade "$NEW"
require the_upgrade_is_ready wait_until "$STEP_LIMIT" ready_for "$NEW"
check the_upgrade_replaces_the_rule rule_is "$NEW"
check the_new_node_gets_the_new_mode wait_until 10 node_mode_is "$NEW"
check the_report_shows_the_new_rule report_has "\"udevRule\": \"$RULE_FILE (tt-kmd $NEW)\""
stop_agent

# --- 3. a failed load brings the old rule back -----------------------------------------------------
start_agent 3-broken "$BROKEN"
require the_broken_version_is_rolled_back wait_until "$STEP_LIMIT" eval \
  'loaded_is $NEW && report_has "\"reason\": \"LoadFailedRolledBack\""'
check the_rolled_back_node_has_the_previous_rule rule_is "$NEW"
check the_rolled_back_node_has_the_previous_mode wait_until 10 node_mode_is "$NEW"
stop_agent

# --- 4. killed after the load, the restart rolls back with the rule ---------------------------------
start_agent 4-killed "$OLD" TTDP_TEST_KILL_AT=after-load TTDP_VALIDATE_DEVICES=true \
  TTDP_VALIDATION_COMMAND="$FAILING"
require the_agent_is_killed_after_the_load wait_until "$STEP_LIMIT" dead
wait "$AGENT_PID"
AGENT_PID=
check the_target_was_loaded_with_its_rule eval 'loaded_is $OLD && rule_is $OLD'
start_agent 4-restarted "$OLD" TTDP_VALIDATE_DEVICES=true TTDP_VALIDATION_COMMAND="$FAILING"
check the_restart_loads_the_previous_version_back wait_until "$STEP_LIMIT" eval \
  'loaded_is $NEW && report_has "\"reason\": \"SwapResumedRolledBack\""'
check the_previous_rule_is_back rule_is "$NEW"
check the_previous_mode_is_back wait_until 10 node_mode_is "$NEW"
stop_agent

# --- 5. a version whose rule is unknown leaves the file -------------------------------------------
require the_old_version_is_seeded_without_a_rule seed "$OLD"
start_agent 5-unknown "$OLD"
require the_version_without_a_known_rule_is_ready wait_until "$STEP_LIMIT" ready_for "$OLD"
check the_file_is_left_as_it_was rule_is "$NEW"
check the_node_gets_the_mode_of_the_rule_in_place wait_until 10 node_mode_is "$NEW"
stop_agent

finish
