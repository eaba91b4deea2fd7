#!/bin/sh
# Scenario "agent-timing" (not a test; `cargo xtask bench` boots it): the real ttdp-agent's start
# to Ready for a cache hit that replaces a loaded version, on this real kernel with the host-built
# stub modules and every safety step on (cache verification, rollback .ko, module lock, device
# validation), next to the floor measured in the same boot: `rmmod` + `insmod` of the same .ko
# files. RUNS runs of each (the argument after `--`, default 5). Prints each run's steps, taken
# from the agent's own log timestamps from its start as exec_stamped stamps it (right before the
# agent's execve), then the medians as one BENCH-RESULT line.
set -u

AGENT=/opt/ttdp/bin/ttdp-agent
WORK=/run/agent-timing
REPORT=$WORK/report.json
CACHE=/var/cache/tt-kmd
RELEASE=$TTDP_VM_KERNEL_RELEASE
set -- $TTDP_VM_KO_VERSIONS "$@"
OLD=$1
NEW=$2
RUNS=${3:-5}

SCENARIO=agent-timing
. /scenario-lib.sh

mkdir -p "$WORK"
export TTDP_HOST_ROOT=/ TTDP_KERNEL=real NODE_NAME=vm-node TTDP_TT_SMI_PATH=none
export TT_KMD_REPOSITORY=/nonexistent TTDP_REPORT="file:$REPORT" TTDP_LOG_FORMAT=json
export TTDP_PROBE_PERIOD=10s TTDP_RETRY_INITIAL=60s TTDP_RETRY_MAX=60s
export RUST_LOG=debug,kube=info,hyper=info,tower=info

# Microseconds since the epoch (busybox date has no %N; adjtimex shows tv_usec).
now_us() { adjtimex | awk '/tv_sec/ { s = $2 } /tv_usec/ { u = $2 } END { printf "%d%06d\n", s, u }'; }

ko() { echo "$CACHE/$RELEASE/$1/tenstorrent.ko"; }

# load VERSION: exactly VERSION loaded, from the cache, untimed.
load() {
  rmmod tenstorrent 2>/dev/null
  insmod "$(ko "$1")" && loaded_is "$1"
}

seed "$OLD" && seed "$NEW" || { echo "cannot seed the cache"; exit 1; }

# The cost of taking two timestamps, subtracted from nothing: shown beside the floor.
a=$(now_us)
b=$(now_us)
stamp_us=$((b - a))

floor=""
for run in $(seq "$RUNS"); do
  load "$OLD" || { echo "cannot load $OLD"; exit 1; }
  a=$(now_us)
  rmmod tenstorrent && insmod "$(ko "$NEW")"
  b=$(now_us)
  loaded_is "$NEW" || { echo "floor run $run did not load $NEW"; exit 1; }
  floor="$floor $(((b - a) / 1000))"
  echo "floor run $run: rmmod $OLD + insmod $NEW $(((b - a) / 1000)) ms (two timestamps cost $((stamp_us / 1000)) ms)"
done

# steps LOG START_US: one line of ms figures from the agent's JSON log lines (timestamps are
# UTC RFC 3339 with microseconds; the run never crosses midnight, START_US is taken modulo a day).
steps() {
  awk -v start="$2" '
    function us(line,   t, parts) {
      if (!match(line, /"timestamp":"[^"]*"/)) return -1
      t = substr(line, RSTART + 13, RLENGTH - 14)
      split(substr(t, 12), parts, /[:Z]/)
      return ((parts[1] * 60 + parts[2]) * 60 + parts[3]) * 1000000
    }
    function field(line, name,   re) {
      re = "\"" name "\":[0-9]+"
      if (!match(line, re)) return ""
      return substr(line, RSTART + length(name) + 3, RLENGTH - length(name) - 3)
    }
    BEGIN { day = 86400 * 1000000; start = start % day }
    {
      t = us($0); if (t < 0) next
      if (t < start) t += day
      ms = (t - start) / 1000
      if (!first) { first = ms }
      if (index($0, "\"agent started\"")) started = ms
      if (index($0, "\"observed the host\"") && !observed) observed = ms
      if (index($0, "\"module file ready\"")) { ensured = ms; ensure_ms = field($0, "elapsed_ms") }
      if (index($0, "\"rollback module file ready\"")) rollback = ms
      if (index($0, "\"module swapped\"")) {
        swapped = ms; swap_total = field($0, "total_ms"); swap_build = field($0, "build_ms")
        swap_unload = field($0, "unload_ms"); swap_load = field($0, "load_ms")
        swap_validate = field($0, "validate_ms"); swap_probe = field($0, "probe_ms")
      }
      if (index($0, "\"node is ready\"") && !ready) ready = ms
    }
    END {
      printf "start_to_ready=%.1f exec_to_started=%.1f started_to_observed=%.1f observed_to_ensured=%.1f ensure_ko=%s ensured_to_rollback=%.1f rollback_to_swapped=%.1f swap_total=%s swap_probe=%s swap_cache_checks=%s swap_unload=%s swap_load=%s swap_validate=%s swapped_to_ready=%.1f\n",
        ready, started, observed - started, ensured - observed, ensure_ms, rollback - ensured,
        swapped - rollback, swap_total, swap_probe, swap_build, swap_unload, swap_load,
        swap_validate, ready - swapped
    }' "$1"
}

# Starting the binary alone (exec, argument parsing, exit): what `ttdp-agent --version` takes.
version=""
for run in $(seq "$RUNS"); do
  a=$(now_us)
  "$AGENT" --version >/dev/null
  b=$(now_us)
  version="$version $(((b - a) / 1000))"
done
echo "ttdp-agent --version: $version ms (two timestamps cost $((stamp_us / 1000)) ms)"

results=""
for run in $(seq "$RUNS"); do
  load "$OLD" || { echo "cannot load $OLD"; exit 1; }
  rm -f "$REPORT"
  AGENT_LOG=$WORK/agent-$run.log
  # the start is stamped by exec_stamped right before the agent's execve (same process)
  env TT_KMD_VERSION="$NEW" /opt/ttdp/bin/exec_stamped "$WORK/start-$run" "$AGENT" run >"$AGENT_LOG" 2>&1 &
  AGENT_PID=$!
  if ! wait_until 60 grep -q '"node is ready"' "$AGENT_LOG"; then
    echo "run $run: the agent did not get Ready"
    dump_agent "run $run"
    finish
  fi
  stop_agent
  loaded_is "$NEW" || { echo "run $run: $NEW is not loaded"; exit 1; }
  start=$(cat "$WORK/start-$run")
  line=$(steps "$AGENT_LOG" "$start")
  echo "agent run $run: $line"
  results="$results
$line"
done
# The last run's log, for the steps between the ones above (`elapsed_ms` fields).
echo "---- the log of agent run $RUNS ----"
cat "$WORK/agent-$RUNS.log"

# The median of each key=value over the runs, and of the floor, as JSON.
median_json() {
  printf '%s\n' "$results" | awk -v floor="$floor" -v version="$version" -v stamp="$stamp_us" -v runs="$RUNS" \
    -v release="$RELEASE" -v old="$OLD" -v new="$NEW" '
    function median(list,   v, n, i, j, t) {
      n = split(list, v, " ")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
      if (n == 0) return 0
      return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    function csv(list,   v, n, i, out) {
      n = split(list, v, " ")
      for (i = 1; i <= n; i++) out = out (i > 1 ? "," : "") v[i]
      return out
    }
    NF {
      for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        if (!(kv[1] in values)) order[++keys] = kv[1]
        values[kv[1]] = values[kv[1]] " " (kv[2] == "" ? 0 : kv[2])
      }
    }
    END {
      printf "{\"suite\":\"agent-vm\",\"release\":\"%s\",\"runs\":%d,\"from\":\"%s\",\"to\":\"%s\"", release, runs, old, new
      printf ",\"floor_ms\":%s,\"floor_runs_ms\":[%s],\"timestamp_cost_ms\":%.1f", median(floor), csv(floor), stamp / 1000
      printf ",\"exec_version_ms\":%s", median(version)
      for (k = 1; k <= keys; k++) printf ",\"%s_ms\":%s", order[k], median(values[order[k]])
      printf ",\"start_to_ready_runs_ms\":[%s]}\n", csv(values["start_to_ready"])
    }'
}
echo "BENCH-RESULT $(median_json)"
