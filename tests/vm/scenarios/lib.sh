# Shared by the scenario scripts, sourced from /scenario-lib.sh: libtest-style checks and the
# summary line the host parses, waiting, and probes of the module and of the agent's report.
# A script sets SCENARIO (the test name prefix) before sourcing it, and may define dump() to
# print what explains a failed check. Busybox sh: POSIX only.

passed=0
failed=0
started=$(date +%s)
AGENT_PID=
AGENT_LOG=

# Called when a check fails, with its name; scripts that can say more redefine it.
dump() { :; }

# dump_agent NAME: the end of the current agent run's log and its report (what a script's dump()
# prints first).
dump_agent() {
  echo "---- $1: last lines of $AGENT_LOG ----"
  [ -n "$AGENT_LOG" ] && tail -n 25 "$AGENT_LOG"
  echo "---- $1: $REPORT ----"
  cat "$REPORT" 2>/dev/null
}

# The environment of an agent on this VM's real kernel that reports to the file $REPORT (no
# cluster, so no grant is needed), has no repository to fetch from, and tries once a minute.
standalone_agent_env() {
  export TTDP_HOST_ROOT=/ TTDP_KERNEL=real NODE_NAME=vm-node TTDP_TT_SMI_PATH=none
  export TT_KMD_REPOSITORY=/nonexistent TTDP_REPORT="file:$REPORT" TTDP_LOG_FORMAT=json
  export TTDP_PROBE_PERIOD=1s TTDP_RETRY_INITIAL=60s TTDP_RETRY_MAX=60s TTDP_VALIDATE_DEVICES=false
}

# Prints the summary line, kills a running agent, exits with the result.
finish() {
  [ -n "$AGENT_PID" ] && kill -KILL "$AGENT_PID" 2>/dev/null
  result=ok
  [ "$failed" -eq 0 ] || result=FAILED
  echo
  echo "test result: $result. $passed passed; $failed failed; 0 ignored; 0 measured; 0 filtered out; finished in $(($(date +%s) - started))s"
  [ "$failed" -eq 0 ]
  exit
}

# check NAME COMMAND...: one test, passed when COMMAND succeeds.
check() {
  name=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
    echo "test $SCENARIO::$name ... ok"
  else
    failed=$((failed + 1))
    echo "test $SCENARIO::$name ... FAILED"
    echo "  failed: $*"
    dump "$name"
  fi
}

# require NAME COMMAND...: a check the rest depends on; ends the scenario when it fails.
require() {
  before=$failed
  check "$@"
  [ "$failed" -eq "$before" ] || finish
}

# wait_until SECONDS COMMAND...: polls COMMAND every half second until it succeeds or time is up.
wait_until() {
  end=$(($(date +%s) + $1))
  shift
  until "$@"; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.5
  done
}

loaded_version() { cat /sys/module/tenstorrent/version 2>/dev/null; }
loaded_is() { [ "$(loaded_version)" = "$1" ] && [ "$(cat /sys/module/tenstorrent/initstate)" = live ]; }
# The report file is serde_json's pretty print: one `"key": value` per line.
report_has() { grep -q -F -- "$1" "$REPORT" 2>/dev/null; }

# Stops the agent started last as its pod would be stopped (SIGTERM) and waits for it.
stop_agent() {
  kill -TERM "$AGENT_PID"
  wait "$AGENT_PID"
  AGENT_PID=
}

# seed VERSION: puts the host-built stub .ko into the agent's cache ($CACHE/$RELEASE) with a
# record made by hand, so the guest needs no build.
seed() {
  dir=$CACHE/$RELEASE/$1
  mkdir -p "$dir" && cp "$TTDP_VM_KO_DIR/$1/tenstorrent.ko" "$dir/tenstorrent.ko" || return 1
  sha=$(sha256sum "$dir/tenstorrent.ko" | cut -d' ' -f1)
  srcversion=$(grep -a -o 'srcversion=[0-9A-F]*' "$dir/tenstorrent.ko" | head -n1 | cut -d= -f2)
  vermagic=$(grep -a -o 'vermagic=[^[:cntrl:]]*' "$dir/tenstorrent.ko" | head -n1 | cut -d= -f2-)
  cat >"$dir/tenstorrent.ko.json" <<JSON
{
  "version": "$1",
  "kernelRelease": "$RELEASE",
  "sha256": "$sha",
  "vermagic": "$vermagic",
  "srcversion": "$srcversion",
  "sourceRepository": "$TTDP_VM_STUB_REPO",
  "sourceCommit": "0000000000000000000000000000000000000000",
  "builtAt": "2025-01-01T00:00:00Z"
}
JSON
}
